"""The judge's reference for notebook 02: ``DistributedSampler``'s order and partition, and a
short rendering of long index lists for messages.

Used in 02_shared_memory_hogwild (:mod:`.checks`, :mod:`.checks_hogwild`).
"""
import torch
from torch.utils.data import DistributedSampler


def reference_partition(n, replicas, rank, shuffle, seed, epoch, drop_last):
    """What ``DistributedSampler`` yields for a dataset of ``n`` samples after
    ``set_epoch(epoch)``."""
    sampler = DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=shuffle,
                                 seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


def shuffled_order(n, shuffle, seed, epoch):
    """The order DistributedSampler partitions: ``randperm(n)`` seeded with seed + epoch (the
    judge's: no rank can import it at grading)."""
    if not shuffle:
        return list(range(n))
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def short(items, limit=16):
    """``str(list)``, cut after ``limit`` items."""
    items = list(items)
    return str(items) if len(items) <= limit else str(items[:limit])[:-1] + ", ...]"
