"""RIGHT (notebook 03, partition): the shuffle sorts the indices by keys drawn from a private
``random.Random(seed)`` (no ``shuffle`` call at all), the sizes use ``math.fsum`` and hand out the
left-over samples through one ``sorted`` on ``(-remainder, index)``, the parts are cut with
``itertools.accumulate`` offsets, and ``label_partitions`` maps every label to its group with a
dict in one pass over the samples.

Written from the release notebook alone; the checker must accept it.
"""
import itertools
import math
import random

import torch


class Partition(torch.utils.data.Dataset):
    """A view of ``data`` restricted to ``indices`` (given, not an exercise)."""

    def __init__(self, data, indices):
        self.data, self.indices = data, list(indices)

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        return self.data[self.indices[i]]


def partition_sizes(n, fractions):
    """floor(f * n) per fraction; leftovers to the largest remainders when they sum to 1."""
    fractions = [float(f) for f in fractions]
    if any(f < 0 for f in fractions):
        raise ValueError(f"negative fraction in {fractions}")
    total = math.fsum(fractions)
    if total > 1 + 1e-9:
        raise ValueError(f"fractions sum to {total} > 1")
    exact = [f * n for f in fractions]
    sizes = [math.floor(e) for e in exact]
    if abs(total - 1) <= 1e-9:
        left = n - sum(sizes)
        order = sorted(range(len(fractions)), key=lambda i: (-(exact[i] - sizes[i]), i))
        for k in range(max(left, 0)):
            sizes[order[k % len(order)]] += 1
    return sizes


class DataPartitioner:
    """Shuffle the indices once (private generator) and cut them into parts."""

    def __init__(self, data, sizes, seed=1234):
        self.data = data
        n = len(data)
        rng = random.Random(seed)
        keys = [rng.random() for _ in range(n)]
        order = sorted(range(n), key=keys.__getitem__)
        bounds = list(itertools.accumulate(partition_sizes(n, sizes), initial=0))
        self.partitions = [order[a:b] for a, b in zip(bounds, bounds[1:])]

    def use(self, i):
        return Partition(self.data, self.partitions[i])


def label_partitions(labels, num_partitions):
    """Split the sorted distinct labels into contiguous groups; part r: samples of group r."""
    labels = labels.tolist() if hasattr(labels, "tolist") else list(labels)
    distinct = sorted(set(labels))
    base, extra = divmod(len(distinct), num_partitions)
    group_of, start = {}, 0
    for r in range(num_partitions):
        width = base + (1 if r < extra else 0)
        for label in distinct[start:start + width]:
            group_of[label] = r
        start += width
    parts = [[] for _ in range(num_partitions)]
    for index, label in enumerate(labels):
        parts[group_of[label]].append(index)
    return parts
