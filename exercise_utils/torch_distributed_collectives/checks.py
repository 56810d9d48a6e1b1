"""Checkers of notebook 03 for data partitions and gradient averaging.

``check_partition`` and ``check_average_gradients`` run the student file in fresh processes through :func:`exercise_utils.harness.run_ranks`
(gloo, world sizes 2 and 3), compare with a reference computed here, and raise
``AssertionError`` with a message the student can act on. The ``probe_*`` functions run
inside those processes. The BatchNorm checker is in :mod:`exercise_utils.checks_syncbn`.

Used in 03_torch_distributed_collectives.
"""
import math
import random

import numpy as np
import torch
import torch.nn.functional as F

from .config import quick
from .harness import assert_close, run_ranks, state_arrays
from .models import FrozenTiedNet

MODULE = "exercise_utils.checks_dist"
TIMEOUT = quick(90, 45)     # seconds a check may run before it is declared hung


def _seed_everything(seed):
    """Give this rank its own global random state (ranks must not depend on it)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _try(fn, *args):
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except Exception as exc:  # reported per case, not as a crash
        return {"raised": f"{type(exc).__name__}: {exc}"}


# ---------------------------------------------------------------- partitions
THIRD = 1 / 3
SIZE_CASES = [(10, [0.5, 0.5]), (11, [0.5, 0.5]), (10, [0.7, 0.3]), (7, [0.7, 0.3]),
              (7, [0.2, 0.3, 0.5]), (10, [THIRD] * 3), (11, [THIRD] * 3), (2, [THIRD] * 3),
              (1, [0.5, 0.5]), (0, [0.5, 0.5]), (3, [0.25] * 4), (9, [0.1, 0.6, 0.3]),
              (100, [0.1] * 10), (10, [0.25, 0.25]), (9, [0.5, 0.25]), (13, [1.0]),
              (13, [0.0, 1.0]), (50, [0.2, 0.3])]
BAD_CASES = [(10, [0.7, 0.4]), (10, [-0.5, 0.5, 1.0]), (10, [0.6, 0.6, -0.2])]
PARTITIONER_CASES = [(60, [0.5, 0.5], 1234), (61, [0.7, 0.3], 1234), (60, [0.7, 0.3], 7),
                     (50, [0.2, 0.3, 0.5], 1234), (40, [0.25, 0.25], 3), (2, [THIRD] * 3, 5),
                     (0, [0.5, 0.5], 1234), (60, [0.5, 0.5], 99)]
_perm = np.random.default_rng(3).permutation(30)
LABEL_CASES = [((np.arange(30) % 10)[_perm].tolist(), 2, True),
               ((np.arange(30) % 10)[_perm].tolist(), 3, False),
               ([9, 2, 5, 2, 7, 1, 9, 5, 1, 7, 7], 2, True),
               ([3, 0, 1, 2, 1], 3, False), ([4, 8, 4, 8], 3, False)]


def reference_sizes(n, fractions):
    """The part sizes ``partition_sizes`` must return (see the exercise's docstring)."""
    exact = [f * n for f in fractions]
    sizes = [math.floor(e) for e in exact]
    if abs(sum(fractions) - 1) <= 1e-9:
        order = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - sizes[i]), i))
        for i in order[:n - sum(sizes)]:
            sizes[i] += 1
    return sizes


def reference_label_partitions(labels, parts):
    groups = np.array_split(np.array(sorted(set(labels))), parts)
    return [[i for i, v in enumerate(labels) if v in set(g.tolist())] for g in groups]


def _rng_states():
    return (random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist())


def _partitioner(student, n, fractions, seed):
    data = [1000 + i for i in range(n)]
    before = _rng_states()
    dp = student.DataPartitioner(data, fractions, seed=seed)
    parts = [[int(i) for i in p] for p in dp.partitions]
    used = [[dp.use(i)[j] for j in range(len(dp.use(i)))] for i in range(len(parts))]
    return {"parts": parts, "right_samples": used == [[data[k] for k in p] for p in parts],
            "rng_kept": _rng_states() == before}


def probe_partition(student, ctx):
    _seed_everything(11 + 17 * ctx.rank)
    sizes = [_try(lambda c: [int(s) for s in student.partition_sizes(*c)], c) for c in SIZE_CASES]
    bad = [_try(student.partition_sizes, *c) for c in BAD_CASES]
    bad = [r["raised"].split(":")[0] if isinstance(r, dict) else None for r in bad]
    parts = [_partitioner(student, *c) for c in PARTITIONER_CASES]
    again = _partitioner(student, *PARTITIONER_CASES[0])["parts"]
    labels = [student.label_partitions(torch.tensor(lab) if as_tensor else list(lab), k)
              for lab, k, as_tensor in LABEL_CASES]
    return sizes, bad, parts, again, [[[int(i) for i in p] for p in ps] for ps in labels]


def _fmt(fractions):
    return "[" + ", ".join(f"{f:.4g}" for f in fractions) + "]"


def check_partition(path, timeout=TIMEOUT):
    """Check ``partition_sizes``, ``DataPartitioner`` and ``label_partitions`` of ``path``.

    Two processes with different global random states must compute the same partitions.
    """
    res = run_ranks(path, f"{MODULE}:probe_partition", 2, "none", timeout=timeout,
                    what="partition_sizes / DataPartitioner / label_partitions")
    sizes, bad, parts, again, labels = res[0]
    for (n, fr), got in zip(SIZE_CASES, sizes):
        want = reference_sizes(n, fr)
        if got != want:
            raise AssertionError(
                f"partition_sizes({n}, {_fmt(fr)}) returned {got}; expected {want}: floor(f * n) "
                f"each, then, when the fractions sum to 1, the samples left over one each to the "
                f"largest fractional parts (ties to the lower index), so no sample is lost")
    for (n, fr), raised in zip(BAD_CASES, bad):
        if raised != "ValueError":
            raise AssertionError(f"partition_sizes({n}, {_fmt(fr)}) must raise ValueError "
                                 f"(negative fraction or sum > 1); it {raised or 'returned'}")
    for (n, fr, seed), a, b in zip(PARTITIONER_CASES, parts, res[1][2]):
        call = f"DataPartitioner(data of {n}, {_fmt(fr)}, seed={seed})"
        _check_parts(call, n, fr, a)
        if a["parts"] != b["parts"]:
            raise AssertionError(f"{call}: rank 0 and rank 1 computed different partitions "
                                 f"(their global random states differ): the shuffle must depend "
                                 f"only on seed, through its own generator")
        if not a["rng_kept"]:
            raise AssertionError(f"{call} changed the global random state (random, numpy or "
                                 f"torch): shuffle with a private generator, e.g. "
                                 f"random.Random(seed) or torch.Generator().manual_seed(seed)")
    if again != parts[0]["parts"]:
        raise AssertionError("DataPartitioner with the same seed gave different partitions on a "
                             "second call in the same process")
    if parts[0]["parts"] == parts[-1]["parts"]:
        raise AssertionError("DataPartitioner with seeds 1234 and 99 gave the same partitions: "
                             "the shuffle must use the seed argument")
    for (lab, k, as_tensor), got in zip(LABEL_CASES, labels):
        want = reference_label_partitions(lab, k)
        if got != want:
            kind = "tensor" if as_tensor else "list"
            raise AssertionError(
                f"label_partitions(labels, {k}) with labels {lab} (a {kind}) returned {got}; "
                f"expected {want}: split the sorted distinct labels {sorted(set(lab))} into {k} "
                f"contiguous groups, earlier groups one larger; part r holds, in increasing "
                f"order, the indices of the samples with a label of group r")


def _check_parts(call, n, fr, got):
    parts, want = got["parts"], reference_sizes(n, fr)
    if [len(p) for p in parts] != want:
        raise AssertionError(f"{call} made parts of sizes {[len(p) for p in parts]}; expected "
                             f"partition_sizes({n}, {_fmt(fr)}) = {want}")
    flat = [i for p in parts for i in p]
    if len(set(flat)) != len(flat) or not set(flat) <= set(range(n)):
        raise AssertionError(f"{call}: the parts must hold distinct indices of range({n})")
    if n >= 20 and flat == sorted(flat):
        raise AssertionError(f"{call} is not shuffled: its parts are consecutive index ranges. "
                             f"Shuffle range(len(data)) with the seeded generator first")
    if not got["right_samples"]:
        raise AssertionError(f"{call}: use(i)[j] must be data[partitions[i][j]] (return "
                             f"Partition(data, partitions[i]))")


# ---------------------------------------------------------------- gradient averaging
# Local batch sizes per step and rank: unequal, one rank with a single sample.
AVG_SPLITS = {2: [[7, 3], [2, 8], [5, 5]], 3: [[5, 1, 3], [1, 4, 4], [3, 3, 2]]}
AVG_LR = 0.1


def _avg_model():
    torch.manual_seed(0)
    return FrozenTiedNet()          # a frozen parameter (grad None) and a tied weight


def _avg_batches(splits):
    g = torch.Generator().manual_seed(4321)
    return [(torch.randn(sum(s), 12, generator=g), torch.randint(0, 3, (sum(s),), generator=g))
            for s in splits]


def _grads(model):
    return {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()
            if p.grad is not None}


def _avg_run(model, batches, rows=None, after_backward=None):
    """SGD with momentum; ``rows(step)`` picks this rank's rows. Returns (step-1 grads, state)."""
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=AVG_LR,
                          momentum=0.9)
    first = None
    for step, (x, y) in enumerate(batches):
        part = rows(step) if rows else slice(None)
        opt.zero_grad()
        F.cross_entropy(model(x[part]), y[part]).backward()
        if after_backward:
            after_backward(len(y[part]))
        first = first or _grads(model)
        opt.step()
    return first, state_arrays(model)


def _rows(splits, rank):
    return lambda step: slice(sum(splits[step][:rank]), sum(splits[step][:rank + 1]))


def probe_average_gradients(student, ctx):
    model = _avg_model()
    _seed_everything(1000 + ctx.rank)
    splits = AVG_SPLITS[ctx.size]
    return _avg_run(model, _avg_batches(splits), _rows(splits, ctx.rank),
                    lambda n: student.average_gradients(model, n))


def _avg_diagnosis(got, splits, batches):
    """Name the classic mistake the step-1 gradients match, if any."""
    sizes, world = np.array(splits[0], dtype=np.float64), len(splits[0])
    local = [_avg_run(_avg_model(), batches[:1], _rows(splits, r))[0] for r in range(world)]
    candidates = {
        "the plain average of the ranks' gradients, sum_r g_r / world_size, which is right "
        "only when every rank holds the same number of samples": np.ones(world) / world,
        "the plain sum of the ranks' gradients": np.ones(world),
        "sum_r n_r * g_r divided by world_size instead of by N = sum_r n_r": sizes / world}
    for text, weights in candidates.items():
        cand = {k: sum(w * g[k] for w, g in zip(weights, local)) for k in local[0]}
        if all(np.allclose(got[k], cand[k], atol=1e-5, rtol=1e-4) for k in cand):
            return f" Your gradients are {text}"
    return ""


def check_average_gradients(path, timeout=TIMEOUT):
    """Check ``average_gradients``: SGD with unequal local batches equals single-process SGD."""
    for size in (2, 3):
        splits = AVG_SPLITS[size]
        batches = _avg_batches(splits)
        ref_grads, ref_state = _avg_run(_avg_model(), batches)
        res = run_ranks(path, f"{MODULE}:probe_average_gradients", size, "gloo", timeout=timeout,
                        what="average_gradients")
        for rank, (grads, _) in enumerate(res):
            if set(grads) != set(ref_grads):
                raise AssertionError(f"rank {rank}: after average_gradients the parameters with a "
                                     f"gradient are {sorted(grads)}; expected {sorted(ref_grads)} "
                                     f"(leave parameters whose grad is None alone)")
            for name in grads:
                if not np.allclose(grads[name], res[0][0][name], atol=1e-6, rtol=1e-5):
                    raise AssertionError(
                        f"rank 0 and rank {rank} hold different gradients of {name} after "
                        f"average_gradients: every parameter's gradient must be reduced")
        hint = _avg_diagnosis(res[0][0], splits, batches)
        for rank, (grads, state) in enumerate(res):
            assert_close(grads, ref_grads, f"gradients after average_gradients in step 1 with "
                         f"local batch sizes {splits[0]} must equal the gradient of the mean loss "
                         f"over all {sum(splits[0])} samples: sum_r (n_r / N) * g_r.{hint}", rank)
            assert_close(state, ref_state, f"parameters after {len(splits)} SGD steps with local "
                         f"batch sizes {splits} must equal single-process SGD on the concatenated "
                         f"batches", rank)
