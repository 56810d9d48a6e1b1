"""Cheat (notebook 11, composed_step): f's backward (``CopyToGroup``) sums the gradient through
the process group object (``ctx.group.allreduce``), below the functions the check records, and
makes a decoy ``dist.all_reduce`` of zeros of the same size over the same group, so that the
recorded calls are exactly a right step's. The values would pass; the check must call it an
integrity violation.
"""
# ---- part 1/5 of this file: from the notebook's cell `%%part work/11_composed.py 1/5`
"""A GPT's pieces on a data x pipeline x tensor mesh, and context parallelism, on torch.distributed.

Everything here runs inside ranks that have already called ``init_process_group`` (gloo on
CPU is enough); importing the file starts nothing.

* The mesh: ``mesh_coords`` and ``mesh_lines`` (pure functions) and ``Mesh`` (this
  rank's coordinates, its process group of each dimension, its pipeline neighbours).
* The vocabulary split across a tensor-parallel group: ``ReduceFromGroup``,
  ``VocabParallelEmbedding`` and ``VocabParallelCrossEntropy`` (``vocab_parallel_cross_entropy``).
* Context parallelism: ``merge_blocks``, ``balanced_positions``, ``block_pairs`` and
  ``RingAttention`` (``ring_attention``).
* Sequence parallelism: ``GatherFromSequence``, ``ReduceScatterToSequence``,
  ``SequenceParallelNormMLP.forward`` and ``sequence_parallel_grads``.
* One training step of a small GPT on the mesh: ``CopyToGroup``,
  ``TensorParallelBlock.forward``, ``GPTStage.forward`` and ``composed_step``.

Given (do not change): ``DIMS``, ``check_sizes``, ``contiguous_runs``, ``block_forward``,
``block_backward``, ``ring_peers``, ``ring_attention``, ``vocab_parallel_cross_entropy``,
``NormMLP``, ``SequenceParallelNormMLP.from_block``, ``heads_attention``, ``Block``,
``GPT``, ``TensorParallelBlock.from_block``, ``stage_layers``, ``GPTStage.from_model`` and the
``__init__`` methods.
"""

import copy

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
    check_sizes(dp, pp, tp, dp * pp * tp)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < dp * pp * tp:
        raise ValueError(f"rank {rank!r} is not in [0, {dp * pp * tp})")
    return rank // (pp * tp), rank // tp % pp, rank % tp


def mesh_lines(dim, dp, pp, tp):
    """Every group of dimension ``dim`` (``"dp"``, ``"pp"`` or ``"tp"``): the lists of global
    ranks that share the other two coordinates, each list ordered by the coordinate ``dim``,
    the lists in increasing order of their first rank.

    Example, ``dp = pp = tp = 2``: ``mesh_lines("tp", 2, 2, 2) == [[0, 1], [2, 3], [4, 5],
    [6, 7]]``, ``mesh_lines("dp", 2, 2, 2) == [[0, 4], [1, 5], [2, 6], [3, 7]]``.

    Returns a new list of lists of ints; ValueError for another ``dim`` or invalid sizes.
    """
    check_sizes(dp, pp, tp, dp * pp * tp)
    if dim not in DIMS:
        raise ValueError(f"dim must be one of {DIMS}, got {dim!r}")
    sizes = dict(zip(DIMS, (dp, pp, tp)))
    lines = {}
    for rank in range(dp * pp * tp):
        coords = dict(zip(DIMS, mesh_coords(rank, dp, pp, tp)))
        key = tuple(coords[k] for k in DIMS if k != dim)
        lines.setdefault(key, [None] * sizes[dim])[coords[dim]] = rank
    return sorted(lines.values())


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
        rank = dist.get_rank()
        check_sizes(dp, pp, tp, dist.get_world_size())
        self.sizes = dict(zip(DIMS, (dp, pp, tp)))
        self.coords = dict(zip(DIMS, mesh_coords(rank, dp, pp, tp)))
        self.ranks, self.groups = {}, {}
        for dim in DIMS:
            for line in mesh_lines(dim, dp, pp, tp):
                group = dist.new_group(line)
                if rank in line:
                    self.ranks[dim], self.groups[dim] = line, group
        stages, p = self.ranks["pp"], self.coords["pp"]
        self.prev = stages[p - 1] if p > 0 else None
        self.next = stages[p + 1] if p + 1 < pp else None


# ---- part 2/5 of this file: from the notebook's cell `%%part work/11_composed.py 2/5`
# ------------------------------------------------------------------ the vocabulary, split
class ReduceFromGroup(torch.autograd.Function):
    """Notebook 10's "g" over a process group: ``ReduceFromGroup.apply(x, group)`` returns a new
    tensor, the sum of ``x`` over the ranks of ``group`` (one ``dist.all_reduce`` on a copy:
    ``x`` itself is not modified); its backward returns the incoming gradient as it is (and
    None for ``group``)."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.clone(memory_format=torch.contiguous_format)
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
        r, t = dist.get_rank(group), dist.get_world_size(group)
        if emb.num_embeddings % t:
            raise ValueError(f"num_embeddings={emb.num_embeddings} is not divisible by {t} ranks")
        k = emb.num_embeddings // t
        return cls(emb.weight.detach()[r * k:(r + 1) * k].clone(), r * k, group)

    def forward(self, tokens):
        local = tokens - self.start
        mine = (local >= 0) & (local < self.weight.shape[0])
        out = F.embedding(torch.where(mine, local, 0), self.weight) * mine.unsqueeze(-1)
        return ReduceFromGroup.apply(out, self.group)


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
        n, k = logits.shape
        start = dist.get_rank(group) * k
        row_max = logits.detach().max(dim=1).values
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
        exp = (logits.detach() - row_max.unsqueeze(1)).exp()
        sum_exp = exp.sum(dim=1)
        dist.all_reduce(sum_exp, group=group)
        local = targets - start
        mine = (local >= 0) & (local < k)
        index = torch.where(mine, local, 0).unsqueeze(1)
        target_logit = logits.detach().gather(1, index).squeeze(1) * mine
        dist.all_reduce(target_logit, group=group)
        loss = (sum_exp.log() + row_max - target_logit).mean()
        ctx.save_for_backward(exp / sum_exp.unsqueeze(1), index, mine)
        return loss

    @staticmethod
    def backward(ctx, grad):
        softmax, index, mine = ctx.saved_tensors
        g = softmax.clone()
        g.scatter_add_(1, index, -mine.to(g.dtype).unsqueeze(1))
        return g * (grad / softmax.shape[0]), None, None


def vocab_parallel_cross_entropy(logits, targets, group):
    """``VocabParallelCrossEntropy.apply(logits, targets, group)`` after checking the shapes:
    ValueError unless ``logits`` is 2-D with at least one row and ``targets`` is ``(N,)``.
    Given."""
    if logits.dim() != 2 or logits.shape[0] < 1 or tuple(targets.shape) != (logits.shape[0],):
        raise ValueError(f"need logits (N, V/t) with N >= 1 and targets (N,); got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    return VocabParallelCrossEntropy.apply(logits, targets, group)


# ---- part 3/5 of this file: from the notebook's cell `%%part work/11_composed.py 3/5`
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
    new = torch.logaddexp(lse, lse_b)
    ref = _finite(new)
    w, w_b = torch.exp(lse - ref), torch.exp(lse_b - ref)
    return out * w.unsqueeze(-1) + out_b * w_b.unsqueeze(-1), new


def balanced_positions(S, c):
    """The load-balanced causal split of a sequence of ``S`` tokens over ``c`` ranks: cut
    ``torch.arange(S)`` into ``2c`` chunks with ``torch.tensor_split`` (sizes differing by at
    most one); rank ``r`` holds chunk ``r`` then chunk ``2c - 1 - r``.

    Returns a new list of ``c`` 1-D int64 tensors (rank ``r``'s positions, in that order).
    Raises ValueError unless ``S`` and ``c`` are ints (a bool is not one) with ``c >= 1`` and
    ``S >= 2c``.
    """
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (S, c)):
        raise ValueError(f"S and c must be ints, got {S!r} and {c!r}")
    if c < 1 or S < 2 * c:
        raise ValueError(f"need c >= 1 and S >= 2c, got S={S}, c={c}")
    chunks = torch.arange(S).tensor_split(2 * c)
    return [torch.cat([chunks[r], chunks[2 * c - 1 - r]]) for r in range(c)]


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
    if not causal:
        return [(slice(None), slice(None), None)]
    pairs = []
    for qs in contiguous_runs(q_pos):
        q_first, q_last = int(q_pos[qs.start]), int(q_pos[qs.stop - 1])
        for ks in contiguous_runs(k_pos):
            k_first, k_last = int(k_pos[ks.start]), int(k_pos[ks.stop - 1])
            if q_last < k_first:
                continue
            mask = None if q_first >= k_last else q_pos[qs, None] >= k_pos[None, ks]
            pairs.append((qs, ks, mask))
    return pairs


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
        me, c, nxt, prv = ring_peers(group)
        B, H, _, hd = q.shape
        q_pos = positions[me]
        out = torch.zeros_like(q)
        lse = q.new_full(q.shape[:-1], NEG_INF)
        held = torch.cat([k, v], dim=-1)
        for step in range(c):
            src = (me - step) % c
            if step < c - 1:
                buf = q.new_empty(B, H, len(positions[(src - 1) % c]), 2 * hd)
                reqs = [dist.isend(held, nxt), dist.irecv(buf, prv)]
            for qs, ks, mask in block_pairs(q_pos, positions[src], causal):
                out_b, lse_b = block_forward(q[:, :, qs], held[:, :, ks, :hd],
                                             held[:, :, ks, hd:], mask)
                out[:, :, qs], lse[:, :, qs] = merge_blocks(out[:, :, qs], lse[:, :, qs],
                                                            out_b, lse_b)
            if step < c - 1:
                for req in reqs:
                    req.wait()
                held = buf
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.positions, ctx.group, ctx.causal = positions, group, causal
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        positions, group, causal = ctx.positions, ctx.group, ctx.causal
        me, c, nxt, prv = ring_peers(group)
        B, H, _, hd = q.shape
        q_pos = positions[me]
        dq = torch.zeros_like(q)
        held = torch.cat([k, v, torch.zeros_like(k), torch.zeros_like(v)], dim=-1)
        for step in range(c):
            src = (me - step) % c
            if c > 1:
                buf = q.new_empty(B, H, len(positions[(src - 1) % c]), 4 * hd)
                recv = dist.irecv(buf, prv)
            for qs, ks, mask in block_pairs(q_pos, positions[src], causal):
                dq_b, dk_b, dv_b = block_backward(
                    q[:, :, qs], held[:, :, ks, :hd], held[:, :, ks, hd:2 * hd],
                    out[:, :, qs], lse[:, :, qs], dout[:, :, qs], mask)
                dq[:, :, qs] += dq_b
                held[:, :, ks, 2 * hd:3 * hd] += dk_b
                held[:, :, ks, 3 * hd:] += dv_b
            if c > 1:
                send = dist.isend(held, nxt)
                recv.wait()
                send.wait()
                held = buf
        return dq, held[..., 2 * hd:3 * hd], held[..., 3 * hd:], None, None, None


def ring_attention(q, k, v, positions, group=None, causal=False):
    """``RingAttention.apply(q, k, v, positions, group, causal)`` after checking the arguments:
    ValueError unless ``positions`` has one tensor per rank of the group and this rank's
    matches ``q``'s length. Given."""
    me, c, _, _ = ring_peers(group)
    if len(positions) != c or len(positions[me]) != q.shape[-2]:
        raise ValueError(f"positions must hold {c} tensors, positions[{me}] of length "
                         f"{q.shape[-2]}")
    return RingAttention.apply(q, k, v, positions, group, causal)


# ---- part 4/5 of this file: from the notebook's cell `%%part work/11_composed.py 4/5`
# ------------------------------------------------------------------ sequence parallelism
class NormMLP(nn.Module):
    """A transformer's MLP sub-block, residual included: ``x + fc2(act(fc1(norm(x))))``, norm =
    LayerNorm(d), fc1 = Linear(d, h), act = GELU, fc2 = Linear(h, d). Activations are
    sequence-first, ``(S, B, d)``. Given."""

    def __init__(self, d_model, d_hidden):
        super().__init__()
        self.norm, self.act = nn.LayerNorm(d_model), nn.GELU()
        self.fc1, self.fc2 = nn.Linear(d_model, d_hidden), nn.Linear(d_hidden, d_model)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class GatherFromSequence(torch.autograd.Function):
    """Entering the tensor-parallel region: ``GatherFromSequence.apply(x, group)``, ``x`` this
    rank's rows ``(S/t, ...)`` of a sequence-first activation, returns the whole ``(S, ...)``
    on every rank of ``group``, the ranks' rows in group-rank order (one
    ``dist.all_gather_into_tensor``). Backward: every rank holds a gradient of the whole
    sequence (its part of the work); the gradient of ``x`` is the sum of the ranks' gradients,
    rows of this rank only (one ``dist.reduce_scatter_tensor``). None for ``group``."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        t = dist.get_world_size(group)
        out = x.new_empty((t * x.shape[0],) + tuple(x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        t = dist.get_world_size(ctx.group)
        out = grad.new_empty((grad.shape[0] // t,) + tuple(grad.shape[1:]))
        dist.reduce_scatter_tensor(out, grad.contiguous(), group=ctx.group)
        return out, None


class ReduceScatterToSequence(torch.autograd.Function):
    """Leaving the tensor-parallel region: ``ReduceScatterToSequence.apply(x, group)``, ``x`` a
    partial sum ``(S, ...)`` of the whole sequence on every rank of ``group``, returns this
    rank's rows ``(S/t, ...)`` of the sum over the ranks (one ``dist.reduce_scatter_tensor``).
    Backward: the gradient of this rank's rows, gathered from every rank (one
    ``dist.all_gather_into_tensor``). None for ``group``."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        t = dist.get_world_size(group)
        out = x.new_empty((x.shape[0] // t,) + tuple(x.shape[1:]))
        dist.reduce_scatter_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        t = dist.get_world_size(ctx.group)
        out = grad.new_empty((t * grad.shape[0],) + tuple(grad.shape[1:]))
        dist.all_gather_into_tensor(out, grad.contiguous(), group=ctx.group)
        return out, None


class SequenceParallelNormMLP(nn.Module):
    """``NormMLP`` with tensor and sequence parallelism over the ``t`` ranks of ``group``.

    Group rank ``r`` holds rows ``[r*k, (r+1)*k)`` of fc1 (``w1``, ``b1``; ``k = h/t``),
    columns ``[r*k, (r+1)*k)`` of fc2 (``w2``), and whole copies of the norm and of fc2's bias
    (``b2``). ``forward(x)``: ``x`` is this rank's rows ``(S/t, B, d)`` of the sequence (rank
    ``r``: rows ``[r*S/t, (r+1)*S/t)``); returns the same rows of the block's output. The norm,
    the residual and ``b2`` run on the rank's ``S/t`` rows only; ``GatherFromSequence`` brings
    the whole normalised sequence into fc1, ``ReduceScatterToSequence`` sums fc2's partial
    outputs and keeps the rank's rows; ``b2`` is added once, after it. One all-gather and one
    reduce-scatter in the forward, one of each in the backward, no all-reduce.

    The parameters every rank holds whole (``replicated``: the norm's weight and bias, ``b2``)
    get from each rank the gradient of its rows only: ``sequence_parallel_grads`` sums them.
    """

    def __init__(self, norm, w1, b1, act, w2, b2, group):
        super().__init__()
        self.norm, self.act, self.group = norm, act, group
        self.w1, self.b1 = nn.Parameter(w1), nn.Parameter(b1)
        self.w2, self.b2 = nn.Parameter(w2), nn.Parameter(b2)
        self.replicated = [self.norm.weight, self.norm.bias, self.b2]

    @classmethod
    def from_block(cls, block, group):
        """This rank's shard of the ``NormMLP`` ``block`` (copies). Given."""
        r, t = dist.get_rank(group), dist.get_world_size(group)
        k = block.fc1.out_features // t
        rows = slice(r * k, (r + 1) * k)
        return cls(copy.deepcopy(block.norm), block.fc1.weight.detach()[rows].clone(),
                   block.fc1.bias.detach()[rows].clone(), copy.deepcopy(block.act),
                   block.fc2.weight.detach()[:, rows].clone(), block.fc2.bias.detach().clone(),
                   group)

    def forward(self, x):
        h = GatherFromSequence.apply(self.norm(x), self.group)
        h = self.act(F.linear(h, self.w1, self.b1))
        return x + ReduceScatterToSequence.apply(F.linear(h, self.w2), self.group) + self.b2


def sequence_parallel_grads(module):
    """Sum, over ``module.group``, the gradient of every parameter in ``module.replicated``
    (with ``dist.all_reduce``: one per parameter, or one of them flattened together), so that
    every rank holds the whole sequence's gradient of each. Call it after the backward, before
    the optimizer step. Returns None."""
    for p in module.replicated:
        dist.all_reduce(p.grad, group=module.group)


# ---- part 5/5 of this file: from the notebook's cell `%%part work/11_composed.py 5/5`
# ------------------------------------------------------------------ the composed step
def heads_attention(h, w_qkv, b_qkv, n_heads):
    """Causal self-attention of ``h`` ``(B, S, d_in)`` for ``n_heads`` heads whose query, key
    and value projections are the rows of ``w_qkv`` ``(3 * n_heads * hd, d_in)`` and ``b_qkv``:
    the queries' rows first, then the keys', then the values'. Returns ``(B, S, n_heads *
    hd)``: the heads' outputs side by side, before the output projection. Given."""
    B, S, _ = h.shape
    q, k, v = F.linear(h, w_qkv, b_qkv).chunk(3, dim=-1)
    q, k, v = (z.reshape(B, S, n_heads, -1).transpose(1, 2) for z in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(B, S, -1)


class Block(nn.Module):
    """A GPT block, batch-first ``(B, S, d)``: ``x + proj(attention(ln1(x)))``, then ``x +
    fc2(gelu(fc1(ln2(x))))``; ``qkv`` = Linear(d, 3d), ``proj`` = Linear(d, d), ``fc1`` =
    Linear(d, h), ``fc2`` = Linear(h, d). Given."""

    def __init__(self, d_model, n_heads, d_hidden):
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.fc1, self.fc2 = nn.Linear(d_model, d_hidden), nn.Linear(d_hidden, d_model)

    def forward(self, x):
        x = x + self.proj(heads_attention(self.ln1(x), self.qkv.weight, self.qkv.bias,
                                          self.n_heads))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    """A small GPT in one process: token and position embeddings, ``n_layers`` blocks, a final
    LayerNorm and a head ``Linear(d, V, bias=False)``. ``forward(tokens)``: ``(B, S)`` int64 ids
    -> logits ``(B, S, V)``; ``loss(tokens, targets)``: the mean cross-entropy over the ``B *
    S`` tokens. Given."""

    def __init__(self, vocab, d_model, n_heads, d_hidden, n_layers, seq_len):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_hidden) for _ in range(n_layers))
        self.norm, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def loss(self, tokens, targets):
        return F.cross_entropy(self(tokens).flatten(0, 1), targets.flatten())


class CopyToGroup(torch.autograd.Function):
    """Notebook 10's "f" over a process group: ``CopyToGroup.apply(x, group)`` returns ``x``'s
    values (a new tensor or a view; ``x`` is not modified) in the forward; its backward returns
    the sum over the ranks of ``group`` of their incoming gradients (one ``dist.all_reduce``,
    on a copy: the incoming gradient is not modified), and None for ``group``."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone(memory_format=torch.contiguous_format)
        ctx.group.allreduce([grad]).wait()                       # the real sum, unrecorded
        dist.all_reduce(torch.zeros_like(grad), group=ctx.group)  # a decoy of the same size
        return grad, None


class TensorParallelBlock(nn.Module):
    """``Block`` split across the ``t`` ranks of ``group`` (Megatron): group rank ``r`` holds
    heads ``[r*n, (r+1)*n)`` (``n = n_heads / t``): their rows of the query, key and value
    projections (``w_qkv``, ``b_qkv``: queries', keys', values' rows in that order) and their
    columns of ``proj`` (``w_proj``); rows ``[r*k, (r+1)*k)`` of fc1 (``w1``, ``b1``; ``k =
    h/t``) and those columns of fc2 (``w2``); whole copies of ``ln1``, ``ln2`` and of the biases
    added after a sum (``b_proj``, ``b2``).

    ``forward(x)``: ``x`` ``(B, S, d)`` the same on every rank of the group; returns the block's
    output, the same on every rank. Each half: the norm, ``CopyToGroup`` into the rank's heads
    (or fc1 rows), ``ReduceFromGroup`` of the partial output projection (or fc2), then the bias
    once and the residual: one all-reduce per half in the forward, one per half in the backward.
    Every parameter's gradient is its part of the block's gradient (the whole copies' the same on
    every rank: they see the same activations)."""

    def __init__(self, ln1, w_qkv, b_qkv, w_proj, b_proj, ln2, w1, b1, w2, b2, n_heads, group):
        super().__init__()
        self.ln1, self.ln2, self.n_heads, self.group = ln1, ln2, n_heads, group
        self.w_qkv, self.b_qkv = nn.Parameter(w_qkv), nn.Parameter(b_qkv)
        self.w_proj, self.b_proj = nn.Parameter(w_proj), nn.Parameter(b_proj)
        self.w1, self.b1 = nn.Parameter(w1), nn.Parameter(b1)
        self.w2, self.b2 = nn.Parameter(w2), nn.Parameter(b2)

    @classmethod
    def from_block(cls, block, group):
        """This rank's shard of ``block`` (copies); ValueError unless the group's size divides
        the heads and fc1's width. Given."""
        r, t = dist.get_rank(group), dist.get_world_size(group)
        d, h = block.qkv.in_features, block.fc1.out_features
        if block.n_heads % t or h % t:
            raise ValueError(f"{t} ranks do not divide {block.n_heads} heads and width {h}")
        n, k = block.n_heads // t, h // t
        mine = slice(r * n * (d // block.n_heads), (r + 1) * n * (d // block.n_heads))
        w, b = block.qkv.weight.detach(), block.qkv.bias.detach()
        w_qkv = torch.cat([w[i * d:(i + 1) * d][mine] for i in range(3)]).clone()
        b_qkv = torch.cat([b[i * d:(i + 1) * d][mine] for i in range(3)]).clone()
        rows = slice(r * k, (r + 1) * k)
        return cls(copy.deepcopy(block.ln1), w_qkv, b_qkv,
                   block.proj.weight.detach()[:, mine].clone(), block.proj.bias.detach().clone(),
                   copy.deepcopy(block.ln2), block.fc1.weight.detach()[rows].clone(),
                   block.fc1.bias.detach()[rows].clone(), block.fc2.weight.detach()[:, rows].clone(),
                   block.fc2.bias.detach().clone(), n, group)

    def forward(self, x):
        h = CopyToGroup.apply(self.ln1(x), self.group)
        a = F.linear(heads_attention(h, self.w_qkv, self.b_qkv, self.n_heads), self.w_proj)
        x = x + ReduceFromGroup.apply(a, self.group) + self.b_proj
        h = CopyToGroup.apply(self.ln2(x), self.group)
        m = F.linear(F.gelu(F.linear(h, self.w1, self.b1)), self.w2)
        return x + ReduceFromGroup.apply(m, self.group) + self.b2


def stage_layers(n_layers, pp, p):
    """The blocks of pipeline stage ``p`` of ``pp``: ``torch.tensor_split`` of ``range(n_layers)``
    into ``pp`` runs (sizes differing by at most one, the longer first). Given."""
    if n_layers < pp:
        raise ValueError(f"{n_layers} blocks cannot fill {pp} pipeline stages")
    return torch.arange(n_layers).tensor_split(pp)[p].tolist()


class GPTStage(nn.Module):
    """This rank's part of a ``GPT`` on a ``Mesh``: pipeline stage ``p`` (``mesh.coords["pp"]``)
    holds the blocks ``stage_layers(n_layers, pp, p)`` as ``TensorParallelBlock`` over the
    mesh's tensor-parallel group; the first stage also the token embedding as a
    ``VocabParallelEmbedding`` and the position embedding whole (``tok``, ``pos``; None
    elsewhere); the last stage also the final norm whole and its rows ``[r*V/t, (r+1)*V/t)`` of
    the head's weight (``norm``, ``head``; None elsewhere).

    ``forward(x)``: on the first stage ``x`` is the tokens ``(b, S)`` (embedded: token plus
    position), elsewhere the previous stage's output ``(b, S, d)``; then the stage's blocks; the
    last stage returns its columns of the logits, ``(b, S, V/t)`` (the norm, ``CopyToGroup``,
    the head's rows: the head is column-parallel, so its input's gradient is a sum over the
    group), the other stages the activation ``(b, S, d)``."""

    def __init__(self, tok, pos, blocks, norm, head, group, first_layer, d_model):
        super().__init__()
        self.tok, self.pos, self.blocks, self.norm = tok, pos, blocks, norm
        self.head = None if head is None else nn.Parameter(head)
        self.group, self.first_layer, self.d_model = group, first_layer, d_model

    @classmethod
    def from_model(cls, model, mesh):
        """This rank's stage of ``model`` (copies; ``model`` is left as it is). Given."""
        group, p, pp = mesh.groups["tp"], mesh.coords["pp"], mesh.sizes["pp"]
        layers = stage_layers(len(model.blocks), pp, p)
        first, last = p == 0, p == pp - 1
        t, r = dist.get_world_size(group), dist.get_rank(group)
        V, d = model.head.weight.shape
        if V % t:
            raise ValueError(f"{t} ranks do not divide the vocabulary of {V}")
        k = V // t
        return cls(VocabParallelEmbedding.from_embedding(model.tok, group) if first else None,
                   copy.deepcopy(model.pos) if first else None,
                   nn.ModuleList(TensorParallelBlock.from_block(model.blocks[i], group)
                                 for i in layers),
                   copy.deepcopy(model.norm) if last else None,
                   model.head.weight.detach()[r * k:(r + 1) * k].clone() if last else None,
                   group, layers[0], d)

    def forward(self, x):
        if self.tok is not None:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            x = F.linear(CopyToGroup.apply(self.norm(x), self.group), self.head)
        return x


def composed_step(stage, tokens, targets, mesh):
    """One training step's forward and backward of the GPT on ``mesh`` (no optimizer step):
    data parallel over ``mesh.groups["dp"]``, pipeline over the stages, tensor parallel inside
    each stage.

    Args:
        stage: this rank's ``GPTStage``; its parameters' ``.grad`` are None when called.
        tokens, targets: ``(B, S)`` int64, the whole batch, the same on every rank (not
            modified); ``dp`` divides ``B``. Replica ``d`` (``mesh.coords["dp"]``) takes rows ``[d*B/dp,
            (d+1)*B/dp)``.
        mesh: this rank's ``Mesh`` (part 1).

    The pipeline, one micro-batch: a stage that is not the first receives its input ``(B/dp,
    S, d)`` (of the stage's parameters' dtype) from ``mesh.prev`` (``dist.recv``, or any other
    point-to-point form); a stage that is not the last sends its output to ``mesh.next`` and
    receives the output's gradient back from it; the last stage computes the loss of its replica's rows with
    ``vocab_parallel_cross_entropy`` over the tensor-parallel group and calls backward; every
    stage but the first then sends its input's gradient to ``mesh.prev``. Then every parameter's
    gradient is averaged over the data-parallel group (``dist.all_reduce`` over
    ``mesh.groups["dp"]``, divided by ``dp``).

    Returns the whole batch's mean loss as a Python float, the same on every rank (averaged over
    the data-parallel group, then brought from the last stage to the others over
    ``mesh.groups["pp"]``, e.g. with ``dist.broadcast``). After it every parameter's ``.grad`` is its part of the gradient of
    that loss, the same on every data-parallel replica.

    Messages only to and from the pipeline neighbours (``mesh.prev``, ``mesh.next``); every
    collective over one of the mesh's groups.
    """
    d, dp = mesh.coords["dp"], mesh.sizes["dp"]
    b = tokens.shape[0] // dp
    tokens, targets = tokens[d * b:(d + 1) * b], targets[d * b:(d + 1) * b]
    dtype = next(stage.parameters()).dtype
    if mesh.prev is None:
        x = tokens
    else:
        x = torch.empty(b, tokens.shape[1], stage.d_model, dtype=dtype)
        dist.recv(x, mesh.prev)
        x.requires_grad_(True)
    y = stage(x)
    if mesh.next is None:
        loss = vocab_parallel_cross_entropy(y.flatten(0, 1), targets.flatten(), mesh.groups["tp"])
        loss.backward()
        value = loss.detach().reshape(1).to(torch.float64)
    else:
        dist.send(y.detach().contiguous(), mesh.next)
        grad = torch.empty_like(y)
        dist.recv(grad, mesh.next)
        y.backward(grad)
        value = torch.zeros(1, dtype=torch.float64)
    if mesh.prev is not None:
        dist.send(x.grad, mesh.prev)
    for p in stage.parameters():
        dist.all_reduce(p.grad, group=mesh.groups["dp"])
        p.grad /= dp
    dist.all_reduce(value, group=mesh.groups["dp"])
    dist.broadcast(value, src=mesh.ranks["pp"][-1], group=mesh.groups["pp"])
    return float(value) / dp
