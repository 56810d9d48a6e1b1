"""What the stages of notebook 07's probe (:mod:`.probes`) share: its settings, models
(:class:`Net`, :class:`Switch`, :func:`make_model`) and batches, the readers of an optimizer's
state and groups as plain data, and :func:`lockstep`, one step of the sharded optimizers beside
the unsharded reference on the same averaged gradients. The runs of stage "sharded"
(:mod:`.probes_runs`) and stage "checkpoint" (:mod:`.probes_checkpoint`) import it, and so do
the judge's :mod:`.replay` and :mod:`.wire` (the same models and batches) and the checks (the
settings their messages name).

Used in 07_bonus_zero_sharding.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..models import EdgeNet

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
