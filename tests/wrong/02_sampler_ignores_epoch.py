"""Wrong: shuffles with the seed alone, ignoring the epoch: every epoch repeats the same order.

Violates: "order: if shuffle, torch.randperm(dataset_len, generator=g) with g a torch.Generator
seeded with seed + epoch; otherwise 0, 1, ..., dataset_len - 1."
"""
import math

import torch


def partition_indices(dataset_len, num_replicas, rank, shuffle=True, seed=0, epoch=0,
                      drop_last=False):
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed)
        order = torch.randperm(dataset_len, generator=g).tolist()
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
