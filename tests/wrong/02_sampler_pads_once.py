"""Wrong: pads by appending the start of the order once, which is enough unless the dataset is
smaller than half the padded length (2 samples, 5 replicas: 4 indices instead of 5).

Violates: "equal lengths: with drop_last=False every replica gets ceil(dataset_len /
num_replicas) indices: extend the order by repeating it from its start (as many times as
needed) up to that many times num_replicas."
"""
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
        total = (dataset_len // num_replicas) * num_replicas
        order = order[:total]
    else:
        total = math.ceil(dataset_len / num_replicas) * num_replicas
        order += order[:total - len(order)]
    return order[rank:total:num_replicas]
