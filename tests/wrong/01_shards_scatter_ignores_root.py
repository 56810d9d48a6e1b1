"""Wrong: correct shards, but scatter always from rank 0 (ignores the root argument).

Violates: "On `root`, x and y hold every sample (None elsewhere). Return this rank's (x, y) shard."
"""
import numpy as np


def shard_bounds(n_samples, size):
    parts = np.array_split(np.arange(n_samples), size)
    starts = np.cumsum([0] + [len(p) for p in parts[:-1]])
    return [(int(s), int(s) + len(p)) for s, p in zip(starts, parts)]


def scatter_shards(comm, x, y, root=0):
    pieces = None
    if comm.Get_rank() == 0:
        pieces = [(x[a:b], y[a:b]) for a, b in shard_bounds(len(x), comm.Get_size())]
    return comm.scatter(pieces, root=0)
