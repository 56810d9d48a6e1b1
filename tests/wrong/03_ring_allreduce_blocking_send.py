"""Wrong: every rank first calls the blocking dist.send, then dist.recv. With gloo a send
waits until the peer posts its receive, so all ranks wait for each other forever.

Violates: "With gloo, a send starts only once the peer has posted the matching receive (the
receiver tells the sender over the connection they share): if every rank first sends with the
blocking ``dist.send`` and then receives, all of them wait forever."
"""
import torch
import torch.distributed as dist


def ring_all_reduce(tensor, group=None):
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    right, left = (rank + 1) % size, (rank - 1) % size
    chunks = torch.tensor_split(tensor.view(-1), size)
    incoming = torch.empty_like(chunks[0])
    for step in range(size - 1):
        mine = chunks[(rank - step - 1) % size]
        buffer = incoming[:mine.numel()]
        dist.send(chunks[(rank - step) % size], right)
        dist.recv(buffer, left)
        mine.add_(buffer)
    for step in range(size - 1):
        dist.send(chunks[(rank + 1 - step) % size], right)
        dist.recv(chunks[(rank - step) % size], left)
    return tensor
