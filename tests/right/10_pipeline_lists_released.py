"""RIGHT (notebook 10, pipeline): written from the notebook alone. Each micro-batch's stage
input and output (or scaled loss) sit in two lists of length m; the backward reads them under
names of its own (``inp``, ``top``) and then sets both entries to None, so a finished
micro-batch stays alive only through those two names until the next backward assigns them
(the notebook allows one). The losses are kept as floats and added with ``math.fsum``; every
receive is waited on right away; sends are waited on at the end of the step.

The checker must accept it.
"""
import copy
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


# ------------------------------------------------------------------ single-process blocks (given)
class MLP(nn.Module):
    """Transformer feed-forward block ``fc2(act(fc1(x)))``: fc1 = Linear(d, h), fc2 =
    Linear(h, d)."""

    def __init__(self, d_model, d_hidden):
        super().__init__()
        self.fc1, self.act = nn.Linear(d_model, d_hidden), nn.GELU()
        self.fc2 = nn.Linear(d_hidden, d_model)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def attention_heads(q, k, v, n_heads, causal=False):
    """Scaled dot-product attention of ``n_heads`` heads side by side: ``q, k, v`` are
    ``(B, T, n_heads * head_dim)``, head ``i`` the features ``[i * head_dim, (i + 1) *
    head_dim)``; returns ``(B, T, n_heads * head_dim)``. Heads do not interact."""
    B, T, width = q.shape
    hd = width // n_heads

    def split(t):                                     # (B, T, H*hd) -> (B, H, T, hd)
        return t.reshape(B, T, n_heads, hd).transpose(1, 2)

    q, k, v = split(q), split(k), split(v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, n_heads * hd)


class Attention(nn.Module):
    """Multi-head self-attention ``o(attention_heads(q(x), k(x), v(x)))``, q, k, v, o =
    Linear(d, d), ``n_heads`` heads of ``d // n_heads`` features."""

    def __init__(self, d_model, n_heads, causal=False):
        super().__init__()
        self.n_heads, self.causal = n_heads, causal
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x):
        return self.o(attention_heads(self.q(x), self.k(x), self.v(x), self.n_heads, self.causal))


# ------------------------------------------------------------------ tensor parallelism
class CopyToParallel(torch.autograd.Function):
    """Megatron's "f": identity in the forward pass, all-reduce (sum) of the gradient in the
    backward pass.

    Where a replicated activation enters a tensor-parallel region: every rank uses the same
    ``x`` for its own shard of the work, so the gradient of ``x`` is the sum of the ranks'
    partial gradients. ``CopyToParallel.apply(x)`` returns ``x`` unchanged; its backward
    returns the incoming gradient summed over the ranks by one ``dist.all_reduce`` (on a copy:
    never modify the incoming gradient in place).
    """

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        summed = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(summed, op=dist.ReduceOp.SUM)
        return summed


class ReduceFromParallel(torch.autograd.Function):
    """Megatron's "g": all-reduce (sum) in the forward pass, identity in the backward pass.

    Where the ranks' partial results leave a tensor-parallel region (the output of a
    row-parallel layer): the full result is the sum of the parts, and d(sum)/d(part) is the
    identity. ``ReduceFromParallel.apply(x)`` returns a new tensor, the sum of ``x`` over the
    ranks (one ``dist.all_reduce``; ``x`` itself is not modified); its backward returns the
    incoming gradient as it is.
    """

    @staticmethod
    def forward(ctx, x):
        summed = x.detach().clone(memory_format=torch.contiguous_format)
        dist.all_reduce(summed, op=dist.ReduceOp.SUM)
        return summed

    @staticmethod
    def backward(ctx, grad):
        return grad


class ColumnParallelLinear(nn.Module):
    """The output features of a Linear layer split evenly across the N ranks.

    With ``k = out_features // N``, rank ``r`` holds rows ``[r*k, (r+1)*k)`` of the full weight
    (``weight``: ``(k, in_features)``) and the same entries of the bias (``bias``: ``(k,)``,
    None if the layer has none). ``forward(x)``: ``x`` is ``(..., in_features)``, the same on
    every rank; returns ``(..., k)``, columns ``[r*k, (r+1)*k)`` of the full layer's output. No
    communication: the "f" in front is the enclosing block's (several column layers reading the
    same input share one).
    """

    def __init__(self, weight, bias):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)

    @classmethod
    def from_linear(cls, linear):
        """This rank's shard of ``linear`` (a copy, of its dtype; the new parameters require grad).

        Raises:
            ValueError: ``linear.out_features`` not divisible by N.
        """
        world, rank = dist.get_world_size(), dist.get_rank()
        if linear.out_features % world:
            raise ValueError(f"cannot split {linear.out_features} output features over {world} ranks")
        k = linear.out_features // world
        rows = torch.arange(rank * k, rank * k + k)
        weight = linear.weight.detach().index_select(0, rows)
        bias = None if linear.bias is None else linear.bias.detach().index_select(0, rows)
        return cls(weight, bias)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """The input features of a Linear layer split evenly across the N ranks.

    With ``k = in_features // N``, rank ``r`` holds columns ``[r*k, (r+1)*k)`` of the full
    weight (``weight``: ``(out_features, k)``) and the whole bias (``bias``: ``(out_features,)``,
    None if the layer has none). ``forward(x)``: ``x`` is ``(..., k)``, this rank's slice of the
    full input's features (what the matching column-parallel layer returns); returns
    ``(..., out_features)``, the full layer's output, the same on every rank: ``g(x @
    weight.T) + bias``, one ``dist.all_reduce`` per forward (in g), none in the backward. The
    bias is added once, after the all-reduce (adding it before would count it N times), so
    every rank's ``bias.grad`` is the full layer's bias gradient.
    """

    def __init__(self, weight, bias):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)

    @classmethod
    def from_linear(cls, linear):
        """This rank's shard of ``linear`` (a copy, of its dtype; the new parameters require grad).

        Raises:
            ValueError: ``linear.in_features`` not divisible by N.
        """
        world, rank = dist.get_world_size(), dist.get_rank()
        if linear.in_features % world:
            raise ValueError(f"cannot split {linear.in_features} input features over {world} ranks")
        k = linear.in_features // world
        cols = torch.arange(rank * k, rank * k + k)
        weight = linear.weight.detach().index_select(1, cols)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(weight, bias)

    def forward(self, x):
        partial = F.linear(x, self.weight)          # this rank's share of x @ W.T
        full = ReduceFromParallel.apply(partial)
        if self.bias is not None:
            full = full + self.bias                 # once, after the sum
        return full


class ParallelMLP(nn.Module):
    """Tensor-parallel MLP: ``fc2(act(fc1(f(x))))``, fc1 column-parallel, fc2 row-parallel.

    ``forward(x)``: ``x`` is ``(..., d)``, the same on every rank; returns ``(..., d)``, the full
    MLP output, the same on every rank, with exactly one ``dist.all_reduce`` in the forward (g)
    and one in the backward (f, on the gradient of ``x``). The hidden activation ``(..., h/N)``
    never leaves the rank.
    """

    def __init__(self, fc1, act, fc2):
        super().__init__()
        self.fc1, self.act, self.fc2 = fc1, act, fc2

    @classmethod
    def from_mlp(cls, mlp):
        """This rank's shard of ``mlp`` (any module with ``fc1``, an elementwise ``act`` without
        parameters and ``fc2``, computing ``fc2(act(fc1(x)))``).

        Raises:
            ValueError: the hidden width ``h`` not divisible by N.
        """
        n = dist.get_world_size()
        if mlp.fc1.out_features % n != 0:
            raise ValueError(f"hidden width {mlp.fc1.out_features} is not divisible by N={n}")
        return cls(ColumnParallelLinear.from_linear(mlp.fc1), copy.deepcopy(mlp.act),
                   RowParallelLinear.from_linear(mlp.fc2))

    def forward(self, x):
        return self.fc2(self.act(self.fc1(CopyToParallel.apply(x))))


class ParallelAttention(nn.Module):
    """Tensor-parallel attention, the heads split across the ranks.

    With ``H`` heads, rank ``r`` computes heads ``[r*H/N, (r+1)*H/N)``: q, k and v are
    column-parallel (their rows ``[r*d/N, (r+1)*d/N)`` are exactly those heads' features), o is
    row-parallel, and ``n_heads`` is the LOCAL head count ``H/N``. ``forward(x)``: ``x`` is
    ``(B, T, d)``, the same on every rank; returns ``(B, T, d)``, the full block's output, the
    same on every rank, with one ``dist.all_reduce`` in the forward (in o) and one in the
    backward (f, shared by q, k and v: they read the same ``f(x)``).
    """

    def __init__(self, q, k, v, o, n_heads, causal=False):
        super().__init__()
        self.q, self.k, self.v, self.o = q, k, v, o
        self.n_heads, self.causal = n_heads, causal

    @classmethod
    def from_attention(cls, attn):
        """This rank's shard of ``attn`` (any module with ``q, k, v, o``: Linear(d, d),
        ``n_heads`` and ``causal``, heads laid out as in ``attention_heads``).

        Raises:
            ValueError: ``attn.n_heads`` not divisible by N.
        """
        n = dist.get_world_size()
        if attn.n_heads % n != 0:
            raise ValueError(f"n_heads={attn.n_heads} is not divisible by N={n}")
        col = ColumnParallelLinear.from_linear
        return cls(col(attn.q), col(attn.k), col(attn.v), RowParallelLinear.from_linear(attn.o),
                   attn.n_heads // n, attn.causal)

    def forward(self, x):
        x = CopyToParallel.apply(x)
        return self.o(attention_heads(self.q(x), self.k(x), self.v(x), self.n_heads, self.causal))


# ------------------------------------------------------------------ pipeline schedules
def check_schedule_args(num_stages, num_microbatches, stage):
    """ValueError unless ``num_stages >= 1``, ``num_microbatches >= 1`` and ``0 <= stage <
    num_stages``, all ints (a bool is not one). Given."""
    for name, v in (("num_stages", num_stages), ("num_microbatches", num_microbatches),
                    ("stage", stage)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} must be an int, got {v!r}")
    if num_stages < 1 or num_microbatches < 1 or not 0 <= stage < num_stages:
        raise ValueError(f"need num_stages >= 1, num_microbatches >= 1, 0 <= stage < "
                         f"num_stages; got {num_stages}, {num_microbatches}, {stage}")


def gpipe_order(num_stages, num_microbatches, stage):
    """GPipe: the op list of ``stage``: all forwards in micro-batch order, then all backwards in
    reverse micro-batch order, ``[("F", 0), ..., ("F", m-1), ("B", m-1), ..., ("B", 0)]``.

    Returns a list of ``2m`` tuples ``(kind, j)``, kind ``"F"`` or ``"B"``; ValueError on
    invalid arguments (call ``check_schedule_args`` first).
    """
    check_schedule_args(num_stages, num_microbatches, stage)
    m = num_microbatches
    return [(kind, j) for kind, js in (("F", range(m)), ("B", range(m - 1, -1, -1))) for j in js]


def one_f_one_b_order(num_stages, num_microbatches, stage):
    """1F1B: the op list of ``stage``: a warm-up of ``w = min(p - stage - 1, m)`` forwards
    F0 .. F(w-1); then, for ``j = w .. m-1``, the pair F(j), B(j-w); then the remaining
    backwards in order. At most ``p - stage`` micro-batches are in flight (forward done,
    backward not yet) at any time.

    Returns a list of ``2m`` tuples ``(kind, j)``, kind ``"F"`` or ``"B"``; ValueError on
    invalid arguments (call ``check_schedule_args`` first).
    """
    check_schedule_args(num_stages, num_microbatches, stage)
    p, m = num_stages, num_microbatches
    w = min(p - stage - 1, m)
    warmup = [("F", j) for j in range(w)]
    steady = [op for j in range(w, m) for op in (("F", j), ("B", j - w))]
    cooldown = [("B", j) for j in range(m - w, m)]
    return warmup + steady + cooldown


# ------------------------------------------------------------------ pipeline step
HEADER = 10                        # int64 elements: [dtype code, ndim, 8 sizes]
DTYPES = (torch.float32, torch.float64)


def tag_header(j):
    return 3 * j


def tag_activation(j):
    return 3 * j + 1


def tag_gradient(j):
    return 3 * j + 2


def check_order(order):
    """The number of micro-batches m of ``order`` (each of F j and B j once, j = 0..m-1, F j
    before B j); ValueError otherwise. Given."""
    seen = set()
    for kind, j in order:
        if kind not in ("F", "B") or (kind, j) in seen or (kind == "B" and ("F", j) not in seen):
            raise ValueError(f"invalid order: {order!r}")
        seen.add((kind, j))
    m = len(seen) // 2
    if m < 1 or seen != {(k, j) for k in "FB" for j in range(m)}:
        raise ValueError(f"invalid order: {order!r}")
    return m


def split_batch(batch, m):
    """``torch.tensor_split(batch, m)``: m micro-batches along dim 0 (sizes differ by at most
    one). Given."""
    if batch.shape[0] < m:
        raise ValueError(f"a batch of {batch.shape[0]} cannot make {m} micro-batches")
    return torch.tensor_split(batch, m)


def encode_header(t):
    """The int64 header that announces tensor ``t`` (float32 or float64, at most 8 dims). Given."""
    header = torch.zeros(HEADER, dtype=torch.int64)
    header[0], header[1] = DTYPES.index(t.dtype), t.dim()
    header[2:2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    return header


def decode_header(header):
    """``(shape, dtype)`` from a received header. Given."""
    ndim = int(header[1])
    return tuple(int(v) for v in header[2:2 + ndim]), DTYPES[int(header[0])]


def pipeline_step(stage_module, order, inputs=None, targets=None, loss_fn=None):
    """One training step (forward and backward, no optimizer step) of this rank's stage.

    Rank ``s`` of the ``p`` ranks is stage ``s``: it runs the ops of ``order`` in that order
    (``("F", j)``: the forward of micro-batch ``j``; ``("B", j)``: its backward), receives
    activations from rank ``s-1`` and sends its outputs to rank ``s+1`` (and gradients the
    other way), nothing else. Every rank calls it with an order of the same kind and m.

    Args:
        stage_module: this stage's module: one floating-point tensor in, one out (its shape
            may differ from the input's, and between micro-batches).
        order: ``gpipe_order(p, m, s)`` or ``one_f_one_b_order(p, m, s)``.
        inputs: stage 0 only: the whole batch, cut with ``split_batch(inputs, m)``.
        targets: the last stage only: the whole batch's targets, cut the same way.
        loss_fn: the last stage only: ``loss_fn(output_j, target_j)``, a mean over the samples.

    The last stage back-propagates ``loss_fn(out_j, tgt_j) * n_j / n`` for micro-batch ``j``
    of ``n_j`` of the ``n`` samples, so that the gradients are the whole batch's (also when the
    micro-batches are uneven). The gradients are accumulated (``+=``) into ``.grad`` of
    ``stage_module``'s parameters, never zeroed.

    One way that works (the reference's): before each activation send its header
    (``encode_header``, tag ``tag_header(j)``), then the activation (``tag_activation(j)``); a
    gradient (``tag_gradient(j)``) needs no header: it has the shape of the activation sent.
    Send with ``dist.isend`` and wait on the sends only at the end of the step; post each
    receive with ``dist.irecv`` before waiting on it (a blocking send can deadlock).

    Returns:
        On the last stage, the whole batch's loss as a Python float; None on the other stages.
    """
    m = check_order(order)
    s, p = dist.get_rank(), dist.get_world_size()
    first, last = s == 0, s == p - 1
    if first:
        micro_inputs = split_batch(inputs, m)
    if last:
        micro_targets = split_batch(targets, m)
        n = targets.shape[0]
    sends = []          # every isend's work, waited at the very end
    ins, outs = [None] * m, [None] * m
    losses = []
    for kind, j in order:
        if kind == "F":
            if first:
                x = micro_inputs[j]
            else:
                header = torch.empty(HEADER, dtype=torch.int64)
                dist.irecv(header, src=s - 1, tag=tag_header(j)).wait()
                shape, dtype = decode_header(header)
                x = torch.empty(shape, dtype=dtype)
                dist.irecv(x, src=s - 1, tag=tag_activation(j)).wait()
                x.requires_grad_(True)
            y = stage_module(x)
            if last:
                tgt = micro_targets[j]
                y = loss_fn(y, tgt) * (len(tgt) / n)
                losses.append(y.item())
            else:
                sends.append(dist.isend(encode_header(y), dst=s + 1, tag=tag_header(j)))
                sends.append(dist.isend(y.detach().contiguous(), dst=s + 1,
                                        tag=tag_activation(j)))
            ins[j], outs[j] = x, y
            x = y = None
        else:
            inp, top = ins[j], outs[j]
            ins[j] = outs[j] = None
            if last:
                top.backward()
            else:
                grad = torch.empty(top.shape, dtype=top.dtype)
                dist.irecv(grad, src=s + 1, tag=tag_gradient(j)).wait()
                top.backward(grad)
            if not first:
                sends.append(dist.isend(inp.grad.contiguous(), dst=s - 1, tag=tag_gradient(j)))
    for work in sends:
        work.wait()
    return math.fsum(losses) if last else None
