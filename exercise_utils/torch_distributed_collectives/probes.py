"""What runs inside the processes that notebook 03's partition and averaging checkers start,
and the inputs they share.

Each ``probe_*(student, ctx, ...)`` is called by :func:`exercise_utils.harness.run_ranks` in a
fresh process (gloo, or independent processes for the partitions) with the imported student
module; it gives every rank its own global random state (ranks must not depend on it), calls
the student's code on every case (each charged to its check case with ``ctx.case``) and
returns what came out. The verdicts are in :mod:`.checks`; the ring all-reduce's probe is
:mod:`.probes_ring`, the SyncBatchNorm's :mod:`.probes_batchnorm`.

Used in 03_torch_distributed_collectives.
"""
import random

import numpy as np
import torch
import torch.nn.functional as F

from ..compare import state_arrays
from ..models import BranchNet, EdgeNet, FrozenTiedNet
from ..rankworker import salted_generator


def _seed_everything(seed):
    """Give this rank its own global random state (ranks must not depend on it)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ---------------------------------------------------------------- partitions
THIRD = 1 / 3


def size_cases():
    """``(case, n, fractions)`` for ``partition_sizes``, baseline first, then one rule at a time:

    * ``sizes-sum-one``: fractions summing to 1 (samples left over, ties, n = 0, more parts
      than samples, a zero fraction, a single fraction), then random ones;
    * ``sizes-below-one``: sums below 1 (the rest left out), then random ones;
    * ``sizes-near-one``: sums within 1e-9 of 1 (they count as 1, even just above 1) and
      2e-9 away (they do not: below, the rest is left out);
    * ``sizes-raises``: a negative fraction (also a tiny one), sums above 1 + 1e-9 (also
      1 + 2e-9): ValueError.
    """
    rng = random.Random(24)
    one = [(10, [0.5, 0.5]), (11, [0.5, 0.5]), (10, [0.7, 0.3]), (7, [0.7, 0.3]),
           (7, [0.2, 0.3, 0.5]), (10, [THIRD] * 3), (11, [THIRD] * 3), (2, [THIRD] * 3),
           (1, [0.5, 0.5]), (0, [0.5, 0.5]), (3, [0.25] * 4), (9, [0.1, 0.6, 0.3]),
           (100, [0.1, 0.2, 0.3, 0.4]), (13, [1.0]), (13, [0.0, 1.0]), (5, [0.2, 0.0, 0.8]),
           (6, [0.45, 0.1, 0.45]), (1, [0.25] * 4)]
    near = []
    for _ in range(40):      # a float sum of exactly 1.0 is a sum-one case, else a near-one one
        weights = [rng.randint(0, 9) for _ in range(rng.randint(1, 6))]
        weights[rng.randrange(len(weights))] += 1
        fractions = [w / sum(weights) for w in weights]
        (one if sum(fractions) == 1 else near).append(
            (rng.choice([0, 1, 2, 5, rng.randint(0, 50), rng.randint(0, 10 ** 6)]), fractions))
    below = [(10, [0.25, 0.25]), (9, [0.5, 0.25]), (50, [0.2, 0.3]), (0, [0.3]),
             (7, [0.6, 0.3]), (3, [0.0, 0.5])]
    for _ in range(20):
        k = rng.randint(1, 5)
        scale = rng.uniform(0.3, 0.99)
        weights = [rng.uniform(0, 1) for _ in range(k)]
        below.append((rng.randint(0, 1000), [w * scale / sum(weights) for w in weights]))
    near = [(7, [0.1] * 10), (10, [0.5, 0.5 - 5e-10]), (1000, [0.5, 0.5 - 5e-10]),
            (3, [0.5 + 5e-10, 0.5]), (11, [THIRD, THIRD, THIRD + 5e-10]),
            (10, [0.5, 0.5 - 2e-9]), (1000, [0.5, 0.5 - 2e-9]),
            (3, [THIRD, THIRD - 2e-9, THIRD])] + near
    bad = [(10, [0.7, 0.4]), (10, [-0.5, 0.5, 1.0]), (10, [0.6, 0.6, -0.2]), (10, [-1e-12, 1.0]),
           (10, [0.5, 0.5 + 2e-9]), (0, [1.5]), (1000, [THIRD, THIRD, THIRD + 2e-9])]
    return ([("sizes-sum-one", n, f) for n, f in one] +
            [("sizes-below-one", n, f) for n, f in below] +
            [("sizes-near-one", n, f) for n, f in near] +
            [("sizes-raises", n, f) for n, f in bad])


# DataPartitioner cases: (n, fractions, seed); the last one differs from the first only in
# its seed.
PARTITIONER_CASES = [(60, [0.5, 0.5], 1234), (61, [0.7, 0.3], 1234), (60, [0.7, 0.3], 7),
                     (50, [0.2, 0.3, 0.5], 1234), (40, [0.25, 0.25], 3), (2, [THIRD] * 3, 5),
                     (0, [0.5, 0.5], 1234), (37, [0.1] * 10, 11), (60, [0.5, 0.5], 99)]
_perm = np.random.default_rng(3).permutation(30)
# label_partitions cases: (case, labels, parts, kind) with kind "list", "int64" or "int32"
# (a 1-D tensor of that dtype): more parts than labels (empty parts), negative labels, none.
LABEL_CASES = [("labels-groups", (np.arange(30) % 10)[_perm].tolist(), 3, "list"),
               ("labels-groups", [9, 2, 5, 2, 7, 1, 9, 5, 1, 7, 7], 2, "list"),
               ("labels-groups", [3, 0, 1, 2, 1], 3, "list"),
               ("labels-groups", [4, 8, 4, 8], 3, "list"),
               ("labels-groups", [-3, 5, 0, -3, 2, 5], 2, "list"),
               ("labels-groups", [], 2, "list"),
               ("labels-tensor", (np.arange(30) % 10)[_perm].tolist(), 2, "int64"),
               ("labels-tensor", [9, 2, 5, 2, 7, 1, 9, 5, 1, 7, 7], 3, "int64"),
               ("labels-tensor", [6, 1, 6, 3, 1], 2, "int32")]


class Samples:
    """A dataset with ``len`` and indexing only (not a list): sample ``i`` is ``1000 + i``."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return 1000 + i


def _rng_states():
    """The whole global random state of random, numpy and torch (positions included)."""
    kind, keys, pos, gauss, cached = np.random.get_state()
    return (random.getstate(), (kind, keys.tolist(), pos, gauss, cached),
            torch.get_rng_state().tolist())


def _raised(exc):
    """What a student's call raised, reported per case (not as a crash of the probe)."""
    if isinstance(exc, NotImplementedError):
        raise exc
    return {"raised": f"{type(exc).__name__}: {str(exc)[:300]}"}


def _partitioner(student, n, fractions, seed):
    data = Samples(n)
    before = _rng_states()
    try:
        dp = student.DataPartitioner(data, fractions, seed=seed)
        kept = _rng_states() == before
        parts = [[int(i) for i in p] for p in dp.partitions]
        used = []
        for i in range(len(parts)):
            part = dp.use(i)
            used.append([part[j] for j in range(len(part))])
    except Exception as exc:  # noqa: BLE001 - reported per case
        return _raised(exc)
    return {"parts": parts, "right_samples": used == [[data[k] for k in p] for p in parts],
            "rng_kept": kept}


def _sizes(student, n, fractions):
    try:
        got = student.partition_sizes(n, list(fractions))
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported per case, not as a crash
        return {"raised": type(exc).__name__, "message": str(exc)[:200]}
    values = list(got)
    return {"value": [int(v) if isinstance(v, (int, float, np.number)) else None for v in values],
            "exact": all(isinstance(v, (int, float, np.number)) and v == int(v) for v in values),
            "types": sorted({type(v).__name__ for v in values}),
            "container": type(got).__name__,
            "ints": type(got) is list and all(type(v) is int for v in values)}


def _labels(student, labels, k, kind, types):
    """The parts ``label_partitions`` returned, as lists of ints (or what it raised); appends
    to ``types`` what it returned: ``[container, [part types], [element types]]``."""
    arg = list(labels) if kind == "list" else torch.tensor(labels, dtype=getattr(torch, kind))
    try:
        got = student.label_partitions(arg, k)
        parts = [[int(i) for i in p] for p in got]
    except Exception as exc:  # noqa: BLE001 - reported per case
        types.append(None)
        return _raised(exc)
    types.append([type(got).__name__, sorted({type(p).__name__ for p in got}),
                  sorted({type(i).__name__ for p in got for i in p})])
    return parts


def probe_partition(student, ctx):
    """Each process has its own global random state. Returns what ``partition_sizes`` returned
    (or raised) on every case, ``DataPartitioner`` on every case (and the first again), and
    ``label_partitions`` on every case."""
    _seed_everything(11 + 17 * ctx.rank)
    sizes = []
    for case, n, fractions in size_cases():
        ctx.case(case)
        sizes.append(_sizes(student, n, fractions))
    ctx.case("parts-sizes")
    parts = [_partitioner(student, *c) for c in PARTITIONER_CASES]
    again = _partitioner(student, *PARTITIONER_CASES[0]).get("parts")
    labels, types = [], []
    for case, lab, k, kind in LABEL_CASES:
        ctx.case(case)
        labels.append(_labels(student, lab, k, kind, types))
    return sizes, parts, again, labels, types


# ---------------------------------------------------------------- gradient averaging
# Local batch sizes per step and rank: unequal, one rank with a single sample; and a run where
# a rank holds no sample in a step (it still takes part: its gradients are zeros).
AVG_SPLITS = {2: [[7, 3], [2, 8], [5, 5]], 3: [[5, 1, 3], [1, 4, 4], [3, 3, 2]]}
AVG_EMPTY = {2: [[4, 0], [0, 3]], 3: [[3, 0, 2], [2, 3, 0]]}
AVG_LR, AVG_MOMENTUM = 0.1, 0.9
# With 3 ranks, a run inside two process groups (ranks 0 and 2, not consecutive; rank 1
# alone), with these local batch sizes: each group averages over its own ranks only.
AVG_GROUPS = {3: [[0, 2], [1]]}
AVG_GROUP_SPLIT = [4, 2, 5]
# Where links are observed (:func:`exercise_utils.harness.observing`): one step more on a wide
# FrozenTiedNet (WIDE features: a 1 MB gradient), so that what the all_reduces put on the wire
# stands far above the set-up and the headers of the many small calls (the judge's bound:
# :mod:`.wire`).
WIDE = 512
AVG_WIRE_SPLIT = {2: [[5, 3]], 3: [[4, 2, 5]]}
FEATURES = {"tied": (12, 3), "edge": (6, 4), "wide": (WIDE, 3), "branch": (8, 3)}  # (inputs,
#                                                                                   classes)


def vary_grads(model, step):
    """Before step ``step`` (from 0) of the run ``avg-varying``: which of the BranchNet's
    parameters get a gradient changes from one call to the next. In step 1 only ``head`` has
    one (the branch is skipped, ``fc1`` frozen); in step 2 all do (the branch used, ``fc1``
    unfrozen); in step 3 all but the branch (skipped again). A list of the parameters with a
    gradient (or of the trainable ones) kept from the first call misses ``fc1`` and the
    branch in step 2."""
    model.use_branch = step == 1
    model.fc1.requires_grad_(step != 0)


def vary_of(kind):
    """The :func:`vary_grads` of a run on ``kind``'s model, or None (the same every step)."""
    return vary_grads if kind == "branch" else None


def avg_cases(size, wire=False):
    """``(case, model, dtype, splits, grouped)`` run in one launch with ``size`` ranks: the
    baseline (FrozenTiedNet: a frozen and a tied parameter), then one dimension changed at a
    time: EdgeNet (frozen, unused, tied, transposed and 0-d parameters), float64, (``wire``:
    the wide FrozenTiedNet), a BranchNet whose parameters with a gradient change from step to
    step (:func:`vary_grads`), process groups of non-consecutive ranks, a rank without samples
    (last: a rank that skips the all_reduce leaves the others waiting)."""
    cases = [("avg-values", "tied", "float32", AVG_SPLITS[size], False),
             ("avg-model", "edge", "float32", AVG_SPLITS[size], False),
             ("avg-float64", "edge", "float64", AVG_SPLITS[size], False),
             ("avg-varying", "branch", "float32", AVG_SPLITS[size], False)]
    if wire:
        cases.append(("avg-model", "wide", "float32", AVG_WIRE_SPLIT[size], False))
    if size in AVG_GROUPS:
        cases.append(("avg-group", "tied", "float32", [AVG_GROUP_SPLIT], True))
    return cases + [("avg-empty-rank", "tied", "float32", AVG_EMPTY[size], False)]


def avg_model(kind="tied", dtype="float32"):
    """The replica every rank starts from: FrozenTiedNet (``wide``: of :data:`WIDE` features),
    BranchNet (``branch``: :func:`vary_grads`), or EdgeNet in eval mode (BatchNorm on its
    running statistics, so that the weighted average is the global batch's gradient)."""
    torch.manual_seed(0)
    if kind in ("tied", "wide"):
        return FrozenTiedNet(FEATURES[kind][0]).to(getattr(torch, dtype))
    if kind == "branch":
        return BranchNet(*FEATURES[kind]).to(getattr(torch, dtype))
    return EdgeNet(dtype=getattr(torch, dtype)).eval()


def avg_batches(splits, kind="tied", dtype="float32", salts=None):
    """Per step, the global batch ``(x, y)`` (``sum(splits[step])`` samples), rank r's rows
    (:func:`rows`) drawn from a seed of its own mixed with its salt (``salts``: ``{rank:
    salt}``, 0 for a rank not in it). A rank is given only its own salt (``ctx.salt``; at
    grading a number no other rank can read): the other ranks' rows it draws are not theirs,
    and only the judge draws them all."""
    features, classes = FEATURES[kind]
    out = []
    for step, sizes in enumerate(splits):
        xs, ys = [], []
        for r, n in enumerate(sizes):
            salt = (salts or {}).get(r, 0)
            g = salted_generator(4321 + 1009 * step + 31 * r, salt)
            xs.append(torch.randn(n, features, generator=g, dtype=getattr(torch, dtype)))
            ys.append(torch.randint(0, classes, (n,), generator=g))
        out.append((torch.cat(xs), torch.cat(ys)))
    return out


def _grads(model):
    return {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()
            if p.grad is not None}


def avg_run(model, batches, rows=None, after_backward=None, vary=None, steps=None):
    """SGD with momentum (written out: no ``torch.optim``, whose first use imports
    ``torch._dynamo``, seconds of CPU per rank) on the mean loss of this rank's rows
    (``rows(step)``: an index; a rank without rows has loss 0 and zero gradients); a parameter
    without a gradient in a step is skipped (its momentum kept), as by ``torch.optim.SGD``.
    ``vary(model, step)`` before each step (:func:`vary_grads`); ``steps``: a list that
    receives every step's gradients. Returns (the gradients of step 1, the final state)."""
    first, velocity = None, {}
    for step, (x, y) in enumerate(batches):
        part = rows(step) if rows else slice(None)
        xb, yb = x[part], y[part]
        if vary:
            vary(model, step)
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb, reduction="sum") / max(len(yb), 1)
        loss.backward()
        if after_backward:
            after_backward(len(yb))
        first = first or _grads(model)
        if steps is not None:
            steps.append(_grads(model))
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    v = velocity[id(p)] = (velocity[id(p)].mul_(AVG_MOMENTUM).add_(p.grad)
                                           if id(p) in velocity else p.grad.clone())
                    p.sub_(AVG_LR * v)
    return first, state_arrays(model)


def rows(splits, rank):
    """This rank's rows of each step's global batch."""
    return lambda step: slice(sum(splits[step][:rank]), sum(splits[step][:rank + 1]))


def group_rows(splits, ranks):
    """The rows of the ``ranks`` (in this order), as an index of each step's global batch."""
    return lambda step: torch.cat([torch.arange(sum(splits[step][:r]), sum(splits[step][:r + 1]))
                                   for r in ranks])


def _my_group(ctx, groups):
    """Create every group of ``groups`` (all ranks must) and return the one ``ctx.rank`` is in."""
    import torch.distributed as dist
    made = [dist.new_group(g) for g in groups]
    return next(grp for grp, g in zip(made, groups) if ctx.rank in g)


def _named_none(case, average):
    """``average`` whose crash on a parameter without a gradient says so."""
    def call(n):
        try:
            average(n)
        except (AttributeError, TypeError) as exc:
            if "NoneType" not in str(exc):
                raise
            why = (" Which parameters have a gradient changes from call to call in this run: "
                   "look at p.grad in every call" if case == "avg-varying" else "")
            raise type(exc)(f"{exc}. (If it comes from a gradient: a parameter whose p.grad is "
                            f"None (frozen or unused) must be skipped.{why})") from exc
    return call


def probe_average_gradients(student, ctx, wire=False):
    """Every case of :func:`avg_cases` (``wire``: the wide model's too): SGD on this rank's
    rows with the student's averaging after each backward. Returns per case the step-1
    gradients and the final state (``avg-varying``: every step's gradients too)."""
    out = []
    for case, kind, dtype, splits, grouped in avg_cases(ctx.size, wire):
        ctx.case(case)
        group = _my_group(ctx, AVG_GROUPS[ctx.size]) if grouped else None
        model = avg_model(kind, dtype)
        _seed_everything(1000 + ctx.rank)
        average = _named_none(case, (lambda n: student.average_gradients(model, n, group=group))
                              if grouped else (lambda n: student.average_gradients(model, n)))
        steps = [] if vary_of(kind) else None
        first, state = avg_run(model, avg_batches(splits, kind, dtype, {ctx.rank: ctx.salt}),
                               rows(splits, ctx.rank), average, vary_of(kind), steps)
        out.append({"grads": first, "state": state, **({"steps": steps} if steps else {})})
    return out
