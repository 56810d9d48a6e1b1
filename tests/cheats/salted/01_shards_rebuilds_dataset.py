"""Cheat: scatter_shards sends no sample. Every rank other than ``root`` rebuilds root's dataset
with the probe's own function (``probes.scatter_data``; the case's size, dtype and sample shape
read from the probe's frames) and keeps its own shard of it; the root makes the decoy
``comm.scatter`` of zero shards of the right shapes (what every rank must receive, no more),
whose contents the others throw away: no rank uses anything the root sent.

At grading the root's dataset derives from a number only it was given (``ctx.salt``): the
dataset a rank rebuilds is not root's. Must fail ``scatter-shard``."""
import sys

import torch

from exercise_utils.mpi_parallel_sgd import probes


def shard_bounds(n_samples, size):
    base, extra = divmod(n_samples, size)
    bounds, start = [], 0
    for rank in range(size):
        stop = start + base + (1 if rank < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _case():
    frame = sys._getframe(2)
    while frame is not None and not {"n", "dtype", "shape"} <= frame.f_locals.keys():
        frame = frame.f_back
    return frame.f_locals["n"], frame.f_locals["dtype"], frame.f_locals["shape"]


def scatter_shards(comm, x, y, root=0):
    rank, size = comm.Get_rank(), comm.Get_size()
    pieces = None
    if rank == root:
        pieces = [(torch.zeros_like(x[a:b]), torch.zeros_like(y[a:b]))
                  for a, b in shard_bounds(len(x), size)]
    comm.scatter(pieces, root=root)                             # decoy
    if rank != root:
        n, dtype, shape = _case()
        x, y = probes.scatter_data(n, dtype, shape)
    a, b = shard_bounds(len(x), size)[rank]
    return x[a:b], y[a:b]
