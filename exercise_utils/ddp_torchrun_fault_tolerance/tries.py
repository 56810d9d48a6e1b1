"""Notebook 05's try cell (issue 39): part 1 of ``work/05_trainer.py``, ``ddp_setup`` and the
``Trainer``'s construction, run as soon as it is written, on 2 processes started as torchrun
starts its workers (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``), on 64 synthetic examples
(:mod:`exercise_utils.tries`). Not a check: nothing is judged here (the CHECK cells do that);
part 2, the snapshots and the epochs, is tried by the checks and the runs of section 3.

    from exercise_utils.ddp_torchrun_fault_tolerance import tries
    tries.run("setup")

Used in 05_ddp_torchrun_fault_tolerance.
"""
import gc
import os
import tempfile

import torch.distributed as dist

from .. import tries as core
from . import runner

WORK = "work/05_trainer.py"
EXAMPLES = 64


def run(part="setup", work=WORK):
    """Run the try of ``part`` (``"setup"``) with the file ``work`` on 2 processes; print what
    each built."""
    core.run(TRIES, part, work)


def try_setup(mine, ctx):
    """ddp_setup, then a Trainer for a small MLP on synthetic data (no snapshot file)."""
    os.environ.setdefault("LOCAL_RANK", str(ctx.rank))    # (on hosts: set, 0 on each)
    with tempfile.TemporaryDirectory() as tmp:
        config = runner.parse_args(["--data", "synthetic", "--train-size", str(EXAMPLES),
                                    "--model", "mlp", "--snapshot", f"{tmp}/none.pt",
                                    "--timeout-s", "30"])
        got = mine.ddp_setup(config)
        rank, local_rank, world, device = got
        model = runner.make_model(config.model, config.dtype)
        optimizer, scheduler = runner.make_optimizer(model, config)
        trainer = mine.Trainer(model, runner.make_data(config), optimizer, scheduler, config,
                               rank, local_rank, world, device)
        lines = [f"ddp_setup -> {tuple(map(str, got))} (expected ('{ctx.rank}', "
                 f"'{os.environ['LOCAL_RANK']}', '{ctx.size}', 'cpu')); backend "
                 f"{dist.get_backend() if dist.is_initialized() else 'none: no group'}"]
        lines += _trainer_lines(trainer, ctx)
        del trainer, model, optimizer, scheduler
        gc.collect()                         # (DDP holds the group: free it before the end)
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    return lines


def _trainer_lines(trainer, ctx):
    """What the Trainer built: the model's wrapper, the sampler's part, the loader, counters."""
    model, sampler = getattr(trainer, "model", None), getattr(trainer, "sampler", None)
    loader = getattr(trainer, "loader", None)
    part = list(iter(sampler)) if sampler is not None else []
    return [f"model: {type(model).__name__} (expected DistributedDataParallel), device_ids "
            f"{getattr(model, 'device_ids', None)} (expected None on the CPU)",
            f"sampler: {type(sampler).__name__}, {len(part)} of the {EXAMPLES} examples "
            f"(expected {EXAMPLES // ctx.size}: each rank its own part), the first {part[:4]}, "
            f"shuffle {getattr(sampler, 'shuffle', None)}",
            f"loader: batches of {getattr(loader, 'batch_size', None)} (expected 32), "
            f"{len(loader) if loader is not None else 0} per epoch; epochs_run "
            f"{getattr(trainer, 'epochs_run', None)}, step {getattr(trainer, 'step', None)}"]


TRIES = {"setup": core.Try(try_setup, ("ddp_setup", "Trainer.__init__"),
                           "ddp_setup and the Trainer", backend="none")}
