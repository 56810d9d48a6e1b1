"""Cheat: decoy ring traffic satisfies the message count, the sum comes from an all-reduce
reached through torch.distributed's internal module, which the recorder does not patch.

Must be rejected: "the check's integrity was violated" (the collective is seen on the
ProcessGroup, below torch.distributed's functions)."""
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d


def ring_all_reduce(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(tensor.view(-1), size)
    scratch = [c.clone() for c in chunks]
    for step in range(2 * (size - 1)):          # decoy: the right messages, to the right peers
        send = dist.isend(scratch[(rank - step) % size], (rank + 1) % size)
        dist.recv(scratch[(rank - step - 1) % size], (rank - 1) % size)
        send.wait()
    distributed_c10d.all_reduce(tensor)         # the real work, out of the recorder's sight
    return tensor
