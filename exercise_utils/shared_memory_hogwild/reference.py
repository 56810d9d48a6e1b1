"""The judge's reference for notebook 02: ``DistributedSampler``'s partition, and a short
rendering of long index lists for messages.

Used in 02_shared_memory_hogwild (:mod:`.checks`, :mod:`.checks_hogwild`).
"""
from torch.utils.data import DistributedSampler


def reference_partition(n, replicas, rank, shuffle, seed, epoch, drop_last):
    """What ``DistributedSampler`` yields for a dataset of ``n`` samples after
    ``set_epoch(epoch)``."""
    sampler = DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=shuffle,
                                 seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


def short(items, limit=16):
    """``str(list)``, cut after ``limit`` items."""
    items = list(items)
    return str(items) if len(items) <= limit else str(items[:limit])[:-1] + ", ...]"
