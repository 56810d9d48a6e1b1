"""RIGHT (notebook 02, sampler): the order as a numpy array, padded with ``numpy.resize`` (which
repeats an array from its start as often as needed), cut by slicing, and the share taken with
a numpy stride.

Written differently from the solution on purpose; the checker must accept it.
"""
import numpy as np
import torch


def partition_indices(dataset_len, num_replicas, rank, shuffle=True, seed=0, epoch=0,
                      drop_last=False):
    if shuffle:
        g = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(dataset_len, generator=g).numpy()
    else:
        order = np.arange(dataset_len)
    per_replica = (dataset_len // num_replicas if drop_last
                   else -(-dataset_len // num_replicas))
    total = per_replica * num_replicas
    order = order[:total] if drop_last else np.resize(order, total)
    return order[rank::num_replicas].tolist()
