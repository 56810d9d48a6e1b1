"""Cheat (notebook 11, vocab_parallel): a right vocabulary split (one all-reduce in each
embedding forward, the three all-reduces of N numbers in each loss forward, none backward)
whose loss also gathers the full logits of every rank through the process group's own
``allgather`` method taken from the class when the file is imported (before any recorder
could wrap it). The recorded calls and the values are a right file's; the network carries
the whole logits ((n - 1) times their bytes) beside the all-reduces. Self-contained.
Must fail ``vp-wire``."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch._C._distributed_c10d import ProcessGroup

_ALLGATHER = ProcessGroup.allgather

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
        parts = [torch.empty_like(logits) for _ in range(dist.get_world_size(group))]
        _ALLGATHER(group, [parts], [logits.detach().contiguous()]).wait()   # the full logits
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
