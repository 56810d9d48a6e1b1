"""Stage "checkpoint" of notebook 07's probe (see :mod:`.probes`): it continues from the
baseline, float64 and EdgeNet runs of stage "sharded".

Baseline: ``state_dict()`` before any consolidation; ``consolidate_state_dict()`` (``to``
left at its default), then ``to=size - 1``; the first group's lr halved on both optimizers,
two more steps, the lr halved again (a scheduler's step, with no ``step()`` after it),
``consolidate_state_dict(to=1 % size)`` (what every rank's ``state_dict()``
gives after each); then a fresh ``ShardedOptimizer`` (built with both groups and a wrong
learning rate) loads the unsharded optimizer's state dict, another the consolidated one (sent
from rank ``to`` to every rank), and both train on beside the reference. Float64 and EdgeNet:
``consolidate_state_dict()``, and a fresh optimizer that loads the consolidated state dict
trains on. Switch (a branch of the forward per step): consolidated when two branches never had
a gradient; it trains on while one of them gets its first gradient and consolidates again; a
fresh optimizer loads the first state dict, trains the same steps (beside a copy of the
reference as it was then) and consolidates: a consolidation after a resume.

Used in 07_bonus_zero_sharding.
"""
import copy

import torch
import torch.distributed as dist

from .probes_base import (ADAMW, HEAD, LR, MORE_STEPS, SHORT, STEPS, WEIGHT_DECAY, arrays,
                          groups_info, lockstep, measure_state, named)


def state_dict(opt):
    """``(record, raw)``: ``state_dict()`` as comparable data (or what it raised), and as
    returned (None if it raised)."""
    try:
        raw = opt.state_dict()
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported by the checker
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}, None
    try:
        return {"ok": arrays(raw)}, raw
    except Exception:  # noqa: BLE001 - not in the unsharded optimizer's format
        return {"bad": repr(raw)[:300]}, raw


def unloadable(raw, ref):
    """Why the state dict ``raw`` cannot be loaded where ``ref``'s (the unsharded optimizer's)
    can, or None: the same entries, tensors where it has tensors, of their shapes, the same
    group sizes. (Its values are the checker's business: a wrong one is loaded all the same.)"""
    if raw is None:
        return "state_dict() gave none"
    try:
        for index, entry in ref["state"].items():
            for key, value in entry.items():
                got = raw["state"][index][key]
                if torch.is_tensor(value) and not (torch.is_tensor(got) and
                                                   got.shape == value.shape):
                    return (f"state[{index}][{key!r}] is a {type(got).__name__}, not a tensor "
                            f"of shape {tuple(value.shape)} as the unsharded optimizer's")
        if len(raw["state"]) != len(ref["state"]) or \
                [len(g["params"]) for g in raw["param_groups"]] != \
                [len(g["params"]) for g in ref["param_groups"]]:
            return "its entries or its groups are not the unsharded optimizer's"
    except Exception as exc:  # noqa: BLE001 - a missing entry, not a dict, ...
        return f"reading it as the unsharded optimizer's format raised {type(exc).__name__}: {exc}"
    return None


def consolidated(ctx, opt, ref, to=None):
    """Consolidate (``to`` given, or left at its default 0): ``(record, saved)``, what
    ``state_dict()`` gave here (and the reference's), and the state dict rank ``to`` returned,
    sent to every rank if it can be loaded (else None, and the record says why not)."""
    if to is None:
        opt.consolidate_state_dict()
    else:
        opt.consolidate_state_dict(to=to)
    record, raw = state_dict(opt)
    to, ref_sd = 0 if to is None else to, ref.state_dict()
    box = [(raw, unloadable(raw, ref_sd)) if ctx.rank == to else None]
    dist.broadcast_object_list(box, src=to)
    saved, why = box[0]
    return {"to": to, "got": record, "ref": arrays(ref_sd), "unloadable": why}, \
        (None if why else saved)


def fresh(student, model, groups):
    """A new sharded optimizer over ``groups`` of ``model``, with a wrong learning rate."""
    return student.ShardedOptimizer(groups(model), torch.optim.AdamW, lr=10 * LR,
                                    weight_decay=WEIGHT_DECAY)


def _two_groups(model):
    return [{"params": list(model.body.parameters())},
            {"params": list(model.head.parameters()), **HEAD}]


def baseline(student, ctx, objects):
    """The baseline run's optimizer: consolidations, then loads of both kinds of state dict."""
    ref_model, ref, model, opt = objects
    ctx.case("state-dict-raises")
    out = {"before": state_dict(opt)[0]}
    ctx.case("consolidate-values")
    out["default"], _ = consolidated(ctx, opt, ref)
    ctx.case("consolidate-to")
    out["last"], _ = consolidated(ctx, opt, ref, ctx.size - 1)
    ctx.case("consolidate-fresh")
    for group in (ref.param_groups[0], opt.param_groups[0]):
        group["lr"] *= 0.5
    out["seen"] = []               # the gradients given (the judge replays the reference)
    for step in range(STEPS, STEPS + 2):
        lockstep(ctx, "net", "float32", step, ref_model, ref, [(model, opt)], seen=out["seen"])
        opt.zero_grad()
    for group in (ref.param_groups[0], opt.param_groups[0]):   # a scheduler's step, and the
        group["lr"] *= 0.5          # consolidation before the next step(): its lr is the new one
    out["fresh"], saved = consolidated(ctx, opt, ref, 1 % ctx.size)
    ctx.case("load-values")
    model2 = copy.deepcopy(ref_model)
    opt2 = fresh(student, model2, _two_groups)
    opt2.load_state_dict(copy.deepcopy(ref.state_dict()))   # as from a file: no shared tensors
    out["loaded_state"] = measure_state(opt2, model2)
    out["loaded_groups"] = groups_info(opt2.param_groups, model2)
    out["ref_groups"] = groups_info(ref.param_groups, ref_model)
    followers, cases = [(model2, opt2)], ["load-values"]
    if saved is not None:
        ctx.case("load-round-trip")
        model3 = copy.deepcopy(ref_model)
        opt3 = fresh(student, model3, _two_groups)
        opt3.load_state_dict(saved)
        followers.append((model3, opt3))
        cases.append("load-round-trip")
    for step in range(STEPS + 2, STEPS + 2 + MORE_STEPS):
        lockstep(ctx, "net", "float32", step, ref_model, ref, followers, cases, out["seen"])
        for _, o in followers:
            o.zero_grad()
    out["loaded_final"], out["ref_final"] = named(model2), named(ref_model)
    out["trip_final"] = named(followers[-1][0]) if saved is not None else None
    return out


def round_trip(student, ctx, kind, dtype, objects):
    """Consolidate on rank 0; a fresh optimizer loads the consolidated state dict and trains
    on beside the reference."""
    ref_model, ref, model, opt = objects
    out, saved = consolidated(ctx, opt, ref)
    if saved is None:
        return out
    model3 = copy.deepcopy(ref_model)
    opt3 = student.ShardedOptimizer(list(model3.parameters()), torch.optim.AdamW,
                                    **{**ADAMW, "lr": 10 * LR})
    opt3.load_state_dict(saved)
    out["seen"] = []
    for step in range(SHORT + 1, SHORT + 3):
        lockstep(ctx, kind, dtype, step, ref_model, ref, [(model3, opt3)], seen=out["seen"])
        opt3.zero_grad()
    out["final"], out["ref_final"] = named(model3), named(ref_model)
    return out


def switching(student, ctx, objects):
    """The Switch run after its SHORT steps (``c`` and ``spare`` never had a gradient, so they
    have no state): consolidate on rank 0; 2 more steps (``c``'s first gradient in the first,
    ``b``'s in the second) and consolidate again (``to=size - 1``); then a fresh optimizer
    loads the first state dict and takes the same 2 steps beside a copy of the reference as it
    was at the first consolidation, and consolidates (``to=1 % size``): a consolidation after a
    resume."""
    ref_model, ref, model, opt = objects
    first, saved = consolidated(ctx, opt, ref)
    out = {"first": first, "seen": []}
    start = copy.deepcopy(ref_model)                 # the reference at the first consolidation
    state = copy.deepcopy(ref.state_dict())
    for step in range(SHORT + 1, SHORT + 3):
        lockstep(ctx, "switch", "float32", step, ref_model, ref, [(model, opt)], seen=out["seen"])
        opt.zero_grad()
    out["again"], _ = consolidated(ctx, opt, ref, ctx.size - 1)
    out["final"], out["ref_final"] = named(model), named(ref_model)
    if saved is not None:
        ctx.case("checkpoint-resumed")
        out.update(_resumed(student, ctx, start, state, saved))
    return out


def _resumed(student, ctx, ref_model, state, saved):
    """A fresh optimizer loads ``saved`` and trains the 2 steps of :func:`switching` beside the
    reference ``ref_model`` (with the optimizer state ``state``), then consolidates."""
    ref = torch.optim.AdamW(ref_model.parameters(), **ADAMW)
    ref.load_state_dict(state)
    model = copy.deepcopy(ref_model)
    opt = student.ShardedOptimizer(list(model.parameters()), torch.optim.AdamW,
                                   **{**ADAMW, "lr": 10 * LR})
    opt.load_state_dict(saved)
    for step in range(SHORT + 1, SHORT + 3):
        lockstep(ctx, "switch", "float32", step, ref_model, ref, [(model, opt)])
        opt.zero_grad()
    record, _ = consolidated(ctx, opt, ref, 1 % ctx.size)
    return {"resumed": record, "trip_final": named(model), "trip_ref": named(ref_model)}


def checkpoint(student, ctx, objects):
    """Stage "checkpoint": ``{"net": ..., "float64": ..., "edge": ...}`` (see the module)."""
    out = {"net": baseline(student, ctx, objects["net"])}
    ctx.case("checkpoint-float64")
    out["float64"] = round_trip(student, ctx, "net", "float64", objects["float64"])
    ctx.case("checkpoint-edge")
    out["edge"] = round_trip(student, ctx, "edge", "float32", objects["edge"])
    ctx.case("checkpoint-varying")
    out["switch"] = switching(student, ctx, objects["switch"])
    return out
