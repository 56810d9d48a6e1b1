"""The worker side of notebook 05's checks: what every torchrun worker of a checked job runs.

The checks (:mod:`.checks`) start ``work/05_trainer.py`` under torchrun through this module's
entry point::

    python -m torch.distributed.run --nproc-per-node 2 \
        -m exercise_utils.ddp_torchrun_fault_tolerance.probes \
        --student work/05_trainer.py --records DIR [trainer options ...]

Each worker imports the student file, records what it does (``set_epoch`` before each epoch's
iteration, every ``torch.save`` / ``torch.load`` and on which rank) into
``DIR/rank{R}_attempt{A}.json``, then runs :func:`.runner.main` exactly as the student's own
launch does.

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
    log = {"set_epoch": [], "iterated": [], "saves": [], "loads": []}
    _install_recorders(student, log,
                       lambda: _record_path(record_dir).write_text(json.dumps(log)))
    try:
        runner.main(student.ddp_setup, student.Trainer, argv[4:])
    finally:
        _record_path(record_dir).write_text(json.dumps(log))


if __name__ == "__main__":
    worker_main()
