"""Wrong: gives every replica a contiguous block of the padded order (like notebook 01's
shards) instead of every num_replicas-th index: the same lengths, other samples.

Violates: "this replica's share: every num_replicas-th index of that list, starting at position
rank."
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
        per = dataset_len // num_replicas
        order = order[:per * num_replicas]
    else:
        per = math.ceil(dataset_len / num_replicas)
        while len(order) < per * num_replicas:
            order += order[:per * num_replicas - len(order)]
    return order[rank * per:(rank + 1) * per]
