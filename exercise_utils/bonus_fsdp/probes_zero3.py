"""The ZeRO-3 and state-dict stages of notebook 09's probe (see :mod:`.probes`).

Used in 09_bonus_fsdp.
"""
import gc

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .memory import Witness, alive_bytes
from .nets import (EDGE_STEPS, MEASURED_STEP, MORE_STEPS, OPTIM, STEPS, arrays,
                   combined, edge_combined, edge_local, edge_model, edge_units, gathered, local,
                   make_model, registrations, tensors)

LEAVES = {"emb": ("weight",), "blocks.0.fc": ("weight", "bias"),
          "blocks.1.fc": ("weight", "bias"), "blocks.2.fc": ("weight", "bias"),
          "blocks.3.fc": ("weight", "bias"), "head": ("bias", "weight")}


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
    """``STEPS`` steps with the student's Zero3; (wrapped model, optimizer, the trainable
    registrations of the model, {per-step records, samples, after_forward})."""
    gc.collect()
    base = alive_bytes()
    model = make_model()
    regs = registrations(model)
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
        forward, left_forward = rec.take(), gathered(regs)
        loss.backward()
        backward = rec.take()
        witness.clear()
        opt.step()
        del loss
        gc.collect()
        steps.append({"forward": forward, "backward": backward, "step": rec.take(),
                      "alive": alive_bytes() - base, "gathered": left_forward + gathered(regs)})
    for h in handles:
        h.remove()
    return wrapped, opt, regs, {"steps": steps, "samples": samples,
                                "after_forward": after_forward}


def _zero3_edge(student, ctx, dtype, micro=1):
    """EdgeNet through Zero3 (units :data:`EDGE_UNITS`): outputs after ``EDGE_STEPS`` steps of
    ``micro`` backward passes each, the reference's, and the attributes left gathered."""
    model = edge_model(0, dtype)
    regs = registrations(model)
    wrapped = student.Zero3(model, edge_units(model))
    opt = torch.optim.SGD(wrapped.parameters(), **OPTIM)
    left = []
    for step in range(EDGE_STEPS):
        opt.zero_grad()
        for m in range(micro):
            x, y = edge_local(step, m, ctx, dtype)
            F.cross_entropy(wrapped(x), y).backward()
            left += gathered(regs)
        opt.step()
    x, _ = edge_combined(EDGE_STEPS, 0, ctx.size, dtype)
    return {"outputs": wrapped(x).detach().numpy().copy(), "gathered": sorted(set(left))}


def zero3(student, ctx, rec):
    ctx.case("zero3-collectives")
    wrapped, opt, regs, out = train3(student, ctx, rec, measure=True)
    shards = {f"shard{i}": p for i, p in enumerate(wrapped.parameters())}
    out["shard_numels"] = sorted(p.numel() for p in shards.values() if p.requires_grad)
    x, _ = combined(STEPS, ctx.size)
    out["outputs"] = wrapped(x).detach().numpy().copy()
    del wrapped, opt, shards
    for case, dtype, micro in (("zero3-features", "float32", 1),
                               ("zero3-float64", "float64", 1),
                               ("zero3-accumulate", "float32", 2)):
        ctx.case(case)
        out[case] = _zero3_edge(student, ctx, dtype, micro)
    return out


# ---------------------------------------------------------------- state dict
def _full(wrapped, regs):
    """``full_state_dict()`` as data, and what it left behind: the attributes still gathered and
    the bytes alive above what was alive before it (its result dropped)."""
    gc.collect()
    before = alive_bytes()
    full = wrapped.full_state_dict()
    out = {"kind": type(full).__name__,
           "state": tensors(full) if isinstance(full, dict) else None}
    del full
    gc.collect()
    out["left"] = {"gathered": gathered(regs), "extra": alive_bytes() - before}
    return out


def _load(wrapped, model, regs, state):
    """``load_full_state_dict(state)``: what it left behind and whether it kept the shards
    (the objects and memory ``parameters()`` yields), frozen parameters and buffers in place."""
    def places():
        return ([(id(p), p.data_ptr()) for p in wrapped.parameters()],
                {k: v.data_ptr() for k, v in model.state_dict(keep_vars=True).items()})
    before_places = places()
    gc.collect()
    before = alive_bytes()
    wrapped.load_full_state_dict(state)
    gc.collect()
    extra = alive_bytes() - before
    params, others = places()
    moved = [k for k, ptr in before_places[1].items() if others.get(k) != ptr]
    return {"left": {"gathered": gathered(regs), "extra": extra},
            "shards_kept": params == before_places[0], "moved": moved}


def _broadcast(rec, ctx, state):
    box = [{k: torch.from_numpy(v) for k, v in state["arrays"].items()}
           if ctx.rank == 0 and state and "arrays" in state else None]
    with rec.paths.sanctioned():             # the probe's own message: not the student's
        dist.broadcast_object_list(box, src=0)
    return box[0]


def state_dict(student, ctx, rec):
    ctx.case("state-rank0")
    wrapped, opt, regs, _ = train3(student, ctx, rec, measure=False)
    out = {"full": _full(wrapped, regs)}
    state = _broadcast(rec, ctx, out["full"]["state"])
    if state is None or set(state) != set(make_model().state_dict()):
        return out                        # the checker reports the keys; nothing to load
    ctx.case("state-load")
    model2 = make_model(seed=1)
    regs2 = registrations(model2)
    loaded = student.Zero3(model2, list(model2.blocks))
    opt2 = torch.optim.SGD(loaded.parameters(), **OPTIM)     # built before the load
    out["load"] = _load(loaded, model2, regs2, state)
    for step in range(STEPS, STEPS + MORE_STEPS):
        opt2.zero_grad()
        x, y = local(step, ctx)
        F.cross_entropy(loaded(x), y).backward()
        opt2.step()
    again = loaded.full_state_dict()
    out["continued"] = arrays(again) if isinstance(again, dict) else again
    del loaded, opt2, again
    ctx.case("state-float64")
    out["edge"] = _state_edge(student, ctx, rec)
    return out


def _state_edge(student, ctx, rec):
    """A float64 EdgeNet: its full state dict after ``EDGE_STEPS`` steps, and the full state
    dict of another seed's model after loading that one."""
    model = edge_model(0, "float64")
    wrapped = student.Zero3(model, edge_units(model))
    opt = torch.optim.SGD(wrapped.parameters(), **OPTIM)
    for step in range(EDGE_STEPS):
        opt.zero_grad()
        x, y = edge_local(step, 0, ctx, "float64")
        F.cross_entropy(wrapped(x), y).backward()
        opt.step()
    full = wrapped.full_state_dict()
    out = {"full": tensors(full) if isinstance(full, dict) else None}
    state = _broadcast(rec, ctx, out["full"])
    if state is None:
        return out
    model2 = edge_model(1, "float64")
    loaded = student.Zero3(model2, edge_units(model2))
    loaded.load_full_state_dict(state)
    again = loaded.full_state_dict()
    out["reloaded"] = tensors(again) if isinstance(again, dict) else None
    return out
