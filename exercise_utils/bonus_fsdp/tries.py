"""Notebook 09's try cells (issue 39): each part of ``work/09_fsdp.py`` run as soon as it is
written, on 2 gloo ranks, printing what it computed beside what one process computes on the
combined batch, in numbers a student can read (:mod:`exercise_utils.tries`). Not a check:
nothing is judged or graded here (the CHECK cells do that); a wrong part shows as a
difference, a part not written yet as the short box of :mod:`exercise_utils.display`.

    from exercise_utils.bonus_fsdp import tries
    tries.run("zero2")          # then "unit" and "zero3"

Every try is tiny (float64 Linear layers of a few dozen parameters, a batch of 3 samples per
rank, SGD with momentum for at most 2 steps).

Used in 09_bonus_fsdp.
"""
import copy

import torch
import torch.nn as nn

from .. import tries as core

WORK = "work/09_fsdp.py"
STEPS = 2
OPTIM = {"lr": 0.1, "momentum": 0.9}
WIDTHS = (4, 6, 6, 3)                   # zero3's MLP: units Linear(4, 6), Linear(6, 6); root


def run(piece, work=WORK):
    """Run the try of ``piece`` (``"zero2"``, ``"unit"`` or ``"zero3"``) with the file
    ``work`` on 2 gloo ranks; print what each computed."""
    core.run(TRIES, piece, work)


# ----------------------------------------------------------------------------- helpers
def _diff(a, b):
    """The largest absolute difference of two tensors (or lists of them), as ``1.2e-17``, or
    which shapes differ (a wrong part shows, it does not crash the try)."""
    pairs = list(zip(a, b)) if isinstance(a, (list, tuple)) else [(a, b)]
    for x, y in pairs:
        if x.shape != y.shape:
            return f"none: shape {tuple(x.shape)} instead of {tuple(y.shape)}"
    return f"{max(float((x - y).detach().abs().max()) for x, y in pairs):.1e}"


def _net(seed, widths):
    """A float64 MLP of Linear layers of ``widths`` with Tanh between them, seeded."""
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers += [nn.Tanh()] if i else []
        layers.append(nn.Linear(a, b))
    return nn.Sequential(*layers).double()


def _batch(ctx, width_in, width_out, per_rank=3):
    """``(x, t, x_all, t_all)``: this rank's inputs and targets and the combined batch of all
    ranks (the same on every rank), float64."""
    torch.manual_seed(1)
    x_all = torch.randn(per_rank * ctx.size, width_in, dtype=torch.float64)
    t_all = torch.randn(per_rank * ctx.size, width_out, dtype=torch.float64)
    mine = slice(ctx.rank * per_rank, (ctx.rank + 1) * per_rank)
    return x_all[mine], t_all[mine], x_all, t_all


def _loss(out, target):
    """The mean squared error: each rank's mean over its samples, whose average over the
    ranks is one process's mean over the combined batch."""
    return nn.functional.mse_loss(out, target)


def _reference_steps(model, x_all, t_all, steps=STEPS):
    """One process: ``steps`` SGD steps (with momentum) of ``model`` on the combined batch.
    Returns the parameters after each step (lists of copies)."""
    opt = torch.optim.SGD(model.parameters(), **OPTIM)
    after = []
    for _ in range(steps):
        opt.zero_grad()
        _loss(model(x_all), t_all).backward()
        opt.step()
        after.append([p.detach().clone() for p in model.parameters()])
    return after


def _part(tensors, world, rank):
    """This rank's part of ``tensors`` flattened and padded with zeros to a multiple of
    ``world`` (what ``shard_flat`` returns), computed here, not by the student's file."""
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    per = -(-flat.numel() // world)
    padded = torch.cat([flat, flat.new_zeros(per * world - flat.numel())])
    return padded[rank * per:(rank + 1) * per]


# ----------------------------------------------------------------------------- in the ranks
# Each try_x(mine, ctx) runs in every rank: ``mine`` is the student's module, ``ctx.rank`` and
# ``ctx.size`` its rank and world (gloo group initialised); it returns the lines it prints.
def try_zero2(mine, ctx):
    """shard_flat's shard of a small MLP's parameters, then 2 steps of Zero2 (SGD with
    momentum, each rank on its 3 samples) beside one process on the combined 6."""
    rank, world = ctx.rank, ctx.size
    model = _net(0, (4, 3, 2))
    x, t, x_all, t_all = _batch(ctx, 4, 2)
    reference = _reference_steps(copy.deepcopy(model), x_all, t_all)
    params = list(model.parameters())
    shard, numel = mine.shard_flat(params, world, rank)
    expected = _part(params, world, rank)
    lines = [f"shard_flat of the {numel} parameters: a shard of {shard.numel()} elements "
             f"(expected {expected.numel()}), {shard.dtype}; max difference from elements "
             f"{rank * expected.numel()}..{(rank + 1) * expected.numel() - 1} of the padded "
             f"vector: {_diff(shard, expected)}"]
    opt = mine.Zero2(model.parameters(), torch.optim.SGD, **OPTIM)
    for step, want in enumerate(reference, 1):
        opt.zero_grad()
        _loss(model(x), t).backward()
        opt.step()
        kept = sum(p.grad is not None for p in params)
        lines.append(f"Zero2 step {step}: max parameter difference from one process "
                     f"{_diff(list(model.parameters()), want)}; parameters still holding a "
                     f".grad after step(): {kept} (expected 0)")
    return lines


def try_unit(mine, ctx):
    """A Unit of two Linear layers (Linear(4, 3), Tanh, Linear(3, 2): 23 parameters, a shard
    of 12 with one padding zero): its attributes gathered and resharded, then the unit run on
    an input that requires grad (so autograd saves both weights): the saved views noted and
    rebuilt, the gathers, and the shard's gradient beside one process's on the combined
    batch."""
    rank, world = ctx.rank, ctx.size
    block = _net(0, (4, 3, 2))
    reference = copy.deepcopy(block)
    x, t, x_all, t_all = _batch(ctx, 4, 2)
    _loss(reference(x_all), t_all).backward()
    layers = (block[0], block[2])
    unit = mine.Unit([(p, [(m, n)]) for m in layers for n, p in list(m.named_parameters())],
                     world, rank)
    shape = tuple(unit.shard.shape)
    unit.unshard()
    shapes = " and ".join(str(tuple(m.weight.shape)) for m in layers)
    values = _diff([getattr(m, n) for m in layers for n in ("weight", "bias")],
                   list(reference.parameters()))
    unit.reshard()
    left = sum(getattr(m, n) is not None for m in layers for n in ("weight", "bias"))
    lines = [f"shard {shape}; unshard(): weights {shapes} (max difference from the layers' "
             f"{values}); reshard(): attributes not None {left} (expected 0), full "
             f"{'None' if unit.full is None else 'still kept'}"]
    counts = _counting(unit)
    out = unit.run(block, x.clone().requires_grad_())   # as after an earlier layer
    forward = counts["gathers"]
    _loss(out, t).backward()
    grad = unit.shard.grad
    want = _part([p.grad for p in reference.parameters()], world, rank)
    lines.append(f"run: {forward} gather(s) in forward, {counts['gathers'] - forward} in "
                 f"backward (expected 1 and 1); pack noted {counts['noted']} saved views "
                 f"of the gathered parameters (expected 2: the weights), unpack rebuilt "
                 f"{counts['rebuilt']}")
    lines.append("shard gradient after backward: " + (
        "None (expected one)" if grad is None else
        f"max difference from one process's {_diff(grad, want)}"))
    return lines


def _counting(unit):
    """Wrap ``unit.gather``, ``unit.pack`` and ``unit.unpack`` (as ``_Gather`` and
    ``Unit.run`` call them) to count the gathers and the saved tensors noted and rebuilt.
    Returns the counts, filled as they happen."""
    counts = {"gathers": 0, "noted": 0, "rebuilt": 0}
    gather, pack, unpack = unit.gather, unit.pack, unit.unpack

    def counting_gather():
        counts["gathers"] += 1
        return gather()

    def counting_pack(tensor):
        saved = pack(tensor)
        counts["noted"] += not isinstance(saved, torch.Tensor)
        return saved

    def counting_unpack(saved):
        counts["rebuilt"] += not isinstance(saved, torch.Tensor)
        return unpack(saved)
    unit.gather, unit.pack, unit.unpack = counting_gather, counting_pack, counting_unpack
    return counts


def try_zero3(mine, ctx):
    """Zero3 on an MLP of three Linear layers, the first two units (the last one's parameters
    go to the root unit): 2 steps beside one process, then the full state dict and its round
    trip through a model of another seed (:func:`_round_trip`)."""
    model = _net(0, WIDTHS)
    single = copy.deepcopy(model)
    x, t, x_all, t_all = _batch(ctx, 4, 3)
    _reference_steps(single, x_all, t_all)
    zero3 = mine.Zero3(model, [model[0], model[2]])
    opt = torch.optim.SGD(zero3.parameters(), **OPTIM)
    for _ in range(STEPS):
        opt.zero_grad()
        _loss(zero3(x), t).backward()
        opt.step()
    sizes = [tuple(u.shard.shape) if u is not None else None for u in zero3.units]
    left = sum(getattr(model[i], n) is not None for i in (0, 2, 4) for n in ("weight", "bias"))
    with torch.no_grad():
        out = _diff(zero3(x), single(x))
    return [f"shards of the units {sizes} (the last: the root); after {STEPS} steps the "
            f"outputs' max difference from one process {out}; attributes not None after the "
            f"steps: {left} (expected 0)",
            _said_state(zero3.full_state_dict(), single.state_dict(), ctx.rank,
                        "full_state_dict()")] + _round_trip(mine, single, x, ctx.rank)


def _round_trip(mine, single, x, rank):
    """One process's model ``single``'s state dict loaded into a Zero3 of another seed's
    model. Returns the lines: its outputs on ``x`` beside ``single``'s, and its full state
    dict gathered back."""
    other = _net(5, WIDTHS)
    loaded = mine.Zero3(other, [other[0], other[2]])
    loaded.load_full_state_dict(single.state_dict())
    with torch.no_grad():
        out = _diff(loaded(x), single(x))
    return [f"one process's state dict loaded into another seed's model: outputs' max "
            f"difference {out}",
            _said_state(loaded.full_state_dict(), single.state_dict(), rank,
                        "its full_state_dict() again")]


def _said_state(state, expected, rank, what):
    """A line on a full state dict: None where it should be, else its keys and max difference
    from ``expected``."""
    if rank:
        return f"{what}: {'None' if state is None else 'a state dict'} (expected None off rank 0)"
    if state is None or set(state) != set(expected):
        return (f"{what}: keys {None if state is None else sorted(state)} (expected "
                f"{sorted(expected)})")
    return (f"{what}: keys {list(state)}; max difference from one process's state_dict() "
            f"{_diff([state[k] for k in expected], list(expected.values()))}")


UNIT = ("Unit.reduce_grad", "Unit.unshard", "Unit.reshard", "Unit.pack", "Unit.unpack")
TRIES = {
    "zero2": core.Try(try_zero2, ("shard_flat", "Zero2.step"), "shard_flat and Zero2"),
    "unit": core.Try(try_unit, ("shard_flat",) + UNIT, "one unit of ZeRO-3"),
    "zero3": core.Try(try_zero3, ("shard_flat",) + UNIT + ("Zero3.full_state_dict",
                                                          "Zero3.load_full_state_dict"),
                      "Zero3 and its full state dict"),
}
