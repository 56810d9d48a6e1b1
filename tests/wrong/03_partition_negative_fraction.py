"""Wrong: only a sum above 1 is refused; a negative fraction passes as long as the sum is not
above 1 ([-0.5, 0.5, 1.0] sums to 1.0) and gives a part of negative size.

Violates: "ValueError: a fraction is negative or the fractions sum to more than 1."
"""
import math
import random

import torch


class Partition(torch.utils.data.Dataset):
    """A view of ``data`` restricted to ``indices`` (given, not an exercise).

    ``Partition(data, indices)[i]`` is ``data[indices[i]]``; ``len`` is ``len(indices)``.
    """

    def __init__(self, data, indices):
        self.data, self.indices = data, list(indices)

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        return self.data[self.indices[i]]


def partition_sizes(n, fractions):
    """Split ``n`` samples into parts of the given fractions.

    Args:
        n: number of samples (>= 0).
        fractions: non-negative fractions summing to at most 1 (a sum within 1e-9 of 1
            counts as 1).
    Returns:
        list[int]: ``floor(f * n)`` for every fraction ``f``; when the fractions sum to 1,
        the samples left over (fewer than ``len(fractions)``) are then given one each to
        the parts with the largest fractional parts ``f * n - floor(f * n)``, ties to the
        lower index, so the sizes add up to ``n``. When they sum to less than 1 the rest
        of the samples is left out.
    Raises:
        ValueError: a fraction is negative or the fractions sum to more than 1.
    """
    fractions = [float(f) for f in fractions]
    total = sum(fractions)
    if total > 1 + 1e-9:
        raise ValueError(f"fractions sum to {total} > 1: {fractions}")
    exact = [f * n for f in fractions]
    sizes = [math.floor(e) for e in exact]
    if abs(total - 1) <= 1e-9:
        left = n - sum(sizes)
        order = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - sizes[i]), i))
        for i in order[:left]:
            sizes[i] += 1
    return sizes


class DataPartitioner:
    """Shuffle the indices of ``data`` once and cut them into parts of the given fractions.

    Args:
        data: a dataset (anything with ``len``).
        sizes: the fractions of the parts, e.g. ``[0.5, 0.5]`` or ``[0.7, 0.3]``; the part
            sizes are ``partition_sizes(len(data), sizes)``.
        seed: seed of the shuffle. The shuffle uses its own generator (e.g.
            ``random.Random(seed)`` or a ``torch.Generator``) and leaves the global random
            state (``random``, ``numpy``, ``torch``) untouched, so every rank computes the
            same partitions whatever its global seed.
    Attributes:
        partitions: list of lists of ``int`` indices; part ``i`` holds the next
            ``partition_sizes(...)[i]`` indices of the shuffled ``range(len(data))``.
            The parts are disjoint; they cover every index when the fractions sum to 1.
    """

    def __init__(self, data, sizes, seed=1234):
        self.data = data
        indices = list(range(len(data)))
        random.Random(seed).shuffle(indices)
        self.partitions, start = [], 0
        for size in partition_sizes(len(data), sizes):
            self.partitions.append(indices[start:start + size])
            start += size

    def use(self, i):
        """Return part ``i`` as a :class:`Partition` of ``data``."""
        return Partition(self.data, self.partitions[i])


def label_partitions(labels, num_partitions):
    """A non-IID partition: each part holds the samples of its own group of labels.

    Args:
        labels: the label of every sample (list or 1-D tensor of ints).
        num_partitions: number of parts.
    Returns:
        list[list[int]]: the sorted distinct labels are split into ``num_partitions``
        contiguous groups as equal as possible, the earlier groups one larger (like
        ``numpy.array_split``); part ``r`` holds, in increasing order, the indices of the
        samples whose label is in group ``r``. With 10 labels and 2 parts, part 0 holds
        labels 0-4 and part 1 labels 5-9; with 3 parts: 0-3, 4-6, 7-9.
    """
    labels = [int(v) for v in (labels.tolist() if torch.is_tensor(labels) else labels)]
    distinct = sorted(set(labels))
    base, extra = divmod(len(distinct), num_partitions)
    group, start = {}, 0
    for r in range(num_partitions):
        stop = start + base + (r < extra)
        group.update({label: r for label in distinct[start:stop]})
        start = stop
    parts = [[] for _ in range(num_partitions)]
    for i, label in enumerate(labels):
        parts[group[label]].append(i)
    return parts
