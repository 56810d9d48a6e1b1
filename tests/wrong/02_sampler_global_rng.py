"""Wrong: seeds torch's global random number generator (torch.manual_seed) instead of a
torch.Generator of its own. The indices are right, but every call resets the random state of
the whole training process (initialisation, dropout, augmentation) to seed + epoch.

Violates: "order: if shuffle, torch.randperm(dataset_len, generator=g) with g a torch.Generator
seeded with seed + epoch; otherwise 0, 1, ..., dataset_len - 1."
"""
import math

import torch


def partition_indices(dataset_len, num_replicas, rank, shuffle=True, seed=0, epoch=0,
                      drop_last=False):
    if shuffle:
        torch.manual_seed(seed + epoch)
        order = torch.randperm(dataset_len).tolist()
    else:
        order = list(range(dataset_len))
    if drop_last:
        total = (dataset_len // num_replicas) * num_replicas
        order = order[:total]
    else:
        total = math.ceil(dataset_len / num_replicas) * num_replicas
        while len(order) < total:
            order += order[:total - len(order)]
    return order[rank:total:num_replicas]
