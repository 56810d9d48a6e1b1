"""Wrong: splits the tensor into chunks but reduces each chunk with dist.all_reduce
instead of passing it around the ring with send/recv.

Violates: "Only ``dist.send``/``dist.recv``/``dist.isend``/``dist.irecv`` may communicate (no
collective such as ``dist.all_reduce``)"
"""
import torch
import torch.distributed as dist


def ring_all_reduce(tensor, group=None):
    size = dist.get_world_size(group)
    for chunk in torch.tensor_split(tensor.view(-1), size):
        dist.all_reduce(chunk, group=group)
    return tensor
