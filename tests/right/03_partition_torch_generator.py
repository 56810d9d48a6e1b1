"""RIGHT (notebook 03, partition): the shuffle is ``torch.randperm`` with a private
``torch.Generator`` seeded with ``seed``; the parts are cut with ``torch.split``; the samples
left over go to the largest fractional parts through a stable descending sort (equal remainders
keep their index order); "sums to 1" is ``math.isclose`` with an absolute tolerance of 1e-9;
``label_partitions`` groups the labels with ``numpy.array_split`` and finds the samples with
``torch.isin``.

Written differently from the solution on purpose; the checker must accept it.
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
    if min(fractions, default=0.0) < 0 or sum(fractions) > 1 + 1e-9:
        raise ValueError(f"fractions must be non-negative and sum to at most 1: {fractions}")
    sizes = [math.floor(f * n) for f in fractions]
    if math.isclose(sum(fractions), 1.0, rel_tol=0.0, abs_tol=1e-9):
        remainders = [f * n - s for f, s in zip(fractions, sizes)]
        by_remainder = sorted(range(len(sizes)), key=remainders.__getitem__, reverse=True)
        for i in by_remainder[:n - sum(sizes)]:
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
        generator = torch.Generator().manual_seed(seed)
        order = torch.randperm(len(data), generator=generator)
        counts = partition_sizes(len(data), sizes)
        pieces = torch.split(order[:sum(counts)], counts)
        self.partitions = [piece.tolist() for piece in pieces]

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
    import numpy as np
    labels = torch.as_tensor(labels)
    groups = np.array_split(np.unique(labels.numpy()), num_partitions)
    return [torch.nonzero(torch.isin(labels, torch.as_tensor(g, dtype=labels.dtype))).view(-1)
            .tolist() for g in groups]
