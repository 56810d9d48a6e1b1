"""The models and data of notebook 09's checks (used by the probes, in the ranks, and by the
checkers for sizes); the single-process references are the judge's (:mod:`.references`).

:class:`Net` has what makes sharding hard: an embedding whose weight is tied to the output
layer's, a frozen parameter (``blocks.2.gain``), a buffer (``shift``), units whose parameter
counts need padding with 2 and 3 ranks (16,383 and 16,384 elements) and whose parameters
autograd saves twice (weight and bias). Every rank builds it from the same seed; each trains on
its own part (``LOCAL_BATCH`` rows) of a combined batch; the reference (:mod:`.references`)
trains one copy on the combined batch in one process with ``torch.optim.SGD(**OPTIM)``
(momentum: state per parameter). The sweeps add the core's :class:`~exercise_utils.models.EdgeNet`
(:func:`edge_model`: a tied weight used inside a unit and outside, frozen, unused, transposed and
0-d parameters, BatchNorm buffers with an int64 counter float32 cannot hold) in float32 and
float64.

Used in 09_bonus_fsdp.
"""
import torch
import torch.nn as nn

from ..models import EdgeNet
from ..rankworker import salted_generator

WIDTH, VOCAB, LOCAL_BATCH = 128, 49, 2
STEPS, MEASURED_STEP, MORE_STEPS = 4, 1, 2
EDGE_BATCH, EDGE_STEPS = 4, 2     # EdgeNet: rows per rank and step, steps
OPTIM = dict(lr=0.05, momentum=0.9, weight_decay=0.01)   # SGD: Adam would hide a wrong scale
BIG_COUNT = 2 ** 24 + 1           # EdgeNet's num_batches_tracked: float32 cannot hold it
EDGE_UNITS = ("inp", "bn", "unused", "back", "head")   # back.weight is out.weight: the root's
ZERO2_SKIPS = (0, 2)              # steps of Zero2's run whose forward leaves the last block out


class Block(nn.Module):
    """``y = tanh(fc(x))``, then ``y + y * fc.bias``: the unit's parameters are used twice, so
    autograd saves two views of them (its weight, by the Linear, and its bias); times a frozen
    gain when ``frozen``."""

    def __init__(self, n_in, n_out, frozen=False):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)
        if frozen:
            self.gain = nn.Parameter(torch.linspace(0.5, 1.5, n_out), requires_grad=False)

    def forward(self, x):
        y = torch.tanh(self.fc(x))
        y = y + y * self.fc.bias
        return y * self.gain if hasattr(self, "gain") else y


class Net(nn.Module):
    """Embedding (tied to the head's weight) + a buffer, four blocks (units), head.
    ``skip_last``: the forward leaves the last block out (its parameters get no gradient; set
    per step by Zero2's run, :data:`ZERO2_SKIPS`)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.Sequential(Block(WIDTH, WIDTH - 1), Block(WIDTH - 1, WIDTH),
                                    Block(WIDTH, WIDTH, frozen=True), Block(WIDTH, WIDTH))
        self.head = nn.Linear(WIDTH, VOCAB)
        self.head.weight = self.emb.weight
        self.register_buffer("shift", torch.linspace(-0.1, 0.1, WIDTH))
        self.skip_last = False

    def forward(self, tokens):
        blocks = self.blocks[:-1] if self.skip_last else self.blocks
        return self.head(blocks(self.emb(tokens) + self.shift))


def make_model(seed=0):
    torch.manual_seed(seed)
    model = Net()
    if seed:                      # another buffer and frozen value: loading must replace them
        with torch.no_grad():
            model.shift.mul_(-3)
            model.blocks[2].gain.add_(1)
    return model


def unit_numels():
    """Trainable elements of each unit (the four blocks, then the root: emb/head, bias)."""
    model = make_model()
    blocks = [sum(p.numel() for p in b.parameters() if p.requires_grad) for b in model.blocks]
    return blocks + [model.emb.weight.numel() + model.head.bias.numel()]


def combined(step, size, salts=None):
    """The combined batch of ``step``: rank r's part is its rows r * LOCAL_BATCH onwards.

    ``salts`` (``{rank: number}``; at grading each rank's ``ctx.salt``, a number only that
    rank and the judge know): a rank whose salt is not 0 draws its part from a generator of its
    own seeded from it, so that no other rank can rebuild it. Unsalted, every part is cut from
    one draw (every rank can rebuild every part)."""
    seed = 7919 * step + 17
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (size * LOCAL_BATCH,), generator=g)
    y = torch.randint(0, VOCAB, (size * LOCAL_BATCH,), generator=g)
    for rank, salt in sorted((salts or {}).items()):
        if salt:
            own = salted_generator(seed + 7 * rank, salt)
            part = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
            x[part] = torch.randint(0, VOCAB, (LOCAL_BATCH,), generator=own)
            y[part] = torch.randint(0, VOCAB, (LOCAL_BATCH,), generator=own)
    return x, y


def local(step, ctx):
    """This rank's part of :func:`combined` (salted with ``ctx.salt``)."""
    x, y = combined(step, ctx.size, {ctx.rank: getattr(ctx, "salt", 0)})
    part = slice(ctx.rank * LOCAL_BATCH, (ctx.rank + 1) * LOCAL_BATCH)
    return x[part], y[part]


def arrays(state):
    return {k: v.detach().cpu().numpy().copy() for k, v in state.items()}


# ---------------------------------------------------------------- EdgeNet sweeps
def edge_model(seed, dtype):
    """An :class:`EdgeNet` of ``dtype`` in eval mode (BatchNorm on its running statistics, so
    that averaged gradients equal the combined batch's), its buffers set per seed (the counter
    above 2**24)."""
    torch.manual_seed(seed)
    model = EdgeNet(dtype=getattr(torch, dtype))
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 1.5)
        model.bn.num_batches_tracked.fill_(BIG_COUNT + seed)
        model.frozen.add_(seed)
    return model.eval()


def edge_combined(step, micro, size, dtype, salts=None):
    """EdgeNet's combined batch of ``step`` (micro-batch ``micro``), salted as
    :func:`combined`."""
    seed = 104729 * step + 31 * micro + 5
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size * EDGE_BATCH, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (size * EDGE_BATCH,), generator=g)
    for rank, salt in sorted((salts or {}).items()):
        if salt:
            own = salted_generator(seed + 7 * rank, salt)
            part = slice(rank * EDGE_BATCH, (rank + 1) * EDGE_BATCH)
            x[part] = torch.randn(EDGE_BATCH, 6, generator=own, dtype=torch.float64)
            y[part] = torch.randint(0, 4, (EDGE_BATCH,), generator=own)
    return x.to(getattr(torch, dtype)), y


def edge_local(step, micro, ctx, dtype):
    x, y = edge_combined(step, micro, ctx.size, dtype, {ctx.rank: getattr(ctx, "salt", 0)})
    part = slice(ctx.rank * EDGE_BATCH, (ctx.rank + 1) * EDGE_BATCH)
    return x[part], y[part]


def edge_units(model):
    return [getattr(model, name) for name in EDGE_UNITS]


def registrations(model):
    """``[(qualified name, module, attribute)]`` of every place a trainable parameter is
    registered (a tied weight: two)."""
    return [(f"{prefix}.{name}" if prefix else name, module, name)
            for prefix, module in model.named_modules(remove_duplicate=False)
            for name, p in module._parameters.items() if p is not None and p.requires_grad]


def gathered(regs):
    """The registrations whose attribute is not None (still pointing at gathered parameters)."""
    return [q for q, module, name in regs if getattr(module, name, None) is not None]


def tensors(state):
    """``{key: array}`` of a state dict, or ``{"types": ...}`` if it holds something else."""
    if not all(isinstance(v, torch.Tensor) for v in state.values()):
        return {"types": {k: type(v).__name__ for k, v in state.items()}}
    return {"arrays": arrays(state)}
