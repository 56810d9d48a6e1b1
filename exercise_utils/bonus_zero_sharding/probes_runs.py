"""The runs of stage "sharded" of notebook 07's probe (see :mod:`.probes`): the baseline, then
one dimension changed at a time, each under its own check case (``ctx.case``).

Used in 07_bonus_zero_sharding.
"""
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .probes_base import (ADAMW, ADD_AT, BUILT, HEAD, SCHED, SCHED_STEPS, SGD, SHORT, STEPS,
                          CountingAdamW, CountingSGD, _elements, averaged_grads, batch,
                          copy_grads, grad_states, grads_of, groups_info, lockstep, make_model,
                          measure_state, named, optimizers)


def _listed(model):
    return list(model.parameters())


# The runs made with :func:`follow`, by name: its arguments (the judge replays the same
# reference from them: :mod:`.replay`).
RUNS = {
    "float64": dict(dtype="float64"),
    "edge": dict(kind="edge"),
    "switch": dict(kind="switch"),
    "empty": dict(kind="tiny", params=lambda m: [m[0].weight],
                  adds=[(1, lambda m: {"params": [m[2].weight]})]),
    "sgd": dict(cls=CountingSGD, ref_cls=torch.optim.SGD, hyper=SGD),
    "generator": dict(params=lambda m: m.parameters()),
    "dicts": dict(params=lambda m: [{"params": list(m.body.parameters())},
                                    {"params": list(m.head.parameters()), **HEAD}]),
    "tensor_group": dict(params=lambda m: list(m.body.parameters()),
                         adds=[(1, lambda m: {"params": m.head.weight, **HEAD}),
                               (2, lambda m: {"params": m.head.bias})]),
}


def local_info(opt, model):
    """How many optimizers the sharded one holds, and the groups of its local one (``optim``,
    else the only one found)."""
    found = optimizers(opt)
    local = getattr(opt, "optim", None)
    if not isinstance(local, torch.optim.Optimizer):
        local = found[0] if len(found) == 1 else None
    return {"count": len(found),
            "groups": None if local is None else groups_info(local.param_groups, model)}


def _summary(opt, model, ref, ref_model, grads, seen):
    own = opt.state.values() if isinstance(opt, torch.optim.Optimizer) else []
    return {"final": named(model), "ref": named(ref_model), "built": len(BUILT), "seen": seen,
            "dtypes": {n: str(p.dtype).replace("torch.", "") for n, p in model.named_parameters()},
            "state": measure_state(opt, model), "own_state": sum(_elements(s) for s in own),
            "groups": groups_info(opt.param_groups, model) if hasattr(opt, "param_groups")
            else None, "ref_groups": groups_info(ref.param_groups, ref_model),
            "local": local_info(opt, model), "grads": grads}


def baseline(student, ctx):
    """STEPS steps of both optimizers (CountingAdamW for the student's); the head's group
    added before step ADD_AT with its own hyper-parameters; the gradients of the optimizer's
    parameters after each ``zero_grad()``."""
    ref_model = make_model()
    model = copy.deepcopy(ref_model)
    init = named(model)
    ref = torch.optim.AdamW(list(ref_model.body.parameters()), **ADAMW)
    del BUILT[:]
    opt = student.ShardedOptimizer(list(model.body.parameters()), CountingAdamW, **ADAMW)
    grads, seen = [], []
    for step in range(STEPS):
        if step == ADD_AT:
            ctx.case("add-group-hyper")
            ref.add_param_group({"params": list(ref_model.head.parameters()), **HEAD})
            opt.add_param_group({"params": list(model.head.parameters()), **HEAD})
            ctx.case("step-values")
        lockstep(ctx, "net", "float32", step, ref_model, ref, [(model, opt)], seen=seen)
        opt.zero_grad()
        given, prefix = (model, "") if step >= ADD_AT else (model.body, "body.")
        grads.append(grad_states((prefix + n, p) for n, p in given.named_parameters()))
    return {"init": init, **_summary(opt, model, ref, ref_model, grads, seen)}, \
        (ref_model, ref, model, opt)


def follow(student, ctx, kind="net", dtype="float32", params=_listed, cls=CountingAdamW,
           ref_cls=torch.optim.AdamW, hyper=ADAMW, adds=()):
    """SHORT steps of both optimizers built over ``params(model)``; ``adds``: (step, group of
    the model) pairs added before that step; ``zero_grad()`` after each step."""
    ref_model = make_model(kind, dtype)
    model = copy.deepcopy(ref_model)
    ref = ref_cls(params(ref_model), **hyper)
    del BUILT[:]
    opt = student.ShardedOptimizer(params(model), cls, **hyper)
    grads, seen = [], []
    for step in range(SHORT):
        for at, group in adds:
            if step == at:
                ref.add_param_group(group(ref_model))
                opt.add_param_group(group(model))
        lockstep(ctx, kind, dtype, step, ref_model, ref, [(model, opt)], seen=seen)
        opt.zero_grad()
        grads.append(grad_states(model.named_parameters()))
    return _summary(opt, model, ref, ref_model, grads, seen), (ref_model, ref, model, opt)


def zeros(ctx, kind, dtype, objects):
    """Gradients given again, then ``zero_grad(set_to_none=False)``: the gradients' states,
    and the parameters that had one."""
    ref_model, _, model, opt = objects
    x, y = batch(kind, SHORT, ctx.rank, dtype)
    averaged_grads(ctx, ref_model, x, y)
    copy_grads(model, ref_model)
    opt.zero_grad(set_to_none=False)
    had = [n for n, p in ref_model.named_parameters() if p.grad is not None]
    return {"got": grad_states(model.named_parameters()), "had": had}


def with_closure(student, ctx):
    """SHORT steps of both optimizers, each ``step(closure)`` with a closure that computes the
    loss and the averaged gradients: what ``step`` returned, and how often the closure ran."""
    ref_model = make_model()
    model = copy.deepcopy(ref_model)
    ref = torch.optim.AdamW(ref_model.parameters(), **ADAMW)
    opt = student.ShardedOptimizer(list(model.parameters()), torch.optim.AdamW, **ADAMW)
    out = {"calls": [], "returned": [], "seen": []}
    for step in range(SHORT):
        x, y = batch("net", step, ctx.rank)

        def closure(m, log):
            for p in m.parameters():
                p.grad = None
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            for p in m.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(ctx.size)
            log.append(loss)
            if m is ref_model:
                out["seen"].append(grads_of(m))
            return loss
        mine, theirs = [], []
        got = opt.step(lambda: closure(model, mine))
        ref.step(lambda: closure(ref_model, theirs))
        out["calls"].append(len(mine))
        out["returned"].append({"type": type(got).__name__,
                                "same": bool(mine) and got is mine[-1],
                                "value": float(got) if isinstance(got, torch.Tensor) and
                                got.numel() == 1 else None,
                                "loss": float(mine[-1]) if mine else None})
    return {**out, "final": named(model), "ref": named(ref_model)}


def scheduled(student, ctx):
    """SCHED_STEPS steps of both optimizers on a fresh model, each under a StepLR(**SCHED):
    ``{"lrs", "ref_lrs"}`` (the groups' lr after each scheduler step), ``{"final", "ref"}``,
    or ``{"error"}`` when the scheduler rejects the sharded optimizer."""
    ref_model = make_model()
    model = copy.deepcopy(ref_model)
    ref = torch.optim.AdamW(ref_model.parameters(), **ADAMW)
    opt = student.ShardedOptimizer(list(model.parameters()), torch.optim.AdamW, **ADAMW)
    try:
        sched = torch.optim.lr_scheduler.StepLR(opt, **SCHED)
    except Exception as exc:  # noqa: BLE001 - reported by the checker (the same on every rank)
        return {"error": f"{type(exc).__name__}: {exc}"}
    ctx.case("scheduler-values")
    ref_sched = torch.optim.lr_scheduler.StepLR(ref, **SCHED)
    out = {"lrs": [], "ref_lrs": [], "seen": []}
    for step in range(SCHED_STEPS):
        lockstep(ctx, "net", "float32", step, ref_model, ref, [(model, opt)], seen=out["seen"])
        sched.step()
        ref_sched.step()
        opt.zero_grad()
        out["lrs"].append([float(g["lr"]) for g in opt.param_groups])
        out["ref_lrs"].append([float(g["lr"]) for g in ref.param_groups])
    return {**out, "final": named(model), "ref": named(ref_model)}


def run_all(student, ctx):
    """Every run of stage "sharded": ``({run: result}, {run: objects for the checkpoint})``."""
    out, objects = {}, {}
    ctx.case("step-values")
    out["train"], objects["net"] = baseline(student, ctx)
    ctx.case("float64")
    out["float64"], objects["float64"] = follow(student, ctx, **RUNS["float64"])
    ctx.case("edge-model")
    out["edge"], objects["edge"] = follow(student, ctx, **RUNS["edge"])
    ctx.case("zero-grad-zeros")
    out["zeros"] = zeros(ctx, "edge", "float32", objects["edge"])
    ctx.case("step-varying")
    out["switch"], objects["switch"] = follow(student, ctx, **RUNS["switch"])
    ctx.case("step-closure")
    out["closure"] = with_closure(student, ctx)
    ctx.case("empty-rank")
    out["empty"], _ = follow(student, ctx, **RUNS["empty"])
    ctx.case("optimizer-cls")
    out["sgd"], _ = follow(student, ctx, **RUNS["sgd"])
    ctx.case("init-params")
    out["generator"], _ = follow(student, ctx, **RUNS["generator"])
    out["dicts"], _ = follow(student, ctx, **RUNS["dicts"])
    ctx.case("add-group-tensor")
    out["tensor_group"], _ = follow(student, ctx, **RUNS["tensor_group"])
    ctx.case("scheduler-accepts")
    out["scheduler"] = scheduled(student, ctx)
    return out, objects
