"""The GPU paths of the student's trainer, simulated on a CPU (student side of notebook 05's checks).

Rank 0 of a checked job calls the student's code once more as the worker ``RANK=3``,
``LOCAL_RANK=1`` of ``WORLD_SIZE=4`` on a machine with two GPUs, without joining a group and
without a GPU: ``torch.cuda`` says it has two devices, ``init_process_group``,
``torch.cuda.set_device``, ``DistributedDataParallel`` and ``torch.load`` are replaced by
recorders (also where the student's file imported them by name), and the model's ``to`` /
``cuda`` only record where they were asked to go. What was recorded is returned as plain data
for the judge (:mod:`.checks`, :mod:`.checks_snapshots`):

* :func:`simulate_setup`: ``ddp_setup(config)`` with CUDA and without (backend, timeout,
  ``set_device``, what it returned);
* :func:`simulate_init`: ``Trainer(...)`` on ``cuda:1`` (where the model was moved, DDP's
  ``device_ids``);
* :func:`simulate_load`: ``Trainer.load_snapshot`` on ``cuda:1`` (``torch.load``'s
  ``map_location``; which entry of a 4-worker snapshot's "rng" worker 3 restores).

Used in 05_ddp_torchrun_fault_tolerance.
"""
import contextlib
import dataclasses
import inspect
import os
from types import SimpleNamespace

FAKE_ENV = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1"}         # worker 3 of 4, the second on the second node
FAKE_RANK, FAKE_LOCAL, FAKE_WORLD = 3, 1, 4


@contextlib.contextmanager
def _faked(student, fakes, cuda):
    """Replace ``{(module, name): value}`` (and the student's names bound to the originals) and
    the worker's environment for the block; ``cuda``: whether ``torch.cuda`` has 2 devices."""
    import torch
    import torch.distributed as dist
    fakes = {(torch.cuda, "is_available"): lambda: cuda,
             (torch.cuda, "device_count"): lambda: 2 if cuda else 0,
             (torch.cuda, "current_device"): lambda: FAKE_LOCAL,
             (dist, "is_initialized"): lambda: True,
             (dist, "get_rank"): lambda *a, **k: FAKE_RANK,
             (dist, "get_world_size"): lambda *a, **k: FAKE_WORLD,
             (dist, "barrier"): lambda *a, **k: None, **fakes}
    saved_env = {k: os.environ.get(k) for k in FAKE_ENV}
    saved = {key: getattr(*key) for key in fakes}
    names = {k: v for k, v in vars(student).items()
             if any(v is old for old in saved.values())}      # from torch.distributed import ...
    try:
        os.environ.update(FAKE_ENV)
        for (module, name), value in fakes.items():
            setattr(module, name, value)
        for k, v in names.items():
            setattr(student, k, next(fakes[key] for key in fakes if saved[key] is v))
        yield
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


def simulate_setup(student, config, cuda):
    """Call ``student.ddp_setup(config)`` as the worker of :data:`FAKE_ENV`, on a machine with
    (``cuda=True``) or without CUDA, without joining a process group.

    Returns:
        dict: "init" (the ``init_process_group`` calls: backend, timeout in seconds or None),
        "set_device" (the arguments of ``torch.cuda.set_device``, as strings), "returned"
        (what ``ddp_setup`` returned, device as a string), or "error" (what it raised).
    """
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
    fakes = {(torch.cuda, "set_device"): lambda d: calls["set_device"].append(str(d)),
             (dist, "init_process_group"): init,
             (dist, "is_initialized"): lambda: bool(calls["init"])}
    with _faked(student, fakes, cuda):
        try:
            result = student.ddp_setup(config)
        except Exception as exc:  # noqa: BLE001 - reported by the checker
            return {"error": f"{type(exc).__name__}: {exc}"}
    if not (isinstance(result, tuple) and len(result) == 4):
        return {**calls, "returned": repr(result)}
    rank, local_rank, world_size, device = result
    return {**calls, "returned": [_int(rank), _int(local_rank), _int(world_size), str(device)]}


def _int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return repr(value)


def simulate_init(student, config):
    """Build ``student.Trainer`` as the worker of :data:`FAKE_ENV` on ``cuda:1`` (simulated: the
    model stays on the CPU, DDP is a recorder), with no snapshot file.

    Returns:
        dict: "moved" (the devices the model was sent to, as strings), "ddp" (each DDP call:
        ``device_ids`` as strings, or None), "sampler" (``num_replicas`` and ``rank`` of
        ``trainer.sampler``), or "error" (what it raised).
    """
    import torch
    import torch.nn.parallel as parallel
    from torch.nn.parallel import distributed
    from . import runner
    model = runner.make_model(config.model, config.dtype)
    calls = {"moved": [], "ddp": []}

    def moved(to):
        def record(*args, **kwargs):
            where = kwargs.get("device", args[0] if args else None)
            calls["moved"].append("cuda" if to == "cuda" and where is None else
                                  (f"cuda:{where}" if to == "cuda" and isinstance(where, int)
                                   else str(where)))
            return model
        return record
    model.to, model.cuda = moved("to"), moved("cuda")

    class RecordingDDP(torch.nn.Module):
        def __init__(self, module, device_ids=None, *args, **kwargs):
            super().__init__()
            self.module = module
            calls["ddp"].append(None if device_ids is None else [str(d) for d in device_ids])
    fakes = {(parallel, "DistributedDataParallel"): RecordingDDP,
             (distributed, "DistributedDataParallel"): RecordingDDP,
             (torch.cuda, "set_device"): lambda d: None}
    sim = dataclasses.replace(config, snapshot=config.snapshot + ".simulated-absent")
    optimizer, scheduler = runner.make_optimizer(model, config)
    train_set = torch.utils.data.TensorDataset(torch.zeros(8, 1, 28, 28), torch.zeros(8).long())
    with _faked(student, fakes, cuda=True):
        try:
            trainer = student.Trainer(model, train_set, optimizer, scheduler, sim, FAKE_RANK,
                                      FAKE_LOCAL, FAKE_WORLD, torch.device("cuda", FAKE_LOCAL))
        except Exception as exc:  # noqa: BLE001 - the simulation's limits, or the code's
            return {**calls, "error": f"{type(exc).__name__}: {exc}"}
    sampler = getattr(trainer, "sampler", None)
    calls["sampler"] = [_int(getattr(sampler, "num_replicas", None)),
                        _int(getattr(sampler, "rank", None))]
    return calls


def location(where):
    """``torch.load``'s ``map_location`` as a string: a device or its name as it is, a dict as
    the devices it maps to (``{"cuda:0": "cuda:1"}``: "cuda:1")."""
    if isinstance(where, dict):
        return ",".join(sorted({str(v) for v in where.values()}))
    return str(where)


class _Sink:
    """Stands for the model, its module, the optimizer and the scheduler of the simulated
    trainer: every method call (``load_state_dict``, ...) is accepted and does nothing."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def _rng_entries(count):
    """``count`` random states as ``runner.rng_state()`` returns them, entry i told apart by
    its torch state (a generator seeded with 7919 + i)."""
    import random

    import numpy as np
    import torch
    return [{"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.Generator().manual_seed(7919 + i).get_state()}
            for i in range(count)]


def simulate_load(student, config):
    """Call ``student.Trainer.load_snapshot`` on a trainer of the worker of :data:`FAKE_ENV`
    whose device is ``cuda:1`` (simulated). Its ``torch.load`` of ``config.snapshot`` is
    recorded and returns a made-up snapshot of a job of 4 workers, whose "rng" holds 4 random
    states told apart; the model, optimizer and scheduler accept any state, and
    ``runner.set_rng_state`` records which entry it was given (a state restored by hand, e.g.
    ``torch.set_rng_state``, is recognised by the torch generator's state). This process's
    random states are put back afterwards.

    Returns:
        dict: "map_location" (as a string; a dict's values joined), "rng_entry" (the index
        of the entry restored, None if none was), and "error" where it raised.
    """
    import torch
    from . import runner
    found, entries = {}, _rng_entries(FAKE_WORLD)
    snapshot = {"model": {}, "optimizer": {}, "scheduler": {}, "epochs_run": 1, "step": 8,
                "rng": entries}
    restored = []

    def load(f, *args, **kwargs):
        found["map_location"] = location(kwargs.get("map_location", args[0] if args else None))
        return snapshot

    def set_rng_state(state):
        restored.append(next((i for i, e in enumerate(entries) if state is e), None))
        if restored[-1] is None and isinstance(state, dict):       # a copy of an entry?
            restored[-1] = next((i for i, e in enumerate(entries)
                                 if torch.is_tensor(state.get("torch"))
                                 and torch.equal(state["torch"].cpu(), e["torch"])), None)
    trainer = object.__new__(student.Trainer)
    model = _Sink()
    model.module = _Sink()
    vars(trainer).update(config=config, rank=FAKE_RANK, local_rank=FAKE_LOCAL,
                         world_size=FAKE_WORLD, device=torch.device("cuda", FAKE_LOCAL),
                         model=model, optimizer=_Sink(), scheduler=_Sink(), epochs_run=0,
                         step=0)
    saved = runner.rng_state()
    try:
        with _faked(student, {(torch, "load"): load,
                              (runner, "set_rng_state"): set_rng_state}, cuda=True):
            try:
                student.Trainer.load_snapshot(trainer)
            except Exception as exc:  # noqa: BLE001 - reported by the checker
                found["error"] = f"{type(exc).__name__}: {exc}"
        if not restored:         # restored by hand? the torch generator tells which entry
            now = torch.get_rng_state()
            restored = [i for i, e in enumerate(entries) if torch.equal(now, e["torch"])]
    finally:
        runner.set_rng_state(saved)
    if "map_location" not in found:
        return {"error": found.get("error", "load_snapshot returned without calling "
                                            "torch.load")}
    return {**found, "rng_entry": restored[-1] if restored else None}
