"""Wrong: broadcasts the whole dataset to every rank, which then slices out its own shard. Every
rank returns the right shard, but each one received (and held) all samples.

Violates: "Every rank receives only its own shard, never the whole dataset."
"""


def shard_bounds(n_samples, size):
    base, extra = divmod(n_samples, size)
    bounds, start = [], 0
    for rank in range(size):
        stop = start + base + (1 if rank < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def scatter_shards(comm, x, y, root=0):
    x, y = comm.bcast((x, y), root=root)
    a, b = shard_bounds(len(x), comm.Get_size())[comm.Get_rank()]
    return x[a:b], y[a:b]
