"""Cheat: every rank's whole tensor gathered through the process group's own ``allgather``
method taken from the class at import, summed locally; decoy ring messages for the recorder.

The network counters see every rank's tensor travel the ring: (world_size - 1) whole tensors
per link instead of 2 * (world_size - 1) / world_size. Must fail ``ring-wire``."""
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

_ALLGATHER = ProcessGroup.allgather


def ring_all_reduce(tensor, group=None):
    group = group or dist.group.WORLD
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if size == 1:
        return tensor
    right = dist.get_global_rank(group, (rank + 1) % size)
    left = dist.get_global_rank(group, (rank - 1) % size)
    flat = tensor.view(-1)
    scratch = [c.clone() for c in torch.tensor_split(flat, size)]
    for step in range(2 * (size - 1)):
        got = dist.irecv(scratch[(rank - step - 1) % size], left, group=group)
        sent = dist.isend(scratch[(rank - step) % size], right, group=group)
        got.wait()
        sent.wait()
    parts = [torch.empty_like(flat) for _ in range(size)]
    _ALLGATHER(group, [parts], [flat.clone()]).wait()
    total = parts[0].clone()
    for part in parts[1:]:
        total += part
    flat.copy_(total)
    return tensor
