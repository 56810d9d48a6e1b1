"""RIGHT (notebook 01, shards): the bounds from the lengths of ``numpy.array_split``, and the
shards sent by root to each rank with point-to-point ``send``/``recv`` instead of a scatter
(root keeps its own shard without a message); the pieces are cloned, since a pickled view
``x[a:b]`` carries all of x's storage.

Written differently from the solution on purpose; the checker must accept it.
"""
import numpy as np


def shard_bounds(n_samples, size):
    lengths = [len(part) for part in np.array_split(np.arange(n_samples), size)]
    stops = np.cumsum(lengths)
    return [(int(stop - length), int(stop)) for stop, length in zip(stops, lengths)]


def scatter_shards(comm, x, y, root=0):
    rank, size = comm.Get_rank(), comm.Get_size()
    if rank != root:
        return comm.recv(source=root, tag=11)
    mine = None
    for r, (a, b) in enumerate(shard_bounds(len(x), size)):
        if r == root:
            mine = (x[a:b], y[a:b])
        else:
            comm.send((x[a:b].clone(), y[a:b].clone()), dest=r, tag=11)
    return mine
