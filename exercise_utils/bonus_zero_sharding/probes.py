"""Probe of notebook 07's checkers: runs inside every rank (see :mod:`.checks`).

The probe trains the same model twice on every rank from the same start: with the student's
``ShardedOptimizer(params, torch.optim.AdamW, ...)`` and with the unsharded ``torch.optim.AdamW``
(the reference). The reference model's gradients are computed on each rank's own batch and
averaged over the ranks (the job of DDP, which ``ShardedOptimizer`` assumes done); the student's
model gets copies of them, so both optimizers see bitwise the same gradients. After
``ADD_AT`` steps the head's parameters are added to both as a new group with their own
learning rate and no weight decay (``add_param_group``). Measured on each rank: the elements of
every tensor in the state of every ``torch.optim.Optimizer`` the sharded optimizer holds
(``optim`` or any other attribute, and its own ``state``), per parameter; and what
``partition_parameters`` returns for the cases ``PARTITIONS``. Then a learning-rate
scheduler: a fresh copy of the model trains ``SCHED_STEPS`` steps with each optimizer under
``torch.optim.lr_scheduler.StepLR(**SCHED)`` (the scheduler must accept the sharded optimizer,
a ``torch.optim.Optimizer``, and its ``lr`` must reach the local optimizer).

Stage "checkpoint" continues: ``consolidate_state_dict(to=size - 1)`` on every rank, then
``state_dict()`` on that rank (compared by the checker with the reference's); a fresh
``ShardedOptimizer`` (built with both groups and a wrong learning rate) loads the reference's
state dict (the unsharded format) and trains on; it must follow the reference.

Used in 07_bonus_zero_sharding.
"""
import copy
import datetime
import gc

import torch
import torch._dynamo  # noqa: F401 - the ranks' optimizers need it: imported once, before they fork
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..rankworker import not_implemented

WIDTH, BLOCKS, CLASSES = 16, 5, 6    # body: 5 x Linear(16, 16) + Tanh; head: Linear(16, 6)
LOCAL_BATCH = 8
STEPS, ADD_AT, MORE_STEPS = 10, 5, 3  # steps; the head's group is added before step ADD_AT
LR, WEIGHT_DECAY = 0.01, 0.1          # AdamW defaults given to both optimizers
HEAD = {"lr": 0.02, "weight_decay": 0.0}   # the hyper-parameters of the added group
SCHED, SCHED_STEPS = {"step_size": 2, "gamma": 0.5}, 5   # StepLR: lr halved every 2 steps
PARTITIONS = [([1, 1, 10], 2, None), ([4, 4, 4, 4], 3, [0, 0, 5]),   # partition_parameters'
              ([3, 5, 5, 2, 8], 2, [6, 0])]            # (numels, world_size, loads) cases


class Net(nn.Module):
    """The probe's model: parameter sizes that a size-balanced partition splits within 10%,
    and where the head's group, added later, goes to the least-loaded ranks."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(*[m for _ in range(BLOCKS)
                                    for m in (nn.Linear(WIDTH, WIDTH), nn.Tanh())])
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x):
        return self.head(self.body(x))


def make_model():
    torch.manual_seed(0)
    return Net()


def numels():
    """{name: elements} of every parameter of the probe's model, in order."""
    return {n: p.numel() for n, p in make_model().named_parameters()}


def batch(step, rank):
    g = torch.Generator().manual_seed(1009 * step + 31 * rank + 3)
    return (torch.randn(LOCAL_BATCH, WIDTH, generator=g),
            torch.randint(0, CLASSES, (LOCAL_BATCH,), generator=g))


def named(model):
    return {k: v.detach().cpu().numpy().copy() for k, v in model.named_parameters()}


def optimizers(obj):
    """Every torch.optim.Optimizer among ``obj``'s attributes (and in its lists and dicts)."""
    found = []
    for value in vars(obj).values():
        items = value.values() if isinstance(value, dict) else (
            value if isinstance(value, (list, tuple)) else [value])
        found += [v for v in items if isinstance(v, torch.optim.Optimizer)]
    return list({id(o): o for o in found}.values())


def measure_state(sharded, model):
    """{parameter name (or "<other>"): elements of the state tensors kept for it}: measured
    over every optimizer the sharded optimizer holds."""
    names = {id(p): n for n, p in model.named_parameters()}
    own = [sharded] if isinstance(sharded, torch.optim.Optimizer) else []
    out = {}
    for opt in optimizers(sharded) + own:
        for key, state in opt.state.items():
            name = names.get(id(key), "<other>")
            elems = sum(v.numel() for v in state.values() if isinstance(v, torch.Tensor))
            if elems:
                out[name] = out.get(name, 0) + elems
    return out


def arrays(state_dict):
    """An optimizer state dict with numpy arrays / floats (picklable, comparable)."""
    def conv(v):
        if isinstance(v, torch.Tensor):
            return v.detach().cpu().numpy().copy()
        return v
    return {"state": {int(i): {k: conv(v) for k, v in s.items()}
                      for i, s in state_dict["state"].items()},
            "param_groups": [{k: (list(v) if k == "params" else v) for k, v in g.items()}
                             for g in state_dict["param_groups"]]}


def _average_grads(model, size):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad.div_(size)


def _one_step(ctx, step, ref_model, ref, model, opt):
    """Gradients on the reference model (averaged), copied to the student's model; both step."""
    ref_model.zero_grad(set_to_none=True)
    x, y = batch(step, ctx.rank)
    F.cross_entropy(ref_model(x), y).backward()
    _average_grads(ref_model, ctx.size)
    with torch.no_grad():
        for p, q in zip(model.parameters(), ref_model.parameters()):
            p.grad = q.grad.clone()
    opt.step()
    ref.step()


def train(student, ctx):
    """STEPS steps of both optimizers; the head's group added before step ADD_AT."""
    ref_model = make_model()
    model = copy.deepcopy(ref_model)
    init = named(model)
    ref = torch.optim.AdamW(list(ref_model.body.parameters()), lr=LR, weight_decay=WEIGHT_DECAY)
    opt = student.ShardedOptimizer(list(model.body.parameters()), torch.optim.AdamW, lr=LR,
                                   weight_decay=WEIGHT_DECAY)
    stale_grads = []
    for step in range(STEPS):
        if step == ADD_AT:
            ref.add_param_group({"params": list(ref_model.head.parameters()), **HEAD})
            opt.add_param_group({"params": list(model.head.parameters()), **HEAD})
        _one_step(ctx, step, ref_model, ref, model, opt)
        opt.zero_grad()
        given = model if step >= ADD_AT else model.body      # the optimizer's parameters
        stale_grads += [f"body.{n}" if step < ADD_AT else n for n, p in given.named_parameters()
                        if p.grad is not None and bool(p.grad.abs().sum() > 0)]
    result = {"init": init, "final": named(model), "ref": named(ref_model),
              "partitions": [list(student.partition_parameters(list(n), w, loads and list(loads)))
                             for n, w, loads in PARTITIONS],
              "state": measure_state(opt, model), "optimizers": len(optimizers(opt)),
              "stale_grads": sorted(set(stale_grads))}
    return result, (ref_model, ref, model, opt)


def scheduled(student, ctx):
    """SCHED_STEPS steps of both optimizers on a fresh model, each under a StepLR(**SCHED):
    ``{"lrs", "ref_lrs"}`` (the groups' lr after each scheduler step), ``{"final", "ref"}``,
    or ``{"error"}`` when the scheduler rejects the sharded optimizer."""
    ref_model = make_model()
    model = copy.deepcopy(ref_model)
    ref = torch.optim.AdamW(ref_model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    opt = student.ShardedOptimizer(list(model.parameters()), torch.optim.AdamW, lr=LR,
                                   weight_decay=WEIGHT_DECAY)
    try:
        sched = torch.optim.lr_scheduler.StepLR(opt, **SCHED)
    except Exception as exc:  # noqa: BLE001 - reported by the checker (the same on every rank)
        return {"error": f"{type(exc).__name__}: {exc}"}
    ref_sched = torch.optim.lr_scheduler.StepLR(ref, **SCHED)
    out = {"lrs": [], "ref_lrs": []}
    for step in range(SCHED_STEPS):
        _one_step(ctx, step, ref_model, ref, model, opt)
        sched.step()
        ref_sched.step()
        opt.zero_grad()
        out["lrs"].append([float(g["lr"]) for g in opt.param_groups])
        out["ref_lrs"].append([float(g["lr"]) for g in ref.param_groups])
    return {**out, "final": named(model), "ref": named(ref_model)}


def checkpoint(student, ctx, objects):
    """Consolidate on the last rank; load the reference's state into a fresh sharded optimizer."""
    ref_model, ref, model, opt = objects
    to = ctx.size - 1
    opt.consolidate_state_dict(to=to)
    out = {"to": to, "consolidated": arrays(opt.state_dict()) if ctx.rank == to else None,
           "ref_state": arrays(ref.state_dict())}
    model2 = copy.deepcopy(ref_model)
    groups = [{"params": list(model2.body.parameters())},
              {"params": list(model2.head.parameters()), **HEAD}]
    opt2 = student.ShardedOptimizer(groups, torch.optim.AdamW, lr=10 * LR,
                                    weight_decay=WEIGHT_DECAY)
    opt2.load_state_dict(copy.deepcopy(ref.state_dict()))   # as from a file: no shared tensors
    out["loaded_state"] = measure_state(opt2, model2)
    for step in range(STEPS, STEPS + MORE_STEPS):
        _one_step(ctx, step, ref_model, ref, model2, opt2)
        opt2.zero_grad()
    out["loaded_final"], out["ref_final"] = named(model2), named(ref_model)
    return out


def probe(student, ctx, stages, gloo_timeout):
    """Run ``stages`` ("sharded", and "checkpoint" after it); ``{stage: result}``, a result
    being ``{"todo": function}`` where the student's code raised NotImplementedError."""
    dist.init_process_group("gloo", rank=ctx.rank, world_size=ctx.size,
                            timeout=datetime.timedelta(seconds=gloo_timeout))
    results = {}
    try:
        sharded, objects = train(student, ctx)
        sharded["scheduler"] = scheduled(student, ctx)
    except NotImplementedError as exc:
        sharded, objects = not_implemented(student, exc), None
    results["sharded"] = sharded
    if "checkpoint" in stages:
        try:
            results["checkpoint"] = checkpoint(student, ctx, objects) if objects else sharded
        except NotImplementedError as exc:
            results["checkpoint"] = not_implemented(student, exc)
    del objects
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return results
