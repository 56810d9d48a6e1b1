"""Cheat: like ``tests/cheats/wire/03_ring_allreduce_local_sum.py`` (the others' tensors
rebuilt locally, decoy ring messages), but with the salts the judge gave the other ranks, read
from their private folders beside this rank's own (``DTFS_PRIVATE``).

Where the links are observed without a sandbox the folders are readable and the trick works;
at grading each rank's sandbox shows the other ranks' folders empty: reading fails."""
import os
from pathlib import Path

import torch
import torch.distributed as dist

from exercise_utils.torch_distributed_collectives import probes_ring


def _salt(rank):
    folder = os.environ.get("DTFS_PRIVATE")
    return int((Path(folder).parent / f"private{rank}" / "salt").read_text()) if folder else 0


def _case_of(tensor, rank):
    dtype = str(tensor.dtype).replace("torch.", "")
    for number in [*range(probes_ring.GROUP_CASE0), *range(probes_ring.GROUP_CASE0,
                                                           probes_ring.GROUP_CASE0 + 10)]:
        mine = probes_ring.ring_input(tuple(tensor.shape), dtype, rank, number, _salt(rank))
        if torch.equal(mine, tensor):
            return number
    return None


def ring_all_reduce(tensor, group=None):
    group = group or dist.group.WORLD
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if size == 1:
        return tensor
    ranks = [dist.get_global_rank(group, r) for r in range(size)]
    right, left = ranks[(rank + 1) % size], ranks[(rank - 1) % size]
    flat = tensor.view(-1)
    salts = {r: _salt(r) for r in ranks}
    number = _case_of(tensor, dist.get_rank())
    scratch = [c.clone() for c in torch.tensor_split(flat, size)]
    for step in range(2 * (size - 1)):
        got = dist.irecv(scratch[(rank - step - 1) % size], left, group=group)
        sent = dist.isend(scratch[(rank - step) % size], right, group=group)
        got.wait()
        sent.wait()
    if number is not None:
        dtype = str(tensor.dtype).replace("torch.", "")
        total = probes_ring.ring_sum(tuple(tensor.shape), dtype, ranks, number, salts)
        flat.copy_(torch.from_numpy(total).reshape(-1).to(tensor.dtype))
    return tensor
