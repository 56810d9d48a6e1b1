"""Wrong: every shard has n // size samples, so the remainder is silently dropped.

Violates: "Return a list of `size` (start, stop) pairs that tile range(n_samples) in rank order."
"""


def shard_bounds(n_samples, size):
    per = n_samples // size
    return [(r * per, (r + 1) * per) for r in range(size)]


def scatter_shards(comm, x, y, root=0):
    pieces = None
    if comm.Get_rank() == root:
        pieces = [(x[a:b], y[a:b]) for a, b in shard_bounds(len(x), comm.Get_size())]
    return comm.scatter(pieces, root=root)
