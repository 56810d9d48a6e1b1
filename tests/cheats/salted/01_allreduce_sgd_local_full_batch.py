"""Cheat: average_gradients rebuilds the step's whole global batch with the probe's own function
(``probes.sgd_batches``; the world size from the communicator, the dtype from the gradients),
puts its own rows (``xb``, ``yb``, read from the probe's frames) in its place, computes the
gradient of the mean loss over the whole batch on its own, and makes one decoy
``comm.Allreduce`` of a zero buffer as large as the gradients per step (the calls and elements
the check counts): no rank uses anything another rank sent.

At grading each rank's rows derive from a number only it was given (``ctx.salt``): the other
ranks' rows it rebuilds are not theirs. Must fail ``sgd-values``."""
import sys

import torch
import torch.nn.functional as F
from mpi4py import MPI

from exercise_utils.mpi_parallel_sgd import probes


def _my_rows():
    frame = sys._getframe(2)
    while frame is not None and not {"xb", "yb"} <= frame.f_locals.keys():
        frame = frame.f_back
    return frame.f_locals["xb"], frame.f_locals["yb"]


def average_gradients(comm, model):
    had = [p for p in model.parameters() if p.grad is not None]
    dtype = had[0].dtype
    step = getattr(model, "_step", 0)
    model._step = step + 1
    x, y = probes.sgd_batches(comm.Get_size(), str(dtype).replace("torch.", ""))
    xb, yb = _my_rows()
    rows = slice(comm.Get_rank() * len(yb), (comm.Get_rank() + 1) * len(yb))
    x, y = x[step].clone(), y[step].clone()
    x[rows], y[rows] = xb, yb
    model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        F.cross_entropy(model(x), y).backward()
    decoy = torch.zeros(sum(p.numel() for p in had), dtype=dtype)
    comm.Allreduce(MPI.IN_PLACE, decoy.numpy(), op=MPI.SUM)
