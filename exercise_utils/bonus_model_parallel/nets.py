"""The judge's single-process reference blocks of notebook 10 and the salted weights, inputs and
upstream gradients of its checks: built the same way inside every rank (:mod:`.probes`,
:mod:`.probes_pp`) and by the judge (:mod:`.checks`, :mod:`.checks_pp`), from a seed and the
ranks' numbers (each rank's own parts from its own: :func:`build`, :func:`pp_stack`).

The blocks are the judge's own (never the student's ``MLP`` / ``Attention``), with the attribute
names the contract promises ``from_mlp`` / ``from_attention`` can rely on: ``fc1``, ``act``,
``fc2``; ``q``, ``k``, ``v``, ``o``, ``n_heads``, ``causal``. Head ``i`` occupies features
``[i*hd, (i+1)*hd)``.

Used in 10_bonus_model_parallel.
"""
import math

import torch
import torch.nn as nn

from ..rankworker import salted_generator

D_MODEL, D_HIDDEN, N_HEADS = 24, 48, 6     # divisible by 2 and 3 (the world sizes checked)
BATCH, SEQ = 3, 5
# (name, kind, dtype, causal): every launch runs these, in this order
# (for an MLP "causal" means a 2-D input: rows of features, no sequence axis)
BLOCKS = (("mlp-float64", "mlp", "float64", False),
          ("mlp-float32", "mlp", "float32", False),
          ("mlp-2-d-float64", "mlp", "float64", True),
          ("attention-float64", "attention", "float64", False),
          ("attention-float32", "attention", "float32", False),
          ("causal-attention-float64", "attention", "float64", True))
# Where links are observed (:func:`exercise_utils.harness.observing`): two float64 blocks more on
# a wide input of WIRE_ROWS (batch, sequence), so that what their all-reduces put on the wire
# stands far above the set-up and the headers of the small blocks' calls (the judge's bound:
# :mod:`.wire`).
WIRE_BLOCKS = (("mlp-wire-float64", "mlp", "float64", False),
               ("attention-wire-float64", "attention", "float64", False))
WIRE_ROWS = (32, 64)
SEED = {"mlp": 1010, "attention": 2020}
# After the wrapping every rank multiplies every parameter of its parallel block by SCALE (the
# judge's reference its whole block): a rank that computes with a copy of the block kept aside
# computes with stale weights.
SCALE = 1.25
# The parameters of each kind, and how a rank holds them: "rows" (column-parallel: its rows
# of the weight, its entries of the bias), "cols" (row-parallel weight: its columns), "full"
# (the row-parallel bias: whole on every rank).
PARAMS = {"mlp": (("fc1.weight", "rows"), ("fc1.bias", "rows"),
                  ("fc2.weight", "cols"), ("fc2.bias", "full")),
          "attention": tuple((f"{n}.{p}", kind) for n in "qkv" for p, kind in
                             (("weight", "rows"), ("bias", "rows")))
          + (("o.weight", "cols"), ("o.bias", "full"))}


class RefMLP(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        # not the default GELU: from_mlp must keep the block's own activation
        self.fc1, self.act, self.fc2 = nn.Linear(d, h), nn.GELU("tanh"), nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class RefAttention(nn.Module):
    def __init__(self, d, n_heads, causal=False):
        super().__init__()
        self.n_heads, self.head_dim, self.causal = n_heads, d // n_heads, causal
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        B, T, d = x.shape
        H, hd = self.n_heads, self.head_dim

        def split(t):
            return t.reshape(B, T, H, hd).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
        if self.causal:
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1),
                                        float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, d)
        return self.o(y)


def blocks(wire=False):
    """The blocks a launch runs: :data:`BLOCKS` (``wire``: and :data:`WIRE_BLOCKS`)."""
    return BLOCKS + (WIRE_BLOCKS if wire else ())


def rows_of(name):
    """``(batch, sequence)`` of block ``name``'s input."""
    return WIRE_ROWS if name in dict((b[0], b) for b in WIRE_BLOCKS) else (BATCH, SEQ)


def _draw(gen, shape, fan_in):
    return torch.randn(shape, generator=gen, dtype=torch.float64) / math.sqrt(fan_in)


def build(kind, dtype, causal, salts, public, rows=(BATCH, SEQ)):
    """``(block, x, upstream)``: the reference block (biases included, none zero), the input
    ``x`` (``(*rows, D_MODEL)``, requires grad) and the upstream gradient the backward pass
    starts from (the loss is ``(block(x) * upstream).sum()``), all of ``dtype``.

    Each parameter a rank holds a part of (``PARAMS``: "rows" or "cols" of ``len(salts)``
    ranks) is drawn part by part, part q from ``salts[q]``; the whole row-parallel bias, ``x``
    and ``upstream``, which every rank holds, from ``public`` (rank 0's number, which the
    probe shares). The judge passes every rank's number (the true block); rank r passes its own
    number for every part (``[ctx.salt] * N``): at grading only its own parts are the true
    ones, the others a guess, so a rank that computes with another rank's part of the block
    computes something else. Unsalted (every number 0) every rank builds the true block."""
    dt, size = getattr(torch, dtype), len(salts)
    seed = SEED[kind] + (7 if causal else 0)
    block = (RefMLP(D_MODEL, D_HIDDEN) if kind == "mlp"
             else RefAttention(D_MODEL, N_HEADS, causal)).to(dt)
    held = dict(PARAMS[kind])
    with torch.no_grad():
        for i, (name, p) in enumerate(block.named_parameters()):
            fan_in = p.shape[-1] if p.dim() == 2 else D_MODEL
            how = held.get(name, "full")
            if how == "full":
                p.copy_(_draw(salted_generator(seed + 10 * i, public), p.shape, fan_in))
                continue
            dim = 0 if how == "rows" else 1
            k = p.shape[dim] // size
            for q in range(size):
                part = p.narrow(dim, q * k, k)
                part.copy_(_draw(salted_generator(seed + 10 * i + 1000 * (q + 1), salts[q]),
                                 part.shape, fan_in))
    gen = salted_generator(seed, public)
    shape = (rows[0] * rows[1], D_MODEL) if kind == "mlp" and causal else (*rows, D_MODEL)
    x = torch.randn(shape, generator=gen, dtype=torch.float64).to(dt)
    upstream = torch.randn(shape, generator=gen, dtype=torch.float64).to(dt)
    return block, x.requires_grad_(True), upstream


def reference(kind, dtype, causal, salts, public, rows=(BATCH, SEQ)):
    """The judge's one-process values (every rank's number: the true block, :func:`build`):
    ``{"out", "x_grad", "grads": {name: full gradient}}`` as float64 numpy arrays."""
    block, x, upstream = build(kind, dtype, causal, salts, public, rows)
    with torch.no_grad():
        for q in block.parameters():
            q.mul_(SCALE)
    out = block(x)
    (out * upstream).sum().backward()
    params = dict(block.named_parameters())
    return {"out": out.detach().double().numpy(), "x_grad": x.grad.double().numpy(),
            "grads": {name: params[name].grad.double().numpy() for name, _ in PARAMS[kind]}}


def shard(full, how, rank, size):
    """Rank ``rank``'s part of the full array ``full`` held as ``how`` (see ``PARAMS``)."""
    if how == "full":
        return full
    if how == "rows":
        k = full.shape[0] // size
        return full[rank * k:(rank + 1) * k]
    k = full.shape[1] // size
    return full[:, rank * k:(rank + 1) * k]


# ---------------------------------------------------------------- pipeline parallelism
# The judge's stack for the pipeline check: Linear layers of these widths, Tanh between them
# (none after the last), split into p consecutive stages of LAYERS // p layers each (p = 2, 3).
# The widths change at every layer, so a stage's output shape is not its input's.
PP_WIDTHS = (5, 8, 7, 6, 9, 4, 3)
PP_LAYERS = len(PP_WIDTHS) - 1
PP_SEED = 3030
# (name, dtype, schedule, m, batch): every pipeline launch runs these, in this order; the
# batch of 10 rows splits unevenly into 3 (4+3+3) and 4 (3+3+2+2) micro-batches.
PP_RUNS = tuple((f"{sched}-m{m}-{dtype}", dtype, sched, m, 8 if m <= 2 else 10)
                for dtype in ("float64", "float32") for sched in ("gpipe", "1f1b")
                for m in (1, 2, 3, 4))
# Where links are observed (:func:`exercise_utils.harness.observing`): one run more on a wide
# batch, so that what its messages put on each link stands far above the set-up and headers
# (the judge's bound: :mod:`.wire`).
PP_WIRE_RUNS = (("1f1b-m4-float64-wide", "float64", "1f1b", 4, 2048),)


def pp_runs(wire=False):
    """The runs of a pipeline launch: :data:`PP_RUNS` (``wire``: and :data:`PP_WIRE_RUNS`)."""
    return PP_RUNS + (PP_WIRE_RUNS if wire else ())


def pp_owner(layer, p):
    """The stage (of ``p``) that holds Linear layer ``layer`` of the stack."""
    return layer // (PP_LAYERS // p)


def pp_stack(dtype, salts, batch, stages=None):
    """``(layers, x, y)``: the whole model as a list of modules (Linear, Tanh, ..., Linear),
    the input ``(batch, PP_WIDTHS[0])`` and the target ``(batch, PP_WIDTHS[-1])``, all of
    ``dtype``. ``salts[s]`` is stage s's number (``ctx.salt`` of rank s; 0 when unsalted) and
    ``len(salts)`` the number of stages p: Linear layer i's weights derive from the salt of the
    stage that holds it, the input from stage 0's, the target from the last stage's, so that at
    grading a stage can build its own layers and data but no other stage's. ``stages``: build
    only the layers (and data) of these stages (the others' Linear layers are None, and x / y
    are None unless stage 0 / the last stage is among them); None: all."""
    dt, p = getattr(torch, dtype), len(salts)
    mine = set(range(p)) if stages is None else set(stages)
    layers = []
    for i, (a, b) in enumerate(zip(PP_WIDTHS, PP_WIDTHS[1:])):
        owner = pp_owner(i, p)
        lin = None
        if owner in mine:
            gen = salted_generator(PP_SEED + 100 * batch + i, salts[owner])
            lin = nn.Linear(a, b).to(dt)
            with torch.no_grad():
                lin.weight.copy_(torch.randn(b, a, generator=gen, dtype=torch.float64)
                                 / math.sqrt(a))
                lin.bias.copy_(torch.randn(b, generator=gen, dtype=torch.float64) * 0.5)
        layers.append(lin)
        if i < PP_LAYERS - 1:
            layers.append(nn.Tanh())
    x = y = None
    if 0 in mine:
        gen = salted_generator(PP_SEED + 100 * batch + 50, salts[0])
        x = torch.randn(batch, PP_WIDTHS[0], generator=gen, dtype=torch.float64).to(dt)
    if p - 1 in mine:
        gen = salted_generator(PP_SEED + 100 * batch + 60, salts[p - 1])
        y = torch.randn(batch, PP_WIDTHS[-1], generator=gen, dtype=torch.float64).to(dt)
    return layers, x, y


def pp_stage(layers, p, s):
    """Stage ``s`` of ``p``: ``nn.Sequential`` of its ``PP_LAYERS // p`` Linear layers (each
    with the Tanh that follows it)."""
    per = PP_LAYERS // p
    lins = [i for i, mod in enumerate(layers) if mod is None or isinstance(mod, nn.Linear)]
    start = lins[s * per]
    end = lins[(s + 1) * per] if s + 1 < p else len(layers)
    return nn.Sequential(*layers[start:end])


def judge_loss(output, target):
    """The loss the pipeline check hands the last stage: the mean squared error plus half the
    mean output, a mean over the samples (as ``loss_fn`` must be) that is not symmetric in its
    arguments: ``loss_fn(target, output)`` gives another loss and other gradients."""
    return torch.nn.functional.mse_loss(output, target) + 0.5 * output.mean()


def pp_reference(dtype, salts, batch):
    """One process, the whole batch, every stage's layers from its salt (``salts``, one per
    stage: :func:`pp_stack`): ``{"loss": float, "grads": [per stage: [arrays of its
    parameters, in named_parameters order]]}`` for :func:`judge_loss` of the stack."""
    layers, x, y = pp_stack(dtype, salts, batch)
    p = len(salts)
    model = nn.Sequential(*layers)
    loss = judge_loss(model(x), y)
    loss.backward()
    return {"loss": float(loss.detach()),
            "grads": [[q.grad.double().numpy() for q in pp_stage(layers, p, s).parameters()]
                      for s in range(p)]}
