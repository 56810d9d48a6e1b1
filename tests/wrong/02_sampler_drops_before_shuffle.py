"""Wrong: with drop_last it shuffles only the samples it keeps, so the same last samples of the
dataset are dropped in every epoch (DistributedSampler shuffles first, then cuts the tail).

Violates: "With drop_last=True every replica gets dataset_len // num_replicas: cut the tail of
the order."
"""
import math

import torch


def partition_indices(dataset_len, num_replicas, rank, shuffle=True, seed=0, epoch=0,
                      drop_last=False):
    if drop_last:
        used = (dataset_len // num_replicas) * num_replicas
    else:
        used = dataset_len
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(used, generator=g).tolist()
    else:
        order = list(range(used))
    total = math.ceil(used / num_replicas) * num_replicas
    while len(order) < total:
        order += order[:total - len(order)]
    return order[rank:total:num_replicas]
