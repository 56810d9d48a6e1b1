"""Cheat: allreduce_naive rebuilds every rank's batch with the probe's own function
(``reference.batch``, the model's spec and the step read from the probe's frame), computes the
average of the ranks' gradients on its own, and makes one decoy all_reduce of zeros per
gradient (the calls the check counts): no rank uses anything another rank sent. The rest of
the file is the solution's (tests/right/06_naive_scale_first.py).

At grading each rank's batches derive from a number only it was given (``ctx.salt``): the
batches it rebuilds are not the ranks'. Must fail ``naive-values``."""
import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from exercise_utils.build_your_own_ddp.reference import batch

_RIGHT = Path(__file__).resolve().parents[2] / "right" / "06_naive_scale_first.py"
exec(compile(_RIGHT.read_text(), str(_RIGHT), "exec"))


def allreduce_naive(params):
    params = list(params)
    frame = sys._getframe(1)
    while frame is not None and not {"spec", "step", "model"} <= frame.f_locals.keys():
        frame = frame.f_back
    seen = frame.f_locals
    model, spec, step = seen["model"], seen["spec"], seen["step"]
    size = dist.get_world_size()
    total = {}
    for r in range(size):
        other = copy.deepcopy(model)
        other.zero_grad(set_to_none=True)
        x, y = batch(spec, step, r)
        F.cross_entropy(other(x), y).backward()
        for (n, p) in other.named_parameters():
            if p.grad is not None:
                total[n] = total.get(n, 0) + p.grad / size
    names = {id(p): n for n, p in model.named_parameters()}
    for p in params:
        if p.grad is not None:
            dist.all_reduce(torch.zeros_like(p.grad))
            p.grad.copy_(total[names[id(p)]])
