"""Wrong: the last rank takes the whole remainder, so shard sizes differ by more than one.

Violates: "Shard sizes differ by at most one; the first n_samples % size ranks get one more."
"""


def shard_bounds(n_samples, size):
    per = n_samples // size
    return [(r * per, n_samples if r == size - 1 else (r + 1) * per) for r in range(size)]


def scatter_shards(comm, x, y, root=0):
    pieces = None
    if comm.Get_rank() == root:
        pieces = [(x[a:b], y[a:b]) for a, b in shard_bounds(len(x), comm.Get_size())]
    return comm.scatter(pieces, root=root)
