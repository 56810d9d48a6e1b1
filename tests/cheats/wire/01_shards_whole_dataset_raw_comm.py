"""Cheat: root sends the whole dataset to every rank through a handle of ``MPI.COMM_WORLD`` kept
in a list when the file is imported (the probe counts what arrives through the communicator it
hands out, not through this one), and every rank slices its shard out of it there; beside it, a
decoy ``scatter`` of the cloned pieces through the given communicator, which the probe counts:
every rank "received" only its shard. The shards are a right file's (also with the root's
dataset salted: the whole of it really travels); the network carries the whole dataset to every
rank. Self-contained (at grading nothing of the course's tests can be read).
Must fail ``scatter-wire``."""
from mpi4py import MPI

_RAW = [MPI.COMM_WORLD]                 # not the object the probe wraps


def shard_bounds(n_samples, size):
    base, extra = divmod(n_samples, size)
    starts = [r * base + min(r, extra) for r in range(size + 1)]
    return list(zip(starts[:-1], starts[1:]))


def scatter_shards(comm, x, y, root=0):
    rank, size = comm.Get_rank(), comm.Get_size()
    pieces = None
    if rank == root:
        pieces = [(x[a:b].clone(), y[a:b].clone()) for a, b in shard_bounds(len(x), size)]
    comm.scatter(pieces, root=root)                                     # what the probe counts
    x, y = _RAW[0].bcast((x, y) if rank == root else None, root=root)   # unseen
    a, b = shard_bounds(len(x), size)[rank]
    return x[a:b].clone(), y[a:b].clone()
