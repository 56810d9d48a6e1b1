"""RIGHT (notebook 03, ring_allreduce): addresses the neighbours by their *group* rank through
the ``group_src=`` / ``group_dst=`` arguments of ``irecv`` / ``send`` (no ``get_global_rank``),
posts each receive with ``dist.irecv`` and then sends with the *blocking* ``dist.send``
(safe: every receive is posted before any send), reduces through one reusable scratch buffer
sized for the largest chunk, and gathers by receiving straight into the destination chunk.

Written from the release notebook alone; the checker must accept it.
"""
import torch
import torch.distributed as dist


def _step(outgoing, incoming, left, right, group):
    """One ring step: post the receive from the left, send to the right, wait."""
    pending = dist.irecv(incoming, group=group, group_src=left)
    dist.send(outgoing, group=group, group_dst=right)
    pending.wait()


def ring_all_reduce(tensor, group=None):
    """Sum ``tensor`` over the ranks of ``group``, in place, with a ring of messages."""
    ring = dist.get_world_size(group)
    me = dist.get_rank(group)
    if ring == 1:
        return tensor
    right, left = (me + 1) % ring, (me - 1) % ring

    pieces = torch.tensor_split(tensor.view(-1), ring)   # views into the caller's tensor
    scratch = torch.empty_like(pieces[0])                 # the first chunk is the longest

    # reduce-scatter: after ring - 1 steps piece (me + 1) % ring is complete here
    for s in range(ring - 1):
        out_i, in_i = (me - s) % ring, (me - s - 1) % ring
        inbox = scratch.narrow(0, 0, pieces[in_i].numel())
        _step(pieces[out_i], inbox, left, right, group)
        pieces[in_i].add_(inbox)                          # stays in the tensor's own dtype

    # all-gather: the complete pieces travel once more around the ring
    for s in range(ring - 1):
        out_i, in_i = (me + 1 - s) % ring, (me - s) % ring
        _step(pieces[out_i], pieces[in_i], left, right, group)
    return tensor
