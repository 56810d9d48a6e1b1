"""RIGHT (notebook 03, ring_allreduce): only the blocking ``dist.send`` / ``dist.recv``, made
deadlock-free by ordering: even ranks send first, odd ranks receive first (with an odd number of
ranks the two even neighbours 0 and world_size - 1 wait for each other only until rank 1 has
received). Peers are given as group ranks (``group_dst`` / ``group_src``), so no translation to
global ranks is needed; the chunk lengths are computed by hand (the first ``numel % world_size``
one longer, as ``torch.tensor_split`` makes them).

Written differently from the solution on purpose; the checker must accept it.
"""
import torch
import torch.distributed as dist


def ring_all_reduce(tensor, group=None):
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if size == 1:
        return tensor
    base, extra = divmod(tensor.numel(), size)
    chunks = tensor.view(-1).split([base + (i < extra) for i in range(size)])
    right, left = (rank + 1) % size, (rank - 1) % size

    def exchange(outgoing, incoming):
        if rank % 2 == 0:
            dist.send(outgoing, group=group, group_dst=right)
            dist.recv(incoming, group=group, group_src=left)
        else:
            dist.recv(incoming, group=group, group_src=left)
            dist.send(outgoing, group=group, group_dst=right)

    for step in range(size - 1):                      # reduce-scatter
        target = chunks[(rank - step - 1) % size]
        received = torch.zeros_like(target)
        exchange(chunks[(rank - step) % size], received)
        target.add_(received)
    for step in range(size - 1):                      # all-gather
        exchange(chunks[(rank + 1 - step) % size], chunks[(rank - step) % size])
    return tensor
