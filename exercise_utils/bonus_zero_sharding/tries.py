"""Notebook 07's try cells (issue 39): each part of ``work/07_zero.py`` run as soon as it is
written, printing what it computed beside the paper's numbers or what one process computes
(:mod:`exercise_utils.tries`). Not a check: nothing is judged or graded here (the CHECK cells
do that); a wrong part shows as a difference, a part not written yet as the short box of
:mod:`exercise_utils.display`.

    from exercise_utils.bonus_zero_sharding import tries
    tries.memory()              # part 1, in the notebook's own process: GB per device
    tries.partition()           # part 2, in the notebook's own process: the shards
    tries.run("step")           # part 3, on 2 gloo ranks: steps against one AdamW
    tries.run("checkpoint")     # part 4, on 2 gloo ranks: consolidate, save, load

Used in 07_bonus_zero_sharding.
"""
import copy
import io

import torch

from .. import tries as core

WORK = "work/07_zero.py"
PSI, PAPER_DEVICES = 7.5e9, 64
PAPER_GB = (120, 31.4, 16.6, 1.9)         # the ZeRO paper's Figure 1: Psi = 7.5e9, N_d = 64
SIZES = (4096, 64, 1024, 64, 3000, 10, 10)  # a small MLP's weights and biases, in order
MORE = (2000, 500)                          # a second group, as add_param_group partitions it
LR, DECAY, STEPS = 0.05, 0.1, 2


def run(piece, work=WORK):
    """Run the try of ``piece`` (``"step"`` or ``"checkpoint"``) with the file ``work`` on
    2 gloo ranks; print what each computed."""
    core.run(TRIES, piece, work)


def _student(work, needs):
    """The file ``work`` as a module, once the functions ``needs`` are written (else a box)."""
    core.ready(work, needs)
    from ..rankworker import load_student
    return load_student(work)


def memory(work=WORK, devices=(1, 8, PAPER_DEVICES, 1024)):
    """Print the file's ``bytes_per_device`` for the paper's 7.5B model, stages 0 to 3, on
    each number of ``devices``, beside the paper's figures (no ranks needed)."""
    mine = _student(work, ("bytes_per_device",))
    print(f"Psi = {PSI:.2g} parameters, K = 12: GB per device (GB = 1e9 bytes)")
    print(f"{'N_d':>6s}  " + "  ".join(f"{f'stage {s}':>8s}" for s in range(4)))
    for n in devices:
        gb = [mine.bytes_per_device(PSI, n, s) / 1e9 for s in range(4)]
        print(f"{n:6d}  " + "  ".join(f"{g:8.4g}" for g in gb))
    print(f"paper, N_d = {PAPER_DEVICES}: " + ", ".join(f"{g} GB" for g in PAPER_GB))


def _print_partition(mine, sizes, world_size, loads=None):
    """Print the file's partition of ``sizes`` on ``world_size`` ranks (starting from
    ``loads``), rank by rank with its load; return the loads after it."""
    owners = list(mine.partition_parameters(list(sizes), world_size,
                                            None if loads is None else list(loads)))
    after = list(loads or [0] * world_size)
    print(f"  owners {owners}")
    for r in range(world_size):
        mine_r = [s for s, o in zip(sizes, owners) if o == r]
        after[r] += sum(mine_r)
        print(f"  rank {r}: sizes {mine_r}, load {after[r]}")
    return after


def partition(work=WORK, sizes=SIZES, more=MORE, world_sizes=(2, 3)):
    """Print the file's ``partition_parameters`` of ``sizes`` on each of ``world_sizes``
    ranks, then of a second group ``more`` from the loads the first left (no ranks needed).
    (No reference partition is printed: this module is on the ranks' side of the grading
    sandbox, where no expected answer may be; the loads show the balance.)"""
    mine = _student(work, ("partition_parameters",))
    print(f"sizes {list(sizes)}: {sum(sizes)} elements; largest first, each to the "
          "least-loaded rank")
    for n in world_sizes:
        print(f"{n} ranks (ideal load {sum(sizes) / n:.0f} each, the largest size "
              f"{max(sizes)}):")
        loads = _print_partition(mine, sizes, n)
    print(f"then a second group {list(more)} from the loads {loads} (as add_param_group):")
    _print_partition(mine, more, world_sizes[-1], loads)


# ----------------------------------------------------------------------------- in the ranks
def _model():
    """The same small float64 MLP on every rank."""
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def _backward(models, step):
    """Each model's gradients of the same loss on batch ``step``: the same on every rank, as
    if DDP had averaged them."""
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    t = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    for model in models:
        torch.nn.functional.mse_loss(model(x), t).backward()


def _train(pairs, steps, start=0):
    """Steps ``start`` to ``steps - 1`` of every (model, optimizer) of ``pairs``, on the same
    batches."""
    for step in range(start, steps):
        _backward([m for m, _ in pairs], step)
        for _, opt in pairs:
            opt.step()
            opt.zero_grad()


def _diff(model, other):
    """The largest difference between two models' parameters, as text."""
    pairs = zip(model.parameters(), other.parameters())
    return f"{max(float((p - q).abs().max()) for p, q in pairs):.1e}"


def _built(mine):
    """Yours and one process's AdamW on two copies of :func:`_model`, not trained yet."""
    model, ref = _model(), _model()
    opt = mine.ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=LR, weight_decay=DECAY)
    return model, opt, ref, torch.optim.AdamW(ref.parameters(), lr=LR, weight_decay=DECAY)


def _held(optim):
    """(parameters with state, elements of their state tensors) in the optimizer ``optim``."""
    state = getattr(optim, "state", {})
    return len(state), sum(v.numel() for s in state.values() for v in s.values()
                           if torch.is_tensor(v) and v.dim() > 0)


def try_step(mine, ctx):
    model, opt, ref, ref_opt = _built(mine)
    params = list(model.parameters())
    mine_idx = [i for i, p in enumerate(params) if opt.owners.get(id(p)) == ctx.rank]
    _backward([model], 0)
    opt.zero_grad()
    left = sum(p.grad is not None for p in params)
    _train([(model, opt), (ref, ref_opt)], STEPS)
    count, elements = _held(getattr(opt, "optim", None))
    return [f"owns parameters {mine_idx} of {len(params)}, "
            f"{sum(params[i].numel() for i in mine_idx)} of {sum(p.numel() for p in params)} "
            "elements",
            f"zero_grad() left {left} gradients (expected 0: it resets every parameter's)",
            f"after {STEPS} AdamW steps: max difference from one process's AdamW "
            f"{_diff(model, ref)}",
            f"its optimizer holds the state of {count} of the {len(params)} parameters, "
            f"{elements} elements (one process's AdamW: {{}} of them, {{}} elements)"
            .format(*_held(ref_opt))]


def _compare(sd, ref):
    """A line comparing the state dict ``sd`` with the unsharded one ``ref``."""
    common = set(sd.get("state", {})) & set(ref["state"])
    worst = max((float((v - ref["state"][i][k]).abs().max()) for i in common
                 for k, v in sd["state"][i].items() if torch.is_tensor(v)), default=float("nan"))
    return (f"state_dict(): state of parameters {sorted(sd.get('state', {}))}, groups' params "
            f"{[g.get('params') for g in sd.get('param_groups', [])]} (AdamW's: "
            f"{sorted(ref['state'])}, {[g['params'] for g in ref['param_groups']]}); max "
            f"difference of the state {worst:.1e}")


def try_checkpoint(mine, ctx):
    import torch.distributed as dist
    model, opt, ref, ref_opt = _built(mine)
    _train([(model, opt), (ref, ref_opt)], STEPS)
    opt.consolidate_state_dict(to=0)
    lines, saved = [], [None]
    if ctx.rank == 0:
        sd = opt.state_dict()
        lines.append(_compare(sd, ref_opt.state_dict()))
        buf = io.BytesIO()
        torch.save(sd, buf)
        saved[0] = buf.getvalue()
    else:
        try:
            opt.state_dict()
            lines.append("state_dict() returned (expected RuntimeError: only rank 0 holds it)")
        except RuntimeError:
            lines.append("state_dict() raised RuntimeError (as documented: only rank 0 holds it)")
    dist.broadcast_object_list(saved, src=0)
    resumed = copy.deepcopy(model)
    new = mine.ShardedOptimizer(resumed.parameters(), torch.optim.AdamW)   # defaults: lr, ...
    new.load_state_dict(torch.load(io.BytesIO(saved[0])))
    count, _ = _held(getattr(new, "optim", None))
    _train([(resumed, new), (ref, ref_opt)], STEPS + 1, start=STEPS)
    lines += [f"saved {len(saved[0])} bytes on rank 0, loaded on every rank into a fresh "
              f"ShardedOptimizer (AdamW's defaults): it holds the state of {count} of 4 parameters",
              "one more step: max difference from one process's AdamW (lr and weight decay "
              f"from the checkpoint) {_diff(resumed, ref)}"]
    return lines


TRIES = {
    "step": core.Try(try_step, ("partition_parameters", "ShardedOptimizer.__init__",
                                "ShardedOptimizer.add_param_group", "ShardedOptimizer.step",
                                "ShardedOptimizer.zero_grad"),
                     "ShardedOptimizer's steps"),
    "checkpoint": core.Try(try_checkpoint, ("partition_parameters", "ShardedOptimizer.__init__",
                                            "ShardedOptimizer.add_param_group",
                                            "ShardedOptimizer.step", "ShardedOptimizer.zero_grad",
                                            "ShardedOptimizer.consolidate_state_dict",
                                            "ShardedOptimizer.load_state_dict"),
                           "a checkpoint: consolidate, save, load"),
}
