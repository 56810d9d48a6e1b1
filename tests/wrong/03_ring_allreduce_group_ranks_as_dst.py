"""Wrong: ring positions and length come from the group, but the neighbours' group ranks are
handed to isend/recv as they are, while send/recv take global ranks: inside a group of ranks
[1, 2, 3] group rank 0 is global rank 1, so messages go to the wrong processes (or to none).

Violates: "``send``/``recv`` take global ranks: translate the group rank ``r`` with
``dist.get_global_rank(group, r)``"
"""
import torch
import torch.distributed as dist


def ring_all_reduce(tensor, group=None):
    """Sum ``tensor`` over all ranks, in place, with a ring of ``send``/``recv`` messages.

    Args:
        tensor: a contiguous tensor (any shape, any dtype gloo can send) with the same
            shape and dtype on every rank. Work on its flattened view
            ``tensor.view(-1)`` cut into ``world_size`` chunks with ``torch.tensor_split``
            (lengths need not divide evenly; some chunks may be empty).
        group: the process group (``None``: the default group). Sum over the ranks of
            ``group`` only: this rank's position in the ring is ``dist.get_rank(group)``,
            the ring's length ``dist.get_world_size(group)``. ``send``/``recv`` take global ranks: translate
            the group rank ``r`` with ``dist.get_global_rank(group, r)``, which needs a
            group object (with ``group=None`` the group ranks are the global ranks).
    Returns:
        ``tensor`` itself, holding the element-wise sum of every rank's input.

    Only ``dist.send``/``dist.recv``/``dist.isend``/``dist.irecv`` may communicate (no
    collective such as ``dist.all_reduce``): a reduce-scatter of ``world_size - 1``
    steps, then an all-gather of ``world_size - 1`` steps, each step sending one chunk
    to the right neighbour and receiving one chunk from the left neighbour.
    """
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if size == 1:
        return tensor
    right, left = (rank + 1) % size, (rank - 1) % size
    chunks = torch.tensor_split(tensor.view(-1), size)     # views: writes land in tensor
    incoming = torch.empty_like(chunks[0])                 # chunk 0 is the longest

    def exchange(send_chunk, recv_into):
        request = dist.isend(send_chunk, right, group)     # post the send, do not block
        dist.recv(recv_into, left, group)
        request.wait()

    for step in range(size - 1):                           # reduce-scatter
        mine = chunks[(rank - step - 1) % size]
        buffer = incoming[:mine.numel()]
        exchange(chunks[(rank - step) % size], buffer)
        mine.add_(buffer)
    for step in range(size - 1):                           # all-gather
        exchange(chunks[(rank + 1 - step) % size], chunks[(rank - step) % size])
    return tensor
