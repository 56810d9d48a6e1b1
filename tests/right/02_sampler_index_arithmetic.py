"""RIGHT (notebook 02, sampler): no padded list at all: replica ``rank``'s j-th index is
position ``rank + j * num_replicas`` of the order, wrapped around with ``%`` when it runs past
the end (which is what repeating the order from its start amounts to).

Written differently from the solution on purpose; the checker must accept it.
"""
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
        count = dataset_len // num_replicas
    else:
        count = (dataset_len + num_replicas - 1) // num_replicas
    return [order[(rank + j * num_replicas) % dataset_len] for j in range(count)]
