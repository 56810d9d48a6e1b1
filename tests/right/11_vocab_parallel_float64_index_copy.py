"""Vocab-parallel variant: the loss computed in float64 whatever the logits' dtype (cast back at the end), index_select shard, embedding by nonzero indices and index_copy into zeros, target logits by advanced indexing of the owned rows; an empty batch of tokens returns zeros at once (no all-reduce, no gradient).

A GPT's pieces on a data x pipeline x tensor mesh, and context parallelism, on torch.distributed.

Everything here runs inside ranks that have already called ``init_process_group`` (gloo on
CPU is enough); importing the file starts nothing.

* The mesh: ``mesh_coords``, ``mesh_rank``, ``mesh_lines`` (pure functions) and ``Mesh`` (this
  rank's coordinates, its process group of each dimension, its pipeline neighbours).
* The vocabulary split across a tensor-parallel group: ``ReduceFromGroup``,
  ``VocabParallelEmbedding`` and ``VocabParallelCrossEntropy`` (``vocab_parallel_cross_entropy``).
* Context parallelism: ``merge_blocks``, ``balanced_positions`` and ``RingAttention``
  (``ring_attention``).

Given (do not change): ``DIMS``, ``check_sizes``, ``contiguous_runs``, ``block_forward``,
``block_backward``, the ``__init__`` methods and ``vocab_parallel_cross_entropy``.
"""
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# ------------------------------------------------------------------ the mesh
DIMS = ("dp", "pp", "tp")       # the order of the coordinates: tp varies fastest


def check_sizes(dp, pp, tp, world):
    """ValueError unless ``dp``, ``pp`` and ``tp`` are positive ints (a bool is not one) whose
    product is ``world``. Given."""
    for name, v in (("dp", dp), ("pp", pp), ("tp", tp)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if dp * pp * tp != world:
        raise ValueError(f"dp * pp * tp = {dp * pp * tp} is not the world size {world}")


def mesh_coords(rank, dp, pp, tp):
    """The coordinates ``(d, p, t)`` of global ``rank`` on the ``dp x pp x tp`` grid, ``tp``
    varying fastest: ``rank = (d * pp + p) * tp + t``.

    Returns a tuple of three ints; ValueError if ``rank`` is not in ``[0, dp * pp * tp)``
    (call ``check_sizes(dp, pp, tp, dp * pp * tp)`` for the sizes).
    """
    # YOUR CODE HERE
    raise NotImplementedError()


def mesh_lines(dim, dp, pp, tp):
    """Every group of dimension ``dim`` (``"dp"``, ``"pp"`` or ``"tp"``): the lists of global
    ranks that share the other two coordinates, each list ordered by the coordinate ``dim``,
    the lists in increasing order of their first rank.

    Example, ``dp = pp = tp = 2``: ``mesh_lines("tp", 2, 2, 2) == [[0, 1], [2, 3], [4, 5],
    [6, 7]]``, ``mesh_lines("dp", 2, 2, 2) == [[0, 4], [1, 5], [2, 6], [3, 7]]``.

    Returns a new list of lists of ints; ValueError for another ``dim`` or invalid sizes.
    """
    # YOUR CODE HERE
    raise NotImplementedError()


class Mesh:
    """This rank's place on a ``dp x pp x tp`` grid of the world, and its process groups.

    ``Mesh(dp, pp, tp)``: ``dp``, ``pp``, ``tp`` positive ints whose product is the world
    size (ValueError otherwise, before any group is made: call ``check_sizes``).

    Attributes:
        sizes: ``{"dp": dp, "pp": pp, "tp": tp}``.
        coords: this rank's coordinates, ``{"dp": d, "pp": p, "tp": t}``.
        ranks: ``{dim: the global ranks of this rank's group of dim}``, its line of
            ``mesh_lines(dim, ...)``.
        groups: ``{dim: the process group of those ranks}``, made by ``dist.new_group``.
        prev, next: the global rank of the previous and of the next pipeline stage (same ``d``
            and ``t``); None on the first and on the last stage.

    ``dist.new_group`` must be called by every rank of the world, in the same order, also for
    groups it is not in: every rank makes every group of every dimension, dimension by
    dimension in the order of ``DIMS``, each dimension's groups in the order of
    ``mesh_lines``, and keeps its own. Nothing else is made.
    """

    def __init__(self, dp, pp, tp):
        # YOUR CODE HERE
        raise NotImplementedError()


# ------------------------------------------------------------------ the vocabulary, split
class ReduceFromGroup(torch.autograd.Function):
    """Notebook 10's "g" over a process group: ``ReduceFromGroup.apply(x, group)`` returns a new
    tensor, the sum of ``x`` over the ranks of ``group`` (one ``dist.all_reduce`` on a copy:
    ``x`` itself is not modified); its backward returns the incoming gradient as it is (and
    None for ``group``)."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.new_empty(x.shape)
        out.copy_(x)
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class VocabParallelEmbedding(nn.Module):
    """An embedding table of ``V`` rows split by rows across the ranks of ``group`` (a
    tensor-parallel group of ``t`` ranks).

    With ``k = V // t``, group rank ``r`` (``dist.get_rank(group)``) holds rows ``[r*k,
    (r+1)*k)`` of the full table (``weight``: ``(k, d)``; ``start = r*k``). ``forward(tokens)``:
    ``tokens`` is an int64 tensor of any shape ``(...)`` of ids in ``[0, V)``, the same on every
    rank of the group; returns ``(..., d)``, the full table's embedding of every token, the same
    on every rank: each rank looks up the tokens in its rows (zeros for the others) and
    ``ReduceFromGroup`` sums them, one ``dist.all_reduce`` in the forward and none in the
    backward. Each rank's ``weight.grad`` is its rows of the full table's gradient.
    """

    def __init__(self, weight, start, group):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.start, self.group = start, group

    @classmethod
    def from_embedding(cls, emb, group):
        """This rank's shard of the ``nn.Embedding`` ``emb`` (a copy, of its dtype; the new
        weight requires grad; ``emb`` itself is left as it is).

        Raises:
            ValueError: ``emb.num_embeddings`` not divisible by the group's size.
        """
        size = dist.get_world_size(group=group)
        if emb.num_embeddings % size != 0:
            raise ValueError("the embedding's rows do not divide by the group's size")
        k = emb.num_embeddings // size
        start = dist.get_rank(group=group) * k
        rows = torch.arange(start, start + k)
        return cls(torch.index_select(emb.weight.detach(), 0, rows), start, group)

    def forward(self, tokens):
        k, d = self.weight.shape
        flat = tokens.reshape(-1)
        if flat.numel() == 0:       # no token: nothing to look up or to sum, no gradient
            return self.weight.new_zeros(tuple(tokens.shape) + (d,))
        mine = ((flat >= self.start) & (flat < self.start + k)).nonzero().squeeze(1)
        out = self.weight.new_zeros(flat.numel(), d)
        out = out.index_copy(0, mine, self.weight.index_select(0, flat[mine] - self.start))
        return ReduceFromGroup.apply(out.reshape(tuple(tokens.shape) + (d,)), self.group)


class VocabParallelCrossEntropy(torch.autograd.Function):
    """The mean cross-entropy of ``N`` rows over ``V = t * k`` classes whose logits are split
    by columns across the ``t`` ranks of ``group``.

    ``VocabParallelCrossEntropy.apply(logits, targets, group)``: ``logits`` ``(N, k)`` are this
    rank's columns ``[r*k, (r+1)*k)`` of the full ``(N, V)`` logits (float32 or float64; every
    rank's ``k`` the same); ``targets`` ``(N,)`` int64 class ids in ``[0, V)``, the same on every
    rank of the group. Returns a 0-dim tensor of the logits' dtype, the mean over the rows of
    ``-log softmax(full logits)[target]``, the same on every rank, and stable for logits of any
    size (subtract each row's maximum over all ``V`` columns before ``exp``). Neither input is
    modified.

    Communication: in the forward exactly three ``dist.all_reduce`` over ``group``, each of
    ``N`` numbers: the rows' maxima (``op=dist.ReduceOp.MAX``), the rows' sums of exponentials,
    and the target logits (each from the rank that holds the target's column, zero on the
    others). None in the backward, which returns ``logits.grad`` = this rank's columns of the
    full gradient, ``(softmax(full logits) - one_hot(targets)) / N`` times the incoming
    gradient (save what it needs in the forward). The full logits are never gathered.
    """

    @staticmethod
    def forward(ctx, logits, targets, group):
        dtype = logits.dtype
        z = logits.to(torch.float64)        # may be logits itself: never written to
        n, k = z.shape
        lo = dist.get_rank(group) * k
        m = z.max(dim=1).values
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        ez = torch.exp(z - m[:, None])
        s = ez.sum(dim=1)
        dist.all_reduce(s, group=group)
        hit = ((targets >= lo) & (targets < lo + k)).nonzero().squeeze(1)
        cols = targets[hit] - lo
        zt = torch.zeros(n, dtype=torch.float64)
        zt[hit] = z[hit, cols]
        dist.all_reduce(zt, group=group)
        ctx.save_for_backward(ez / s[:, None], hit, cols)
        ctx.dtype = dtype
        return (torch.log(s) + m - zt).mean().to(dtype)

    @staticmethod
    def backward(ctx, grad):
        p, hit, cols = ctx.saved_tensors
        g = p.clone()
        g[hit, cols] -= 1.0
        g = g * (grad.to(torch.float64) / g.shape[0])
        return g.to(ctx.dtype), None, None


def vocab_parallel_cross_entropy(logits, targets, group):
    """``VocabParallelCrossEntropy.apply(logits, targets, group)`` after checking the shapes:
    ValueError unless ``logits`` is 2-D with at least one row and ``targets`` is ``(N,)``.
    Given."""
    if logits.dim() != 2 or logits.shape[0] < 1 or tuple(targets.shape) != (logits.shape[0],):
        raise ValueError(f"need logits (N, V/t) with N >= 1 and targets (N,); got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    return VocabParallelCrossEntropy.apply(logits, targets, group)


# ------------------------------------------------------------------ context parallelism
NEG_INF = float("-inf")


def contiguous_runs(pos):
    """The slices of the 1-D tensor ``pos`` that are maximal runs of consecutive positions:
    ``contiguous_runs(torch.tensor([0, 1, 2, 7, 8])) == [slice(0, 3), slice(3, 5)]``. Given."""
    pos = pos.tolist()
    runs, start = [], 0
    for i in range(1, len(pos) + 1):
        if i == len(pos) or pos[i] != pos[i - 1] + 1:
            runs.append(slice(start, i))
            start = i
    return runs


def _finite(lse):
    """``lse`` with -inf replaced by 0, so that ``exp(x - lse)`` is 0, not NaN, at x = -inf."""
    return lse.masked_fill(lse == NEG_INF, 0.0)


def block_forward(q, k, v, mask=None):
    """Attention of the queries ``q`` ``(B, H, Lq, hd)`` over one block of keys and values ``k``,
    ``v`` ``(B, H, Lk, hd)``, scores scaled by ``1/sqrt(hd)``; ``mask`` ``(Lq, Lk)`` bool, True
    where a query may see a key (None: every key). Returns ``(out, lse)``: ``out`` ``(B, H, Lq,
    hd)`` and ``lse`` ``(B, H, Lq)``, the log-sum-exp of each query's visible scores; a query
    that sees no key gets ``lse = -inf`` and ``out = 0``. Given."""
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, NEG_INF)
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - _finite(lse).unsqueeze(-1)) @ v, lse


def block_backward(q, k, v, out, lse, dout, mask=None):
    """One key block's share ``(dq, dk, dv)`` of attention's gradient, given the FINAL output
    ``out`` and log-sum-exp ``lse`` of the queries (merged over every key block) and the
    gradient ``dout`` of ``out`` (flash attention's backward: ``P = exp(scores - lse)`` is this
    block's columns of the whole softmax). Queries with ``lse = -inf`` contribute 0. Given."""
    scale = q.shape[-1] ** -0.5
    scores = (q @ k.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, NEG_INF)
    p = torch.exp(scores - _finite(lse).unsqueeze(-1))
    p = p.masked_fill((lse == NEG_INF).unsqueeze(-1), 0.0)
    ds = p * (dout @ v.transpose(-1, -2) - (dout * out).sum(-1, keepdim=True))
    return (ds @ k) * scale, (ds.transpose(-1, -2) @ q) * scale, p.transpose(-1, -2) @ dout


def ring_peers(group):
    """``(me, c, nxt, prv)``: this rank's rank in ``group`` (None: the world), the group's size,
    and the GLOBAL ranks of the next (group rank ``me + 1 mod c``) and previous (``me - 1 mod
    c``) ranks of the ring. Given."""
    group = dist.group.WORLD if group is None else group
    me, c = dist.get_rank(group), dist.get_world_size(group)
    return (me, c, dist.get_global_rank(group, (me + 1) % c),
            dist.get_global_rank(group, (me - 1) % c))


def merge_blocks(out, lse, out_b, lse_b):
    """The online-softmax merge of two partial attentions of the same queries over disjoint
    sets of keys: ``out``, ``out_b`` ``(..., L, hd)``, ``lse``, ``lse_b`` ``(..., L)`` (as
    ``block_forward`` returns them).

    Returns new tensors ``(out, lse)``, the attention over the union of the two key sets:
    ``lse = log(exp(lse) + exp(lse_b))``, and each side's output weighted by ``exp(its lse -
    lse)``. A side with ``lse = -inf`` (no visible key) weighs 0; both at -inf give ``lse =
    -inf`` and ``out = 0``. Never NaN; the inputs are not modified.
    """
    # YOUR CODE HERE
    raise NotImplementedError()


def balanced_positions(S, c):
    """The load-balanced causal split of a sequence of ``S`` tokens over ``c`` ranks: cut
    ``torch.arange(S)`` into ``2c`` chunks with ``torch.tensor_split`` (sizes differing by at
    most one); rank ``r`` holds chunk ``r`` then chunk ``2c - 1 - r``.

    Returns a new list of ``c`` 1-D int64 tensors (rank ``r``'s positions, in that order).
    Raises ValueError unless ``S`` and ``c`` are ints (a bool is not one) with ``c >= 1`` and
    ``S >= 2c``.
    """
    # YOUR CODE HERE
    raise NotImplementedError()


def block_pairs(q_pos, k_pos, causal):
    """The block products attention needs between queries at positions ``q_pos`` and a block of
    keys at ``k_pos`` (1-D int64 tensors): a list of ``(query slice, key slice, mask)``.

    Not causal: one product of the whole blocks, ``[(slice(None), slice(None), None)]``.
    Causal (a query at position p sees the keys at positions <= p): one product per pair of a
    query run and a key run of ``contiguous_runs`` (query runs in order, and for each the key
    runs in order), leaving out every pair in which no query sees any key; ``mask`` is None
    where every query of the pair sees every key, else the ``(Lq, Lk)`` bool tensor
    ``q_pos[qs, None] >= k_pos[None, ks]``.
    """
    # YOUR CODE HERE
    raise NotImplementedError()


class RingAttention(torch.autograd.Function):
    """Attention over the whole sequence for this rank's tokens, the keys and values passed
    around the ring of ``group``'s ``c`` ranks.

    ``RingAttention.apply(q, k, v, positions, group, causal)``: ``q``, ``k``, ``v`` ``(B, H, L,
    hd)`` are this rank's tokens, in the order of ``positions[me]``; ``positions`` is a list of
    ``c`` 1-D int64 tensors, the global positions of the tokens each group rank holds (their
    lengths may differ); ``group`` a process group (None: the world); ``causal`` a bool.
    Returns ``out`` ``(B, H, L, hd)``, what attention over all the ``S`` tokens gives this
    rank's queries; its backward returns the gradients of ``q``, ``k`` and ``v`` (None for the
    other three).

    Forward: at step ``i = 0 .. c-1`` the rank holds the keys and values of group rank ``(me -
    i) mod c`` (at step 0 its own). Before computing with the held block it starts passing it
    on: ``dist.isend`` to the next rank and ``dist.irecv`` of the following block from the
    previous one (``ring_peers``), waited on after the compute. Every pair of ``block_pairs``
    is computed with ``block_forward`` and merged with ``merge_blocks``.

    Backward: the queries' gradient stays home; each block of keys and values travels the ring
    again with the gradient of its keys and values, to which every rank adds its share
    (``block_backward``, the same pairs); after ``c`` steps each block's gradient is back on its
    own rank.

    Only ``dist.isend`` / ``dist.irecv`` (or ``send`` / ``recv``) with the two ring neighbours,
    no collective; per message at most one block's keys and values (and, in the backward,
    their gradients). What the forward keeps for the backward is this rank's own ``q``, ``k``,
    ``v``, ``out`` and the log-sum-exp, never a block received from another rank: a rank holds
    ``1/c`` of the keys and values.
    """

    @staticmethod
    def forward(ctx, q, k, v, positions, group, causal):
        # YOUR CODE HERE
        raise NotImplementedError()

    @staticmethod
    def backward(ctx, dout):
        # YOUR CODE HERE
        raise NotImplementedError()


def ring_attention(q, k, v, positions, group=None, causal=False):
    """``RingAttention.apply(q, k, v, positions, group, causal)`` after checking the arguments:
    ValueError unless ``positions`` has one tensor per rank of the group and this rank's
    matches ``q``'s length. Given."""
    me, c, _, _ = ring_peers(group)
    if len(positions) != c or len(positions[me]) != q.shape[-2]:
        raise ValueError(f"positions must hold {c} tensors, positions[{me}] of length "
                         f"{q.shape[-2]}")
    return RingAttention.apply(q, k, v, positions, group, causal)
