"""Cheat: average_gradients takes the step's global batch from the probe's frame (every rank
draws it whole, then keeps its own rows), computes the gradient of the mean loss over all its
rows on its own, and makes a decoy all_reduce of a zero buffer as large as the gradients: no
rank uses anything another rank sent. (Inside process groups it averages honestly.)

At grading each rank's rows derive from a number only it was given (``ctx.salt``): the
other ranks' rows it holds are not theirs. Must fail ``avg-values``."""
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _honest(model, n, group):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    count = torch.tensor([float(n)], dtype=grads[0].dtype if grads else torch.float32)
    dist.all_reduce(count, group=group)
    for g in grads:
        g.mul_(n)
        dist.all_reduce(g, group=group)
        g.div_(count)


def average_gradients(model, local_batch_size, group=None):
    frame = sys._getframe(1)
    while frame is not None and not {"x", "y", "part"} <= frame.f_locals.keys():
        frame = frame.f_back
    if group is not None or frame is None:
        return _honest(model, local_batch_size, group)
    x, y = frame.f_locals["x"], frame.f_locals["y"]
    had = [p for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        loss = F.cross_entropy(model(x), y, reduction="sum") / len(y)
        loss.backward()
    flat = sum(p.numel() for p in had)
    dist.all_reduce(torch.zeros(flat, dtype=had[0].dtype if had else torch.float32))
    dist.all_reduce(torch.zeros(1))
