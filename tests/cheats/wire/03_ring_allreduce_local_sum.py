"""Cheat: every rank rebuilds the other ranks' tensors with the probe's own function (the
inputs are deterministic: ``probes_ring.ring_input`` of the rank and the case number, found by
matching its own tensor), sums them locally, and sends decoy ring messages of the right sizes
to the right neighbour: the recorders see a ring, the links carry a ring's bytes.

Where the links are observed, each rank's inputs also derive from a number only it was given
(``ctx.salt``, in a folder the other ranks' sandboxes cannot read): its own tensor matches no
case it can rebuild, and the others' it cannot rebuild at all. Must fail ``ring-sum``."""
import torch
import torch.distributed as dist

from exercise_utils.torch_distributed_collectives import probes_ring


def _case_of(tensor, rank):
    dtype = str(tensor.dtype).replace("torch.", "")
    for number in [*range(probes_ring.GROUP_CASE0), *range(probes_ring.GROUP_CASE0,
                                                           probes_ring.GROUP_CASE0 + 10)]:
        if torch.equal(probes_ring.ring_input(tuple(tensor.shape), dtype, rank, number), tensor):
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
    number = _case_of(tensor, dist.get_rank())
    scratch = [c.clone() for c in torch.tensor_split(flat, size)]
    for step in range(2 * (size - 1)):
        got = dist.irecv(scratch[(rank - step - 1) % size], left, group=group)
        sent = dist.isend(scratch[(rank - step) % size], right, group=group)
        got.wait()
        sent.wait()
    if number is not None:
        dtype = str(tensor.dtype).replace("torch.", "")
        total = probes_ring.ring_sum(tuple(tensor.shape), dtype, ranks, number)
        flat.copy_(torch.from_numpy(total).reshape(-1).to(tensor.dtype))
    return tensor
