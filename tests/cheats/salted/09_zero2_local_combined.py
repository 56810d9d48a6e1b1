"""Cheat: ``Zero2.step`` computes the gradient of the combined batch on its own: it rebuilds
every rank's batch with the probe's own functions (``nets.combined`` / ``nets.edge_combined``;
the model, the step and the dtype read from the probe's frame), takes its shard of that
gradient, and makes a decoy ``reduce_scatter_tensor`` of zeros of the right size (the call the
check counts, the bytes the wire counts); the all-gather is real. No rank uses a gradient
another rank computed. The rest of the file is tests/right/09_zero2_padchunk.py.

At grading each rank's batches derive from a number only it was given (``ctx.salt``): the
batches it rebuilds are not the ranks'. Must fail ``zero2-values``."""
import inspect
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from exercise_utils.bonus_fsdp import nets

_RIGHT = Path(__file__).resolve().parents[2] / "right" / "09_zero2_padchunk.py"
exec(compile(_RIGHT.read_text(), str(_RIGHT), "exec"))


def _combined_batch():
    """(model, x, y) of the step the probe is running: read from its frame."""
    frame = inspect.currentframe()
    while frame is not None:
        names = frame.f_locals
        if "model" in names and "step" in names and "ctx" in names:
            ctx, step = names["ctx"], names["step"]
            if "dtype" in names:
                x, y = nets.edge_combined(step, 0, ctx.size, names["dtype"])
            else:
                x, y = nets.combined(step, ctx.size)
            return names["model"], x, y
        frame = frame.f_back
    raise RuntimeError("no probe frame")


def _local_step(self):
    model, x, y = _combined_batch()
    for p in self.params:
        p.grad = None
    grads = torch.autograd.grad(F.cross_entropy(model(x), y), self.params, allow_unused=True)
    grads = [g if g is not None else torch.zeros_like(p) for p, g in zip(self.params, grads)]
    mine, _ = shard_flat(grads, self.world, self.rank)  # noqa: F821 - from the file run above
    del grads
    dist.reduce_scatter_tensor(torch.empty_like(mine),                                # decoy
                               torch.zeros(mine.numel() * self.world, dtype=mine.dtype))
    self.shard.grad = mine
    self.optim.step()
    full = torch.empty(mine.numel() * self.world, dtype=self.shard.dtype)
    dist.all_gather_into_tensor(full, self.shard.detach())
    unflatten_into(full, self.params)  # noqa: F821


Zero2.step = _local_step  # noqa: F821
