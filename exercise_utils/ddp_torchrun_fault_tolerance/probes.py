"""The worker side of notebook 05's checks: what every torchrun worker of a checked job runs.

The checks (:mod:`.checks`) start ``work/05_trainer.py`` under torchrun through this module's
entry point::

    python -m torch.distributed.run --nproc-per-node 2 \
        -m exercise_utils.ddp_torchrun_fault_tolerance.probes \
        --student work/05_trainer.py --records DIR [trainer options ...]

Each worker imports the student file, records what it does (the sampler's epoch, seed and
shard whenever an epoch's iteration starts, every ``torch.save`` / ``torch.load`` and on which
rank) into ``DIR/rank{R}_attempt{A}.json``, then runs :func:`.runner.main` exactly as the
student's own launch does. Before that, rank 0 of the first attempt calls the student's
``ddp_setup`` twice more as worker 3 of 4 on a node of 2 (:func:`simulate_setup`: once with
CUDA, once without; no process group is joined: ``init_process_group`` and
``torch.cuda.set_device`` are recorded, not run), so that the GPU path is checked on a CPU.

Used in 05_ddp_torchrun_fault_tolerance.
"""
import json
import os
import sys
from pathlib import Path


def _record_path(folder):
    rank, attempt = os.environ.get("RANK", "0"), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return Path(folder) / f"rank{rank}_attempt{attempt}.json"


def beat_folder(records):
    """Where the workers of a checked job beat (:mod:`exercise_utils.heartbeat`)."""
    return Path(f"{records}.beats")


FAKE_ENV = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1"}         # worker 3 of 4, the second on the second node


def simulate_setup(student, config, cuda):
    """Call ``student.ddp_setup(config)`` as the worker of :data:`FAKE_ENV`, on a machine with
    (``cuda=True``) or without CUDA, without joining a process group.

    Returns:
        dict: "init" (the ``init_process_group`` calls: backend, timeout in seconds or None),
        "set_device" (the arguments of ``torch.cuda.set_device``, as strings), "returned"
        (what ``ddp_setup`` returned, device as a string), or "error" (what it raised).
    """
    import inspect
    import torch
    import torch.distributed as dist
    real_init = dist.init_process_group
    calls = {"init": [], "set_device": []}

    def init(*args, **kwargs):
        bound = inspect.signature(real_init).bind_partial(*args, **kwargs).arguments
        timeout = bound.get("timeout")
        calls["init"].append({"backend": None if bound.get("backend") is None
                              else str(bound["backend"]).lower(),
                              "timeout": getattr(timeout, "total_seconds", lambda: None)()})
    fake = {(torch.cuda, "is_available"): lambda: cuda,
            (torch.cuda, "device_count"): lambda: 2 if cuda else 0,
            (torch.cuda, "set_device"): lambda d: calls["set_device"].append(str(d)),
            (dist, "init_process_group"): init,
            (dist, "is_initialized"): lambda: bool(calls["init"]),
            (dist, "get_rank"): lambda *a, **k: int(FAKE_ENV["RANK"]),
            (dist, "get_world_size"): lambda *a, **k: int(FAKE_ENV["WORLD_SIZE"]),
            (dist, "barrier"): lambda *a, **k: None}
    saved_env = {k: os.environ.get(k) for k in FAKE_ENV}
    saved = {key: getattr(*key) for key in fake}
    names = {k: v for k, v in vars(student).items()
             if any(v is old for old in saved.values())}      # from torch.distributed import ...
    try:
        os.environ.update(FAKE_ENV)
        for (module, name), value in fake.items():
            setattr(module, name, value)
        for k, v in names.items():
            setattr(student, k, next(fake[key] for key in fake if saved[key] is v))
        try:
            result = student.ddp_setup(config)
        except Exception as exc:  # noqa: BLE001 - reported by the checker
            return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)
        for k, v in names.items():
            setattr(student, k, v)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if not (isinstance(result, tuple) and len(result) == 4):
        return {**calls, "returned": repr(result)}
    rank, local_rank, world_size, device = result
    return {**calls, "returned": [_int(rank), _int(local_rank), _int(world_size), str(device)]}


def _int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return repr(value)


def _install_recorders(student, log, flush=lambda: None):
    """Record set_epoch / iteration epochs of DistributedSampler, torch.save and torch.load
    (to a path or to an open file on disk)."""
    import torch
    from .runner import file_on_disk
    from torch.utils.data import DistributedSampler
    set_epoch, iterate = DistributedSampler.set_epoch, DistributedSampler.__iter__
    save, load = torch.save, torch.load

    def recorded_set_epoch(self, epoch):
        log["set_epoch"].append(int(epoch))
        return set_epoch(self, epoch)

    def recorded_iter(self):
        log["iterated"].append(int(self.epoch))
        log["samplers"].append({"seed": int(self.seed), "shuffle": bool(self.shuffle),
                                "num_replicas": int(self.num_replicas), "rank": int(self.rank)})
        return iterate(self)

    def recorded_save(obj, f, *args, **kwargs):
        name = file_on_disk(f)                          # None: in-memory saves of tensors
        if name is not None:
            log["saves"].append(name)
            flush()        # on disk now: a rank killed later (racing writers) still reports it
        return save(obj, f, *args, **kwargs)

    def recorded_load(f, *args, **kwargs):
        name = file_on_disk(f)                          # None: in-memory loads of tensors
        if name is not None:
            where = kwargs.get("map_location", args[0] if args else None)
            log["loads"].append({"path": name, "map_location": str(where)})
        return load(f, *args, **kwargs)
    DistributedSampler.set_epoch, DistributedSampler.__iter__ = recorded_set_epoch, recorded_iter
    torch.save, torch.load = recorded_save, recorded_load
    for key, value in list(vars(student).items()):      # names imported from torch
        if value is save:
            setattr(student, key, recorded_save)
        elif value is load:
            setattr(student, key, recorded_load)


def worker_main(argv=None):
    """Entry point of every checked worker: record, then run the student's trainer."""
    from .. import heartbeat
    from ..rankworker import load_student
    from . import runner
    argv = list(sys.argv[1:] if argv is None else argv)
    student_path, record_dir = argv[1], argv[3]          # --student PATH --records DIR ...
    phase = heartbeat.start(beat_folder(record_dir), os.environ.get("RANK", "0"), student_path)
    phase("import")
    student = load_student(student_path)
    phase("run")
    log = {"set_epoch": [], "iterated": [], "samplers": [], "saves": [], "loads": []}
    if os.environ.get("RANK") == "0" and runner.attempt() == 0:
        config = runner.parse_args(argv[4:])
        log["setup"] = {"cuda": simulate_setup(student, config, True),
                        "cpu": simulate_setup(student, config, False)}
    _install_recorders(student, log,
                       lambda: _record_path(record_dir).write_text(json.dumps(log)))
    try:
        runner.main(student.ddp_setup, student.Trainer, argv[4:])
    finally:
        _record_path(record_dir).write_text(json.dumps(log))
        phase.stop()


if __name__ == "__main__":
    worker_main()
