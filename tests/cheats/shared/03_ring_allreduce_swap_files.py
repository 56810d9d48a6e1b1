"""Cheat: the ranks swap their tensors through files in ``/tmp`` and each sums them locally;
on the wire they send decoy chunks of the right sizes around the ring (the recorders count a
ring), and nothing any rank received is used.

Where the ranks of a launch share one sandbox (students' machines; at grading only where no
network namespaces can be made) ``/tmp`` is one folder for all of them and the trick works,
salts or not. At grading each rank runs on a host of its own with its own ``/tmp``
(:mod:`exercise_utils.hosts`): the other ranks' files never appear, the tensor keeps this
rank's own values, and the check fails on the values."""
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

_CALLS = {}
SWAP = Path("/tmp/dtfs-swap-cheat")


def _swap(tensor, ranks, rank):
    """Every rank's tensor of this call, read from the others' files (None for a missing one)."""
    key = tuple(ranks)
    _CALLS[key] = _CALLS.get(key, 0) + 1
    stem = f"{'-'.join(map(str, ranks))}.{_CALLS[key]}.{os.environ.get('MASTER_PORT', '')}"
    SWAP.mkdir(exist_ok=True)
    part = SWAP / f".{stem}.{rank}.tmp"
    torch.save(tensor.detach().clone(), part)
    part.rename(SWAP / f"{stem}.{rank}.pt")
    found, deadline = {}, time.monotonic() + 2
    while len(found) < len(ranks) and time.monotonic() < deadline:
        for r in ranks:
            path = SWAP / f"{stem}.{r}.pt"
            if r not in found and path.exists():
                found[r] = torch.load(path)
        time.sleep(0.01)
    return [found.get(r) for r in ranks]


def ring_all_reduce(tensor, group=None):
    group = group or dist.group.WORLD
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if size == 1:
        return tensor
    ranks = [dist.get_global_rank(group, r) for r in range(size)]
    right, left = ranks[(rank + 1) % size], ranks[(rank - 1) % size]
    scratch = [c.clone() for c in torch.tensor_split(tensor.view(-1), size)]
    for step in range(2 * (size - 1)):           # decoys: a ring's messages, unused (and the
        got = dist.irecv(scratch[(rank - step - 1) % size], left, group=group)   # ranks in step)
        sent = dist.isend(scratch[(rank - step) % size], right, group=group)
        got.wait()
        sent.wait()
    parts = _swap(tensor.view(-1), ranks, ranks[rank])
    if all(p is not None for p in parts):
        total = parts[0].clone()
        for p in parts[1:]:
            total += p
        tensor.view(-1).copy_(total)
    return tensor
