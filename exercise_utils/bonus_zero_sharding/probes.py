"""Probe of notebook 07's checkers: runs inside every rank (see :mod:`.checks`).

Every run trains a model twice on every rank from the same start: with the student's
``ShardedOptimizer(params, optimizer_cls, ...)`` and with the unsharded ``torch.optim``
optimizer (the reference). The reference model's gradients are computed on each rank's own
batch and averaged over the ranks (the job of DDP, which ``ShardedOptimizer`` assumes done);
the student's model gets copies of them, so both optimizers see bitwise the same gradients.

Stage "sharded" (:mod:`.probes_runs`), one check case at a time (``ctx.case``):
``partition_parameters`` on the cases of :func:`partition_cases`; the baseline (``Net``,
float32, AdamW, the head added with ``add_param_group`` and its own hyper-parameters before
step ``ADD_AT``; the optimizer state MEASURED in every ``torch.optim.Optimizer`` the sharded
optimizer holds; the gradients after each ``zero_grad()``; the groups, full and local); then
one dimension changed at a time: float64, :class:`~exercise_utils.models.EdgeNet` (frozen,
unused, tied, transposed and 0-d parameters; ``zero_grad(set_to_none=False)``),
:class:`Switch` (a branch of the forward that has a gradient at one step and none at the next),
``step(closure)``,
a rank that owns no parameter, SGD as ``optimizer_cls``, a generator or dicts as ``params``, a
group given as one tensor, and a ``StepLR`` scheduler.

Stage "checkpoint" (:mod:`.probes_checkpoint`) continues from the baseline, float64,
EdgeNet and Switch runs: ``state_dict()`` before any consolidation, ``consolidate_state_dict``
to each rank in turn and again after more steps, ``load_state_dict`` of the unsharded
optimizer's and of the consolidated state dict, then more steps (and a consolidation again
after such a resume, on Switch).

Used in 07_bonus_zero_sharding.
"""
import datetime
import gc
import random

import torch
import torch._dynamo  # noqa: F401 - the ranks' optimizers need it: imported once, before they fork
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..models import EdgeNet
from ..rankworker import not_implemented

WIDTH, BLOCKS, CLASSES = 16, 5, 6    # body: 5 x Linear(16, 16) + Tanh; head: Linear(16, 6)
LOCAL_BATCH = 8
STEPS, ADD_AT, MORE_STEPS = 10, 5, 3  # steps; the head's group is added before step ADD_AT
SHORT = 3                             # steps of each run that changes one dimension
LR, WEIGHT_DECAY = 0.01, 0.1          # AdamW defaults given to both optimizers
ADAMW = {"lr": LR, "weight_decay": WEIGHT_DECAY}
HEAD = {"lr": 0.02, "weight_decay": 0.0}   # the hyper-parameters of the added group
SGD = {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}   # the optimizer_cls case
SCHED, SCHED_STEPS = {"step_size": 2, "gamma": 0.5}, 5   # StepLR: lr halved every 2 steps
INPUTS = {"net": (WIDTH, CLASSES), "edge": (6, 4), "tiny": (4, 3), "switch": (5, 3)}
BRANCHES = {1: "b", 4: "c", 5: "b"}   # Switch's branch at each step (else "a"): see branch()
BUILT = []                            # the optimizer_cls instances built (CountingAdamW, ...)


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


class Switch(nn.Module):
    """A model whose set of parameters with a gradient changes from step to step: the forward
    uses one of the branches ``a``, ``b``, ``c`` (the one the first input feature names: 0, 1
    or 2, the same in every row and on every rank: :func:`batch`); ``spare`` is never used."""

    def __init__(self):
        super().__init__()
        features, classes = INPUTS["switch"]
        self.inp = nn.Linear(features, 6)
        self.a, self.b, self.c, self.spare = (nn.Linear(6, 6) for _ in range(4))
        self.head = nn.Linear(6, classes)

    def forward(self, x):
        branch = (self.a, self.b, self.c)[int(x[0, 0].item())]
        return self.head(torch.tanh(branch(torch.tanh(self.inp(x)))))


def branch(step):
    """The branch of :class:`Switch` that the forward uses at ``step`` (0-based): "a" at steps
    0 and 2 (b has no gradient), "b" at 1 (a has none), "c" at 4 (its first gradient)."""
    return BRANCHES.get(step, "a")


class CountingAdamW(torch.optim.AdamW):
    """AdamW that counts its instances: ``optimizer_cls`` is built once per sharded optimizer."""

    def __init__(self, *args, **kwargs):
        BUILT.append(type(self).__name__)
        super().__init__(*args, **kwargs)


class CountingSGD(torch.optim.SGD):
    """SGD (momentum) that counts its instances, for the ``optimizer_cls`` case."""

    def __init__(self, *args, **kwargs):
        BUILT.append(type(self).__name__)
        super().__init__(*args, **kwargs)


def make_model(kind="net", dtype="float32"):
    """``Net`` ("net"), an :class:`EdgeNet` ("edge"), two bias-free layers ("tiny": fewer
    parameters than ranks) or a :class:`Switch` ("switch"), seeded, in ``dtype``."""
    torch.manual_seed(0)
    if kind == "edge":
        return EdgeNet(dtype=getattr(torch, dtype))
    if kind == "switch":
        return Switch().to(getattr(torch, dtype))
    if kind == "tiny":
        model = nn.Sequential(nn.Linear(4, 3, bias=False), nn.Tanh(), nn.Linear(3, 3, bias=False))
    else:
        model = Net()
    return model.to(getattr(torch, dtype))


def numels(kind="net"):
    """{name: elements} of every parameter of the probe's model, in order."""
    return {n: p.numel() for n, p in make_model(kind).named_parameters()}


def batch(kind, step, rank, dtype="float32"):
    features, classes = INPUTS[kind]
    g = torch.Generator().manual_seed(1009 * step + 31 * rank + 3)
    x = torch.randn(LOCAL_BATCH, features, generator=g).to(getattr(torch, dtype))
    if kind == "switch":
        x[:, 0] = "abc".index(branch(step))      # the branch Switch's forward uses
    return x, torch.randint(0, classes, (LOCAL_BATCH,), generator=g)


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


def _elements(state):
    return sum(v.numel() for v in state.values() if isinstance(v, torch.Tensor))


def measure_state(sharded, model):
    """{parameter name (or "<other>"): elements of the state tensors kept for it}: measured
    over every optimizer the sharded optimizer holds (its own ``state`` included)."""
    names = {id(p): n for n, p in model.named_parameters()}
    own = [sharded] if isinstance(sharded, torch.optim.Optimizer) else []
    out = {}
    for opt in optimizers(sharded) + own:
        for key, state in opt.state.items():
            name = names.get(id(key), "<other>")
            if _elements(state):
                out[name] = out.get(name, 0) + _elements(state)
    return out


def plain(value):
    """A hyper-parameter as plain, comparable data (tensors as floats, tuples as lists)."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    return value


def groups_info(groups, model):
    """Each group as ``{"hyper": {name: value}, "params": [parameter names] or a str}``."""
    names = {id(p): n for n, p in model.named_parameters()}
    out = []
    for group in groups:
        params = group.get("params")
        if isinstance(params, (list, tuple)):
            shown = [names.get(id(p), "<not a parameter of the model>") for p in params]
        else:
            shown = f"a {type(params).__name__}, not a list"
        out.append({"hyper": {k: plain(v) for k, v in group.items() if k != "params"},
                    "params": shown})
    return out


def grad_states(named_params):
    """{name: "none" | "zero" | "nonzero"} of the gradients."""
    return {n: "none" if p.grad is None else
            ("nonzero" if bool(p.grad.abs().sum() > 0) else "zero") for n, p in named_params}


def arrays(state_dict):
    """An optimizer state dict with numpy arrays / floats (picklable, comparable)."""
    def conv(v):
        if isinstance(v, torch.Tensor):
            return v.detach().cpu().numpy().copy()
        return v
    return {"state": {int(i): {k: conv(v) for k, v in s.items()}
                      for i, s in state_dict["state"].items()},
            "param_groups": [{k: (list(v) if k == "params" else plain(v)) for k, v in g.items()}
                             for g in state_dict["param_groups"]]}


# ---------------------------------------------------------------- one step of every optimizer
def averaged_grads(ctx, ref_model, x, y):
    """Gradients of the reference model on this rank's batch, averaged over the ranks."""
    ref_model.zero_grad(set_to_none=True)
    F.cross_entropy(ref_model(x), y).backward()
    for p in ref_model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(ctx.size)


def grads_of(model):
    """{name: gradient as an array, or None}: what the optimizers were given (the judge
    replays the unsharded optimizer on them, once it has verified them: :mod:`.replay`)."""
    return {n: None if p.grad is None else p.grad.detach().cpu().numpy().copy()
            for n, p in model.named_parameters()}


def copy_grads(model, ref_model):
    """The reference's gradients into ``model`` (a parameter without one keeps what it has)."""
    with torch.no_grad():
        for p, q in zip(model.parameters(), ref_model.parameters()):
            if q.grad is not None:
                p.grad = q.grad.clone()


def lockstep(ctx, kind, dtype, step, ref_model, ref, followers, cases=None, seen=None):
    """One step: averaged gradients on the reference, copied to each (model, sharded
    optimizer) of ``followers`` (each stepping under its check case of ``cases``, if given);
    every optimizer steps. ``seen``: a list the gradients given are appended to."""
    x, y = batch(kind, step, ctx.rank, dtype)
    averaged_grads(ctx, ref_model, x, y)
    if seen is not None:
        seen.append(grads_of(ref_model))
    for i, (model, opt) in enumerate(followers):
        if cases:
            ctx.case(cases[i])
        copy_grads(model, ref_model)
        opt.step()
    ref.step()


# ---------------------------------------------------------------- partition_parameters
def partition_cases():
    """(case, numels, world_size, loads) for ``partition_parameters``: distinct sizes (no
    ties) with more ranks than parameters and no parameter at all among them; ties in sizes
    and in loads; loads given."""
    rng = random.Random(7)
    cases = [("partition-greedy", [1, 2, 10], 2, None), ("partition-greedy", [3, 5, 8, 2], 2, None),
             ("partition-greedy", [], 3, None), ("partition-greedy", [5], 1, None),
             ("partition-greedy", [3, 9], 4, None), ("partition-greedy", [1, 2, 3, 10], 2, None)]
    for _ in range(30):
        n = rng.randint(0, 12)
        cases.append(("partition-greedy", rng.sample(range(1, 2000), n), rng.randint(1, 6), None))
    cases += [("partition-ties", [4, 4, 4, 4], 3, None), ("partition-ties", [7] * 5, 2, None),
              ("partition-ties", [2, 3, 2, 3], 2, None), ("partition-ties", [1, 1, 10], 2, None),
              ("partition-ties", [0, 0, 0], 2, None), ("partition-ties", [6, 6], 4, None)]
    for _ in range(20):
        n = rng.randint(1, 10)
        cases.append(("partition-ties", [rng.randint(1, 3) for _ in range(n)],
                      rng.randint(1, 4), None))
    cases += [("partition-loads", [4, 4, 4, 4], 3, [0, 0, 5]),
              ("partition-loads", [3, 5, 5, 2, 8], 2, [6, 0]),
              ("partition-loads", [], 2, [3, 1]), ("partition-loads", [2], 3, [4, 4, 4])]
    for _ in range(20):
        size = rng.randint(1, 5)
        cases.append(("partition-loads", rng.sample(range(1, 500), rng.randint(1, 10)), size,
                      [rng.randint(0, 600) for _ in range(size)]))
    return cases


def partitions(student):
    """What ``partition_parameters`` returned (or raised) on each case, and ``loads`` after."""
    out = []
    for _, sizes, world_size, loads in partition_cases():
        given = None if loads is None else list(loads)
        try:
            got = student.partition_parameters(list(sizes), world_size, given)
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported per case by the checker
            out.append({"raised": f"{type(exc).__name__}: {exc}"})
            continue
        try:
            owners = [int(o) for o in got]
        except Exception:  # noqa: BLE001 - not a sequence of numbers
            owners = None
        out.append({"type": type(got).__name__, "owners": owners, "loads": given,
                    "items": sorted({type(o).__name__ for o in got}) if owners is not None
                    else [], "shown": repr(got)[:200]})
    return out


# ---------------------------------------------------------------- the launch's entry point
def probe(student, ctx, stages, gloo_timeout):
    """Run ``stages`` ("sharded", and "checkpoint" after it); ``{stage: result}``, a result
    being ``{"todo": function}`` where the student's code raised NotImplementedError (in
    ``partition_parameters``; where only ShardedOptimizer's code still raises it, "sharded"
    holds the partitions and ``"unwritten"``: that function)."""
    from . import probes_checkpoint, probes_runs
    dist.init_process_group("gloo", rank=ctx.rank, world_size=ctx.size,
                            timeout=datetime.timedelta(seconds=gloo_timeout))
    results, objects = {}, None
    try:
        ctx.case("partition-greedy")
        sharded = {"partitions": partitions(student)}
    except NotImplementedError as exc:
        sharded = not_implemented(student, exc)
    else:           # piece by piece (issue 39): the partition is judged without the rest
        everyone = [None] * ctx.size
        dist.all_gather_object(everyone, sharded["partitions"])
        if all(p == everyone[0] for p in everyone):   # else the ranks disagree: the
            try:                                      # checker says so, no training
                runs, objects = probes_runs.run_all(student, ctx)
                sharded.update(runs)
            except NotImplementedError as exc:
                sharded["unwritten"] = not_implemented(student, exc)["todo"]
    results["sharded"] = sharded
    if "checkpoint" in stages:
        try:
            results["checkpoint"] = (
                probes_checkpoint.checkpoint(student, ctx, objects) if objects else
                sharded if "todo" in sharded else {"todo": sharded["unwritten"]}
                if "unwritten" in sharded else {"skipped": "partition_parameters gave "
                                                "different owners on different ranks"})
        except NotImplementedError as exc:
            results["checkpoint"] = not_implemented(student, exc)
    del objects
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return results
