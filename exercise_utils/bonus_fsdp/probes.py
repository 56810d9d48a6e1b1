"""Probe of notebook 09's checkers: runs inside every rank (see :mod:`.checks`).

The model (:class:`Net`) has what makes sharding hard: an embedding whose weight is tied to the
output layer's, a frozen parameter (``blocks.2.gain``), a buffer (``shift``), units whose
parameter counts need padding with 2 and 3 ranks (16,383 and 16,384 elements) and whose
parameters autograd saves twice (weight and bias). Every rank
builds it from the same seed; each trains on its own part (``LOCAL_BATCH`` rows) of a combined
batch; the reference, computed in every rank afterwards, trains one copy on the combined batch
in one process with ``torch.optim.SGD(**OPTIM)`` (momentum: state per parameter).

Stages (one launch runs those asked for, in order):

* ``"zero2"``: ``shard_flat`` on ``SHARD_CASES``; ``STEPS`` steps with the student's ``Zero2``;
  per step the collectives of ``step()`` (the core's recorder), the gradients left on the
  model and the bytes alive after the step (:mod:`.memory`); the final parameters.
* ``"zero3"``: ``STEPS`` steps with ``Zero3(model, list(model.blocks))`` and ``SGD`` over its
  ``parameters()``; per step the collectives of forward, backward and the optimizer step, the
  bytes alive after the step, the outputs on a combined batch after training; in step
  ``MEASURED_STEP`` the bytes alive above the start of
  forward at every leaf module's forward and after forward (with a :class:`.memory.Witness`).
* ``"state_dict"`` (after ``"zero3"``'s training): ``full_state_dict()`` on every rank; rank
  0's is broadcast and loaded with ``load_full_state_dict`` into a wrapper of a model built from
  another seed (another buffer and frozen value too), which trains ``MORE_STEPS`` steps beside
  the reference.

Used in 09_bonus_fsdp.
"""
import datetime
import gc

import torch
import torch._dynamo  # noqa: F401 - the ranks' optimizers need it: imported once, before they fork
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..recorder import Recorder
from ..rankworker import not_implemented
from .memory import Witness, alive_bytes, start

WIDTH, VOCAB, LOCAL_BATCH = 128, 49, 2
STEPS, MEASURED_STEP, MORE_STEPS = 4, 1, 2
OPTIM = dict(lr=0.05, momentum=0.9, weight_decay=0.01)   # SGD: Adam would hide a wrong scale
SHARD_CASES = [([(2, 3), (5,)], 2, 1), ([(7,)], 3, 2), ([(3, 3), (1,)], 4, 0), ([(4,)], 4, 3)]
LEAVES = {"emb": ("weight",), "blocks.0.fc": ("weight", "bias"),
          "blocks.1.fc": ("weight", "bias"), "blocks.2.fc": ("weight", "bias"),
          "blocks.3.fc": ("weight", "bias"), "head": ("bias", "weight")}


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
    """Embedding (tied to the head's weight) + a buffer, four blocks (units), head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.Sequential(Block(WIDTH, WIDTH - 1), Block(WIDTH - 1, WIDTH),
                                    Block(WIDTH, WIDTH, frozen=True), Block(WIDTH, WIDTH))
        self.head = nn.Linear(WIDTH, VOCAB)
        self.head.weight = self.emb.weight
        self.register_buffer("shift", torch.linspace(-0.1, 0.1, WIDTH))

    def forward(self, tokens):
        return self.head(self.blocks(self.emb(tokens) + self.shift))


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


def combined(step, size):
    g = torch.Generator().manual_seed(7919 * step + 17)
    return (torch.randint(0, VOCAB, (size * LOCAL_BATCH,), generator=g),
            torch.randint(0, VOCAB, (size * LOCAL_BATCH,), generator=g))


def local(step, ctx):
    x, y = combined(step, ctx.size)
    part = slice(ctx.rank * LOCAL_BATCH, (ctx.rank + 1) * LOCAL_BATCH)
    return x[part], y[part]


def arrays(state):
    return {k: v.detach().cpu().numpy().copy() for k, v in state.items()}


def reference(size, steps, start=None):
    """One process on the combined batches: the model after ``steps`` steps."""
    model = make_model()
    if start is not None:
        model.load_state_dict(start)
    opt = torch.optim.SGD(model.parameters(), **OPTIM)
    first = 0 if start is None else STEPS
    for step in range(first, first + steps):
        opt.zero_grad()
        x, y = combined(step, size)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def _sharding(student):
    out = []
    for shapes, world, rank in SHARD_CASES:
        tensors = [torch.arange(1, 1 + torch.Size(s).numel(), dtype=torch.float32).reshape(s)
                   + 100 * i for i, s in enumerate(shapes)]
        shard, numel = student.shard_flat(tensors, world, rank)
        out.append({"shard": shard.detach().numpy().copy().tolist(), "numel": int(numel),
                    "view": shard._base is not None or
                    shard.untyped_storage().nbytes() > shard.numel() * shard.element_size()})
    return out


def zero2(student, ctx, rec):
    sharding = _sharding(student)
    gc.collect()
    base = alive_bytes()
    model = make_model()
    opt = student.Zero2(model.parameters(), torch.optim.SGD, **OPTIM)
    steps = []
    for step in range(STEPS):
        opt.zero_grad()
        x, y = local(step, ctx)
        F.cross_entropy(model(x), y).backward()
        rec.take()
        opt.step()
        events = rec.take()
        left = [n for n, p in model.named_parameters() if p.grad is not None]
        gc.collect()
        steps.append({"events": events, "grads_left": left, "alive": alive_bytes() - base})
    final = arrays(dict(model.named_parameters()))
    del opt
    return {"sharding": sharding, "steps": steps, "final": final,
            "ref": arrays(dict(reference(ctx.size, STEPS).named_parameters()))}


def _leaf_hooks(model, witness, samples, state):
    modules = dict(model.named_modules())
    handles = []
    for name, attrs in LEAVES.items():
        def hook(module, args, name=name, attrs=attrs):
            if state["measuring"]:
                witness.watch(module, attrs)
                samples.append((name, alive_bytes(witness.tensors()) - state["before"]))
        handles.append(modules[name].register_forward_pre_hook(hook))
    return handles


def train3(student, ctx, rec, measure):
    """``STEPS`` steps with the student's Zero3; (wrapped model, per-step records, samples)."""
    gc.collect()
    base = alive_bytes()
    model = make_model()
    witness, samples, state = Witness(), [], {"measuring": False, "before": 0}
    handles = _leaf_hooks(model, witness, samples, state) if measure else []
    wrapped = student.Zero3(model, list(model.blocks))
    opt = torch.optim.SGD(wrapped.parameters(), **OPTIM)
    steps, after_forward = [], None
    for step in range(STEPS):
        opt.zero_grad()
        x, y = local(step, ctx)
        state["measuring"] = measure and step == MEASURED_STEP
        if state["measuring"]:
            gc.collect()
            state["before"] = alive_bytes()
        rec.take()
        with witness.hooks():
            loss = F.cross_entropy(wrapped(x), y)
        if state["measuring"]:
            state["measuring"] = False
            gc.collect()
            after_forward = alive_bytes(witness.tensors()) - state["before"]
        forward = rec.take()
        loss.backward()
        backward = rec.take()
        witness.clear()
        opt.step()
        del loss
        gc.collect()
        steps.append({"forward": forward, "backward": backward, "step": rec.take(),
                      "alive": alive_bytes() - base})
    for h in handles:
        h.remove()
    return wrapped, opt, {"steps": steps, "samples": samples, "after_forward": after_forward}


def zero3(student, ctx, rec):
    wrapped, opt, out = train3(student, ctx, rec, measure=True)
    shards = {f"shard{i}": p for i, p in enumerate(wrapped.parameters())}
    out["shard_numels"] = sorted(p.numel() for p in shards.values() if p.requires_grad)
    x, _ = combined(STEPS, ctx.size)
    out["outputs"] = wrapped(x).detach().numpy().copy()
    del wrapped, opt, shards
    out["ref_outputs"] = reference(ctx.size, STEPS)(x).detach().numpy().copy()
    return out


def state_dict(student, ctx, rec):
    wrapped, opt, _ = train3(student, ctx, rec, measure=False)
    full = wrapped.full_state_dict()
    ref = reference(ctx.size, STEPS)
    out = {"full": arrays(full) if isinstance(full, dict) else full,
           "keys": list(full) if isinstance(full, dict) else None,
           "ref": arrays(ref.state_dict()), "ref_keys": list(ref.state_dict())}
    box = [full if ctx.rank == 0 else None]
    with rec.paths.sanctioned():             # the probe's own message: not the student's
        dist.broadcast_object_list(box, src=0)
    if not isinstance(box[0], dict) or set(box[0]) != set(out["ref_keys"]):
        return out                        # the checker reports the keys; nothing to load
    model2 = make_model(seed=1)
    loaded = student.Zero3(model2, list(model2.blocks))
    loaded.load_full_state_dict(box[0])
    opt2 = torch.optim.SGD(loaded.parameters(), **OPTIM)
    for step in range(STEPS, STEPS + MORE_STEPS):
        opt2.zero_grad()
        x, y = local(step, ctx)
        F.cross_entropy(loaded(x), y).backward()
        opt2.step()
    again = loaded.full_state_dict()
    out["continued"] = arrays(again) if isinstance(again, dict) else again
    out["ref_continued"] = arrays(reference(ctx.size, MORE_STEPS, ref.state_dict()).state_dict())
    return out


STAGES = {"zero2": zero2, "zero3": zero3, "state_dict": state_dict}


def probe(student, ctx, stages, gloo_timeout):
    """Run ``stages``; ``{stage: result}`` (``{"todo": function}`` where the student's code
    raised NotImplementedError), and ``"hidden"``: collectives that bypassed the recorder."""
    dist.init_process_group("gloo", rank=ctx.rank, world_size=ctx.size,
                            timeout=datetime.timedelta(seconds=gloo_timeout))
    start()
    rec = Recorder()
    rec.install(student)
    results = {}
    try:
        for stage in stages:
            try:
                results[stage] = STAGES[stage](student, ctx, rec)
            except NotImplementedError as exc:
                results[stage] = not_implemented(student, exc)
    finally:
        rec.uninstall()
    results["hidden"] = rec.take_hidden()
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return results
