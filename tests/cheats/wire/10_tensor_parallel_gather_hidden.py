"""Cheat (notebook 10, tensor_parallel): a right tensor-parallel MLP and attention (one
``dist.all_reduce`` in each forward, in g, and one in each backward, in f) whose MLP also
gathers the full, unsharded hidden activation of every rank through the process group's own
``allgather`` method taken from the class when the file is imported (before any recorder could
wrap it), and takes its own columns from it. The recorded calls and the values are a right
file's; the network carries the whole hidden activation ((n - 1) times its bytes) beside the
all-reduces. Self-contained (at grading nothing of the course's tests can be read).
Must fail ``tp-wire``."""
import copy
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch._C._distributed_c10d import ProcessGroup

_ALLGATHER = ProcessGroup.allgather


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
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad)
        return grad


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
        out = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out)
        return out

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
        """This rank's shard of ``linear`` (a copy, of its dtype; the new parameters require grad;
        ``linear`` itself is left as it is).

        Raises:
            ValueError: ``linear.out_features`` not divisible by N.
        """
        rank, n = dist.get_rank(), dist.get_world_size()
        if linear.out_features % n:
            raise ValueError(f"out_features={linear.out_features} is not divisible by {n} ranks")
        k = linear.out_features // n
        rows = slice(rank * k, (rank + 1) * k)
        bias = None if linear.bias is None else linear.bias.detach()[rows].clone()
        return cls(linear.weight.detach()[rows].clone(), bias)

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
        """This rank's shard of ``linear`` (a copy, of its dtype; the new parameters require grad;
        ``linear`` itself is left as it is).

        Raises:
            ValueError: ``linear.in_features`` not divisible by N.
        """
        rank, n = dist.get_rank(), dist.get_world_size()
        if linear.in_features % n:
            raise ValueError(f"in_features={linear.in_features} is not divisible by {n} ranks")
        k = linear.in_features // n
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(linear.weight.detach()[:, rank * k:(rank + 1) * k].clone(), bias)

    def forward(self, x):
        y = ReduceFromParallel.apply(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


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
        parameters and ``fc2``, computing ``fc2(act(fc1(x)))``; ``mlp`` itself is left as it
        is).

        Raises:
            ValueError: the hidden width ``h`` not divisible by N.
        """
        return cls(ColumnParallelLinear.from_linear(mlp.fc1), copy.deepcopy(mlp.act),
                   RowParallelLinear.from_linear(mlp.fc2))

    def forward(self, x):
        h = self.act(self.fc1(CopyToParallel.apply(x)))
        rank, n = dist.get_rank(), dist.get_world_size()
        parts = [torch.empty_like(h) for _ in range(n)]
        _ALLGATHER(dist.group.WORLD, [parts], [h.detach().contiguous()]).wait()   # unseen
        full = torch.cat(parts, dim=-1)                     # the unsharded hidden activation
        k = h.shape[-1]
        h = h + (full[..., rank * k:(rank + 1) * k] - h).detach()
        return self.fc2(h)


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
        ``n_heads`` and ``causal``, heads laid out as in ``attention_heads``; ``attn`` itself is
        left as it is).

        Raises:
            ValueError: ``attn.n_heads`` not divisible by N.
        """
        n = dist.get_world_size()
        if attn.n_heads % n:
            raise ValueError(f"n_heads={attn.n_heads} is not divisible by {n} ranks")
        col = ColumnParallelLinear.from_linear
        return cls(col(attn.q), col(attn.k), col(attn.v), RowParallelLinear.from_linear(attn.o),
                   attn.n_heads // n, attn.causal)

    def forward(self, x):
        x = CopyToParallel.apply(x)
        return self.o(attention_heads(self.q(x), self.k(x), self.v(x), self.n_heads, self.causal))
