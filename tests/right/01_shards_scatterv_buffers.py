"""RIGHT (notebook 01, shards): closed-form bounds (``start = r * base + min(r, extra)``), and
the buffer API: root broadcasts the number of samples and the feature shape (a few integers),
then two ``Scatterv`` calls with per-rank counts and displacements deliver numpy shards.

Written differently from the solution on purpose; the checker must accept it.
"""
import numpy as np
from mpi4py import MPI


def shard_bounds(n_samples, size):
    base, extra = divmod(n_samples, size)
    starts = [r * base + min(r, extra) for r in range(size + 1)]
    return list(zip(starts[:-1], starts[1:]))


def scatter_shards(comm, x, y, root=0):
    rank, size = comm.Get_rank(), comm.Get_size()
    meta = (len(x), tuple(x.shape[1:])) if rank == root else None
    n, features = comm.bcast(meta, root=root)
    bounds = shard_bounds(n, size)
    width = int(np.prod(features))
    a, b = bounds[rank]
    xs = np.empty((b - a, *features), dtype=np.float32)
    ys = np.empty(b - a, dtype=np.int64)
    xsend = ysend = None
    if rank == root:
        counts = [stop - start for start, stop in bounds]
        starts = [start for start, _ in bounds]
        xsend = [np.ascontiguousarray(x, dtype=np.float32),
                 ([c * width for c in counts], [s * width for s in starts]), MPI.FLOAT]
        ysend = [np.ascontiguousarray(y, dtype=np.int64), (counts, starts), MPI.INT64_T]
    comm.Scatterv(xsend, xs, root=root)
    comm.Scatterv(ysend, ys, root=root)
    return xs, ys
