"""Cheat: decoy ring messages for the recorder, and the sum from ``ProcessGroup.allreduce``
taken from the class when the file is imported (before the check's watch wraps it).

In-process recorders cannot see the call; the network counters can: gloo's own all-reduce
puts a second ring's bytes on the links to the left neighbours. Must fail ``ring-wire``."""
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

_ALLREDUCE = ProcessGroup.allreduce


def ring_all_reduce(tensor, group=None):
    group = group or dist.group.WORLD
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if size == 1:
        return tensor
    right = dist.get_global_rank(group, (rank + 1) % size)
    left = dist.get_global_rank(group, (rank - 1) % size)
    chunks = torch.tensor_split(tensor.view(-1), size)
    scratch = [c.clone() for c in chunks]
    for step in range(2 * (size - 1)):
        got = dist.irecv(scratch[(rank - step - 1) % size], left, group=group)
        sent = dist.isend(scratch[(rank - step) % size], right, group=group)
        got.wait()
        sent.wait()
    _ALLREDUCE(group, [tensor]).wait()
    return tensor
