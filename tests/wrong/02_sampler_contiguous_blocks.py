"""Wrong: gives every replica a contiguous block of the order instead of every
num_replicas-th index (same samples overall, but not DistributedSampler's partition)."""
import math

import torch


def partition_indices(dataset_len, num_replicas, rank, shuffle=True, seed=0, epoch=0,
                      drop_last=False):
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(dataset_len, generator=g).tolist()
    else:
        order = list(range(dataset_len))
    if drop_last:
        per_replica = dataset_len // num_replicas
    else:
        per_replica = math.ceil(dataset_len / num_replicas)
        total = per_replica * num_replicas
        while len(order) < total:
            order += order[:total - len(order)]
    return order[rank * per_replica:(rank + 1) * per_replica]
