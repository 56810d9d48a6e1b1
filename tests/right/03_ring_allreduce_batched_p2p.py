"""RIGHT (notebook 03, ring_allreduce): every step posts its send and its receive together with
``batch_isend_irecv`` (a list of ``P2POp``) and waits for both; the names are imported from
``torch.distributed``; the group defaults to ``group.WORLD`` so that ``get_global_rank`` always
gets a group object; the incoming chunk gets a fresh buffer each step and is added with ``+=``.

Written differently from the solution on purpose; the checker must accept it.
"""
import torch
from torch.distributed import (P2POp, batch_isend_irecv, get_global_rank, get_rank,
                               get_world_size, irecv, isend)
from torch.distributed import group as groups


def ring_all_reduce(tensor, group=None):
    pg = groups.WORLD if group is None else group
    rank, size = get_rank(pg), get_world_size(pg)
    right = get_global_rank(pg, (rank + 1) % size)
    left = get_global_rank(pg, (rank - 1) % size)
    chunks = torch.tensor_split(tensor.view(-1), size)

    def exchange(outgoing, incoming):
        ops = [P2POp(isend, outgoing, right, group), P2POp(irecv, incoming, left, group)]
        for request in batch_isend_irecv(ops):
            request.wait()

    for step in range(size - 1):                      # reduce-scatter
        mine = chunks[(rank - step - 1) % size]
        buffer = torch.empty_like(mine)
        exchange(chunks[(rank - step) % size], buffer)
        mine += buffer
    for step in range(size - 1):                      # all-gather
        exchange(chunks[(rank + 1 - step) % size], chunks[(rank - step) % size])
    return tensor
