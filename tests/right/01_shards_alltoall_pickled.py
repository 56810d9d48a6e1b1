"""RIGHT (notebook 01, shards): bounds from a running sum of sizes (itertools.accumulate);
the shards travel with one lowercase `alltoall` of cloned torch tensors (root fills its list,
every other rank sends None), so dtype and shape ride along in the pickle and torch is never left.

Written from the release notebook alone; the checker must accept it.
"""
from itertools import accumulate


def shard_bounds(n_samples, size):
    '''Return a list of `size` (start, stop) pairs that tile range(n_samples) in rank order.

    Shard sizes differ by at most one; the first n_samples % size ranks get one more.
    '''
    n_samples, size = int(n_samples), int(size)
    base, extra = divmod(n_samples, size)
    sizes = [base + (1 if r < extra else 0) for r in range(size)]
    stops = list(accumulate(sizes))
    starts = [0] + stops[:-1]
    return list(zip(starts, stops))


def scatter_shards(comm, x, y, root=0):
    '''On `root`, x and y hold every sample (None elsewhere). Return this rank's (x, y) shard.'''
    size = comm.Get_size()
    if comm.Get_rank() == root:
        outgoing = []
        for start, stop in shard_bounds(x.shape[0], size):
            # clone: a pickled view would carry its whole storage (the full dataset)
            outgoing.append((x[start:stop].clone(), y[start:stop].clone()))
    else:
        outgoing = [None] * size
    incoming = comm.alltoall(outgoing)
    x_shard, y_shard = incoming[root]
    return x_shard, y_shard
