"""RIGHT (notebook 01, shards): closed-form bounds (``start = r * base + min(r, extra)``), and
the buffer API: root broadcasts the number of samples, the feature shape and the two numpy
dtypes (a few small objects), then two ``Scatterv`` calls with per-rank counts and
displacements deliver the shards into numpy buffers of those dtypes, returned as tensors.

Written differently from the solution on purpose; the checker must accept it.
"""
import numpy as np
import torch
from mpi4py import MPI


def shard_bounds(n_samples, size):
    base, extra = divmod(n_samples, size)
    starts = [r * base + min(r, extra) for r in range(size + 1)]
    return list(zip(starts[:-1], starts[1:]))


def scatter_shards(comm, x, y, root=0):
    rank, size = comm.Get_rank(), comm.Get_size()
    meta = None
    if rank == root:
        x_np, y_np = np.ascontiguousarray(x.numpy()), np.ascontiguousarray(y.numpy())
        meta = (len(x_np), x_np.shape[1:], x_np.dtype.str, y_np.dtype.str)
    n, features, x_type, y_type = comm.bcast(meta, root=root)
    bounds = shard_bounds(n, size)
    width = int(np.prod(features))
    a, b = bounds[rank]
    xs = np.empty((b - a, *features), dtype=np.dtype(x_type))
    ys = np.empty(b - a, dtype=np.dtype(y_type))
    xsend = ysend = None
    if rank == root:
        counts = [stop - start for start, stop in bounds]
        starts = [start for start, _ in bounds]
        xsend = [x_np, ([c * width for c in counts], [s * width for s in starts]),
                 MPI._typedict[x_np.dtype.char]]
        ysend = [y_np, (counts, starts), MPI._typedict[y_np.dtype.char]]
    comm.Scatterv(xsend, xs, root=root)
    comm.Scatterv(ysend, ys, root=root)
    return torch.from_numpy(xs), torch.from_numpy(ys)
