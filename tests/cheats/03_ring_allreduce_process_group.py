"""Cheat: decoy ring traffic, and the sum from the ProcessGroup object's own allreduce
(``dist.group.WORLD.allreduce``), a path below torch.distributed's functions.

Must be rejected: "the check's integrity was violated"."""
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(tensor.view(-1), size)
    scratch = [c.clone() for c in chunks]
    for step in range(2 * (size - 1)):
        send = dist.isend(scratch[(rank - step) % size], (rank + 1) % size)
        dist.recv(scratch[(rank - step - 1) % size], (rank - 1) % size)
        send.wait()
    dist.group.WORLD.allreduce([tensor]).wait()
    return tensor
