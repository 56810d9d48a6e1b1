"""RIGHT (notebook 02, sampler): never leaves torch until the end; pads with Tensor.repeat +
narrow, lays the padded order out as a (per_replica, num_replicas) matrix and takes column
`rank` (instead of slicing a Python list with a stride).

Written from the release notebook alone; the checker must accept it.
"""
import math

import torch


def _order(dataset_len, shuffle, seed, epoch):
    if not shuffle:
        return torch.arange(dataset_len, dtype=torch.int64)
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(dataset_len, generator=generator)


def partition_indices(dataset_len, num_replicas, rank, shuffle=True, seed=0, epoch=0,
                      drop_last=False):
    '''Return the list of dataset indices that replica `rank` visits in epoch `epoch`, in order.'''
    order = _order(dataset_len, shuffle, seed, epoch)
    if drop_last:
        per_replica = dataset_len // num_replicas
    else:
        per_replica = -(-dataset_len // num_replicas)          # ceil without floats
    total = per_replica * num_replicas
    if total == 0:
        return []
    if total > order.numel():                                 # pad: repeat from the start
        copies = math.ceil(total / order.numel())
        order = order.repeat(copies)
    grid = order.narrow(0, 0, total).reshape(per_replica, num_replicas)
    return [int(i) for i in grid.select(1, rank).tolist()]


class PartitionSampler(torch.utils.data.Sampler):
    '''A Sampler built on partition_indices: set_epoch only stores the epoch that __iter__ uses.'''

    def __init__(self, dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False):
        self.args = dict(dataset_len=dataset_len, num_replicas=num_replicas, rank=rank,
                         shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        return iter(partition_indices(epoch=self.epoch, **self.args))

    def __len__(self):
        return len(partition_indices(epoch=self.epoch, **self.args))
