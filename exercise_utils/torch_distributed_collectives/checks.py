"""Checkers of notebook 03 for data partitions and gradient averaging.

``check_partition`` and ``check_average_gradients`` run the student file in fresh processes
through :func:`exercise_utils.harness.run_ranks` (the probes of :mod:`.probes`, many cases per
launch), compare with a reference computed here, and raise
:class:`~exercise_utils.contract.CheckFailure` (an ``AssertionError``) naming the case of the
contract (:mod:`.requirements`) that found the problem, with a message the student can act on.
``check_average_gradients`` compares SGD with the student's averaging on unequal local batches
with single-process SGD on the concatenated batches; with 3 ranks also inside process groups of
non-consecutive ranks, whose results must cover their own ranks only; where links are observed
(grading) all links together must carry what its all_reduces put there (``avg-wire``,
:mod:`.wire`). The ring all-reduce's checker is :mod:`.checks_ring`, the SyncBatchNorm's
:mod:`.checks_batchnorm` (its ``check_sync_batchnorm`` is imported here, where the notebook's
CHECK cell finds it).

Used in 03_torch_distributed_collectives.
"""
import math

import numpy as np

from ..contract import fail
from ..harness import HANG_AFTER, check, observing, run_ranks
from ..compare import assert_close
from . import probes
from .checks_batchnorm import check_sync_batchnorm  # noqa: F401 - the CHECK cell imports it here
from .probes import (AVG_GROUP_SPLIT, AVG_GROUPS, LABEL_CASES, PARTITIONER_CASES, avg_batches,
                     avg_cases, avg_model, avg_run, group_rows, rows, size_cases)
from .wire import check_avg_wire

TIMEOUT = HANG_AFTER     # seconds without progress before a launch is a hang (harness)


# ---------------------------------------------------------------- partitions
NEAR_ONE = 1e-9      # a sum within this of 1 counts as 1 (the docstring)
SIZES_RULE = ("floor(f * n) for every fraction f; when the fractions sum to 1 (within 1e-9), "
              "the samples left over one each to the parts with the largest fractional parts "
              "f * n - floor(f * n), ties to the lower index; when they sum to less, the rest "
              "left out")
SIZES_PROMISE = {
    "sizes-sum-one": "when the fractions sum to 1, the samples left over (fewer than "
                     "len(fractions)) are then given one each to the parts with the largest "
                     "fractional parts f * n - floor(f * n), ties to the lower index, so the "
                     "sizes add up to n",
    "sizes-below-one": "list[int]: floor(f * n) for every fraction f; When they sum to less "
                       "than 1 the rest of the samples is left out",
    "sizes-near-one": "(a sum within 1e-9 of 1 counts as 1)",
}


def reference_sizes(n, fractions):
    """The part sizes ``partition_sizes`` must return (see the exercise's docstring); raises
    ValueError where it must."""
    fractions = [float(f) for f in fractions]
    total = sum(fractions)
    if any(f < 0 for f in fractions) or total > 1 + NEAR_ONE:
        raise ValueError(f"bad fractions {fractions}")
    exact = [f * n for f in fractions]
    sizes = [math.floor(e) for e in exact]
    if abs(total - 1) <= NEAR_ONE:
        order = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - sizes[i]), i))
        for i in order[:n - sum(sizes)]:
            sizes[i] += 1
    return sizes


def reference_label_partitions(labels, parts):
    groups = np.array_split(np.array(sorted(set(labels)), dtype=np.int64), parts)
    return [[i for i, v in enumerate(labels) if v in set(g.tolist())] for g in groups]


def _fmt(fractions):
    return "[" + ", ".join(f"{f:.12g}" for f in fractions) + "]"


@check
def check_partition(path, timeout=TIMEOUT):
    """Check ``partition_sizes``, ``DataPartitioner`` and ``label_partitions`` of ``path``.

    ``partition_sizes`` on 100 cases (sums of 1, below 1 and within or just beyond 1e-9 of 1,
    n = 0, more parts than samples, zero fractions, bad fractions that must raise ValueError);
    ``DataPartitioner`` on a dataset that is not a list, in two processes with different global
    random states that must compute the same partitions and leave those states untouched;
    ``label_partitions`` on lists and int64 / int32 tensors, with empty parts and negative labels.
    """
    res = run_ranks(path, probes.probe_partition, 2, "none", timeout=timeout,
                    case="sizes-sum-one",
                    what="partition_sizes / DataPartitioner / label_partitions")
    sizes, parts, again, labels, label_types = res[0]
    cases = size_cases()
    for (case, n, fr), got in zip(cases, sizes):
        if case != "sizes-raises":
            _check_sizes(case, n, fr, got)
    for (case, n, fr), got in zip(cases, sizes):
        if case == "sizes-raises" and got.get("raised") != "ValueError":
            did = f"raised {got['raised']}" if "raised" in got else f"returned {got['value']}"
            fail(case, f"partition_sizes({n}, {_fmt(fr)}) {did}; it must raise ValueError (the "
                       f"docstring's Raises: ValueError: a fraction is negative or the fractions "
                       f"sum to more than 1; a sum up to 1 + 1e-9 counts as 1, anything above "
                       f"is more than 1)")
    for (case, n, fr), got in zip(cases, sizes):
        if case != "sizes-raises" and not got["ints"]:
            fail("sizes-int", f"partition_sizes({n}, {_fmt(fr)}) returned a "
                              f"{got.get('container')} of {got['types']} values; the "
                              f"docstring's Returns: list[int]: a Python list of Python ints "
                              f"(math.floor gives one; not f * n // 1, a float, nor numpy's "
                              f"integers)")
    _check_partitioner(parts, res[1][1], again)
    _check_labels(labels)
    _check_label_types(label_types)


def _check_sizes(case, n, fr, got):
    call = f"partition_sizes({n}, {_fmt(fr)})"
    want = reference_sizes(n, fr)
    if "raised" in got:
        fail(case, f"{call} raised {got['raised']}: {got['message']}; the fractions are valid "
                   f"(non-negative, sum {sum(fr):.12g}: at most 1 + 1e-9), so it must return "
                   f"{want}: {SIZES_RULE}. The docstring: {SIZES_PROMISE[case]}")
    if got["value"] != want or not got["exact"]:
        near = ""
        if case == "sizes-near-one":
            how = "within" if abs(sum(fr) - 1) <= NEAR_ONE else "more than"
            near = f" The fractions sum to {sum(fr):.12g}: {how} 1e-9 of 1."
        fail(case, f"{call} returned {got['value']}; expected {want}: {SIZES_RULE}.{near} The "
                   f"docstring: {SIZES_PROMISE[case]}")


def _check_partitioner(parts, other, again):
    """DataPartitioner: sizes, disjoint, use(i), shuffled, then across cases and processes."""
    for (n, fr, seed), got in zip(PARTITIONER_CASES, parts):
        _check_parts(f"DataPartitioner(data of {n}, {_fmt(fr)}, seed={seed})", n, fr, got)
    for (n, fr, seed), a, b in zip(PARTITIONER_CASES, parts, other):
        if a["parts"] != b["parts"]:
            fail("parts-same-on-ranks",
                 f"DataPartitioner(data of {n}, {_fmt(fr)}, seed={seed}): process 0 and process "
                 f"1 computed different partitions (their global random states differ): the "
                 f"shuffle uses its own generator, so every rank computes the same partitions "
                 f"whatever its global seed (the docstring)")
    for (n, fr, seed), a in zip(PARTITIONER_CASES, parts):
        if not a["rng_kept"]:
            fail("parts-rng-kept",
                 f"DataPartitioner(data of {n}, {_fmt(fr)}, seed={seed}) changed the global "
                 f"random state (random, numpy or torch): the docstring says it leaves it "
                 f"untouched; shuffle with a private generator, e.g. random.Random(seed) or "
                 f"torch.Generator().manual_seed(seed), never random.seed / np.random.seed / "
                 f"torch.manual_seed")
    if again != parts[0]["parts"]:
        fail("parts-seed", "DataPartitioner with the same seed gave different partitions on a "
                           "second call in the same process: the shuffle depends on seed only")
    if parts[0]["parts"] == parts[-1]["parts"]:
        fail("parts-seed", "DataPartitioner with seeds 1234 and 99 gave the same partitions: "
                           "seed is the seed of the shuffle (the docstring)")


def _check_parts(call, n, fr, got):
    want = reference_sizes(n, fr)
    if "raised" in got:
        fail("parts-sizes", f"{call} raised {got['raised']}; data is a dataset (anything with "
                            f"len, here not a list), and the part sizes are partition_sizes("
                            f"len(data), sizes) = {want}")
    parts = got["parts"]
    if [len(p) for p in parts] != want:
        fail("parts-sizes", f"{call} made parts of sizes {[len(p) for p in parts]}; expected "
                            f"partition_sizes({n}, {_fmt(fr)}) = {want} (the docstring: the part "
                            f"sizes are partition_sizes(len(data), sizes))")
    flat = [i for p in parts for i in p]
    if len(set(flat)) != len(flat) or not set(flat) <= set(range(n)):
        fail("parts-disjoint", f"{call}: the parts must hold distinct indices of range({n}) "
                               f"(the docstring: The parts are disjoint; they cover every index "
                               f"when the fractions sum to 1): cut ONE shuffled list of indices")
    if not got["right_samples"]:
        fail("parts-use", f"{call}: use(i)[j] must be data[partitions[i][j]]: use(i) returns "
                          f"part i as a Partition of data (Partition(data, partitions[i]))")
    if n >= 20 and flat == sorted(flat):
        fail("parts-shuffled", f"{call} is not shuffled: its parts are consecutive index ranges "
                               f"(the docstring: part i holds the next partition_sizes(...)[i] "
                               f"indices of the shuffled range(len(data))). Shuffle "
                               f"range(len(data)) with the seeded generator first")


def _check_label_types(types):
    """``label_partitions`` returns list[list[int]]: Python lists of Python ints."""
    for (_, lab, k, kind), got in zip(LABEL_CASES, types):
        if got is not None and (got[0] != "list" or any(t != "list" for t in got[1])
                                or any(t != "int" for t in got[2])):
            given = "a list" if kind == "list" else f"a 1-D {kind} tensor"
            fail("labels-type", f"label_partitions(labels, {k}) with labels {lab} ({given}) "
                 f"returned a {got[0]} of {got[1] or 'no parts'} holding {got[2] or 'nothing'}"
                 f"; the docstring's Returns: list[list[int]]: a list of lists of Python ints "
                 f"(labels.tolist() gives Python ints; numpy's and 0-d tensors are not)")


def _check_labels(labels):
    for (case, lab, k, kind), got in zip(LABEL_CASES, labels):
        want = reference_label_partitions(lab, k)
        given = "a list" if kind == "list" else f"a 1-D {kind} tensor"
        call = f"label_partitions(labels, {k}) with labels {lab} ({given})"
        if isinstance(got, dict):
            fail(case, f"{call} raised {got['raised']}; labels is a list or a 1-D tensor of ints, "
                       f"and there may be more parts than labels (empty parts) or no label at all")
        if len(got) != k or [set(p) for p in got] != [set(p) for p in want]:
            fail(case, f"{call} returned {got}; expected {want}: split the sorted distinct labels "
                       f"{sorted(set(lab))} into {k} contiguous groups as equal as possible, "
                       f"earlier groups one larger (like numpy.array_split; a group, and its "
                       f"part, may be empty); part r holds the indices of the samples with a "
                       f"label of group r"
                       + (". labels may be a tensor: compare its values (labels.tolist()), "
                          "not its 0-d tensor elements" if kind != "list" else ""))
    for (case, lab, k, kind), got in zip(LABEL_CASES, labels):
        want = reference_label_partitions(lab, k)
        if got != want:
            fail("labels-order", f"label_partitions(labels, {k}) with labels {lab} returned "
                                 f"{got}; expected {want}: part r holds, in increasing order, "
                                 f"the indices of the samples whose label is in group r")


# ---------------------------------------------------------------- gradient averaging
TIGHT = {"float32": (1e-5, 1e-4), "float64": (1e-12, 1e-10)}   # atol, rtol per dtype: float64
#                                   results must not have passed through float32 on the way
AVG_PROMISE = {
    "avg-values": "On return every rank's p.grad holds sum_r (n_r / N) * g_r, with N the total "
                  "number of samples, itself obtained with an all_reduce",
    "avg-model": "model: any model: frozen, unused, tied, transposed (non-contiguous) and 0-d "
                 "parameters (reshape a gradient, do not view it)",
    "avg-float64": "gradients are float32 or float64: keep their dtype all the way (no float32 "
                   "buffer)",
    "avg-group": "average over the ranks of group only",
    "avg-empty-rank": "num_samples may be 0 on a rank (its gradients are then zeros); that rank "
                      "still takes part in every all_reduce",
    "avg-varying": "Which parameters have a gradient may change from one call to the next (a "
                   "layer the forward skips in some steps, one frozen for a while): look at "
                   "p.grad in every call",
}


def _avg_diagnosis(got, case, splits, batches):
    """Name the classic mistake the step-1 gradients match, if any."""
    sizes, world = np.array(splits[0], dtype=np.float64), len(splits[0])
    local = [avg_run(avg_model(), batches[:1], rows(splits, r))[0] for r in range(world)]
    candidates = {
        "the plain average of the ranks' gradients, sum_r g_r / world_size, which is right "
        "only when every rank holds the same number of samples": np.ones(world) / world,
        "the plain sum of the ranks' gradients": np.ones(world),
        "sum_r n_r * g_r divided by world_size instead of by N = sum_r n_r": sizes / world}
    for text, weights in candidates.items():
        cand = {k: sum(w * g[k] for w, g in zip(weights, local)) for k in local[0]}
        if all(np.allclose(got[k], cand[k], atol=1e-5, rtol=1e-4) for k in cand):
            return f" Your gradients are {text}."
    return ""


def _why_ranks_differ(grads, first):
    """Two ranks' gradients differ: all by one factor (each rank divided the same sum by its
    own N), or not (some gradient was not reduced)."""
    ratios = [float(np.sum(grads[k] * first[k]) / np.sum(first[k] * first[k])) for k in first
              if np.any(first[k])]
    if ratios and all(np.allclose(grads[k], ratios[0] * first[k], atol=1e-6, rtol=1e-4)
                      for k in first):
        return (f"every gradient differs by the same factor {ratios[0]:.4g}: the ranks reduced "
                f"the same sum but divided it by different numbers. N = sum_r n_r is the same on "
                f"every rank: all_reduce the sample counts (num_samples * world_size is not N "
                f"when the ranks hold different numbers of samples)")
    return "every parameter's gradient must be reduced"


@check
def check_average_gradients(path, timeout=TIMEOUT):
    """Check ``average_gradients`` with 3 and 2 ranks (one launch each): SGD with unequal local
    batches equals single-process SGD on the concatenated batches, on FrozenTiedNet, on EdgeNet
    (frozen, unused, tied, transposed and 0-d parameters) in float32 and float64, on a
    BranchNet whose parameters with a gradient change from step to step (``avg-varying``:
    compared after every step), with a rank that holds no sample in a step, and (3 ranks)
    inside process groups of non-consecutive ranks (``group=``), each averaging over its own
    ranks. Where links are observed (grading)
    with a wide model more, and all links together must carry what the all_reduces put there
    (``avg-wire``, :mod:`.wire`: right files measured 1.08 to 1.22 times the least, 0.78 to
    0.87 of the most; every rank's gradient gathered beside the all_reduces, 1.9 times it)."""
    observed = observing()
    for size in (3, 2):      # 3 first: every case runs there (a group too)
        salts, links = {}, {}    # (at grading each rank's rows derive from a number only it knows)
        out = run_ranks(path, probes.probe_average_gradients, size, "gloo", {"wire": observed},
                        timeout=timeout, case="avg-values", what="average_gradients",
                        salts=salts, links=links)
        cases = avg_cases(size, observed)
        for i, (case, kind, dtype, splits, grouped) in enumerate(cases):
            got = [r[i] for r in out]
            if grouped:
                _check_avg_groups(got, size, salts)
            else:
                _check_avg_case(case, kind, dtype, splits, got, list(range(size)), salts=salts)
        check_avg_wire(links, size, cases)


def _check_avg_case(case, kind, dtype, splits, got, ranks, where=None, salts=None):
    """The ranks ``ranks`` (their results ``got``) against one process on their rows
    (``salts``: each rank's, from which its rows derive)."""
    batches = avg_batches(splits, kind, dtype, salts)
    ref_steps = []
    ref_grads, ref_state = avg_run(avg_model(kind, dtype), batches, group_rows(splits, ranks),
                                   vary=probes.vary_of(kind), steps=ref_steps)
    sizes = [[s[r] for r in ranks] for s in splits]
    model = {"tied": "FrozenTiedNet", "edge": "EdgeNet (eval mode)",
             "branch": "BranchNet"}.get(kind, f"a wide {kind}")
    where = where or f"{len(ranks)} ranks"
    call = f"average_gradients on a {dtype} {model} with {where} and local batch sizes {sizes}"
    for rank, r in zip(ranks, got):
        if set(r["grads"]) != set(ref_grads):
            fail("avg-no-grad", f"rank {rank}: after {call} the parameters with a gradient are "
                                f"{sorted(r['grads'])}; expected {sorted(ref_grads)}: Parameters "
                                f"whose grad is None (frozen or unused) are skipped (the "
                                f"docstring): leave their .grad None, do not give them one")
    if case == "avg-varying":
        _check_avg_steps(call, got, ranks, ref_steps, TIGHT[dtype])
    first = got[0]["grads"]
    for rank, r in zip(ranks, got):
        for name in r["grads"]:
            if not np.allclose(r["grads"][name], first[name], atol=1e-6, rtol=1e-5):
                why = ("a rank with 0 samples must still call the same all_reduce(s) as the "
                       "others, with its zero gradients" if case == "avg-empty-rank" else
                       _why_ranks_differ(r["grads"], first))
                fail(case, f"rank {ranks[0]} and rank {rank} hold different gradients of {name} "
                           f"after {call}: {why}. The docstring: {AVG_PROMISE[case]}.")
    hint = _avg_diagnosis(first, case, splits, batches) if case == "avg-values" else ""
    atol, rtol = TIGHT[dtype]
    for rank, r in zip(ranks, got):
        assert_close(r["grads"], ref_grads, f"gradients after {call}, step 1, must equal the "
                     f"gradient of the mean loss over all {sum(sizes[0])} samples: sum_r (n_r / "
                     f"N) * g_r.{hint} The docstring: {AVG_PROMISE[case]}", rank, atol, rtol,
                     case=case, dtype=True)
        assert_close(r["state"], ref_state, f"parameters after {len(splits)} SGD steps with "
                     f"{call} must equal single-process SGD on the concatenated batches. The "
                     f"docstring: {AVG_PROMISE[case]}", rank, atol, rtol, case=case, dtype=True)


def _check_avg_steps(call, got, ranks, ref_steps, tol):
    """``avg-varying``: after every call, the parameters with a gradient are that step's (the
    branch used in step 2 only, fc1 frozen in step 1 only: :func:`.probes.vary_grads`), and
    their gradients the weighted average."""
    for step, want in enumerate(ref_steps):
        what = (f"step {step + 1}, where the parameters with a gradient are {sorted(want)} (the "
                f"branch is used in step 2 only; fc1 is frozen in step 1 only)")
        for rank, r in zip(ranks, got):
            mine = r["steps"][step]
            if set(mine) != set(want):
                fail("avg-varying", f"rank {rank}: after {call}, {what}, the parameters with a "
                                    f"gradient are {sorted(mine)}. {AVG_PROMISE['avg-varying']} "
                                    f"(the docstring): a parameter whose grad is None in this "
                                    f"call is skipped (its .grad stays None), one that has a "
                                    f"gradient now is averaged, whatever the earlier calls saw")
            assert_close(mine, want, f"gradients after {call}, {what}, must be sum_r (n_r / N) "
                         f"* g_r. {AVG_PROMISE['avg-varying']} (the docstring): do not keep the "
                         f"list of parameters (or a buffer laid out for them) from an earlier "
                         f"call", rank, *tol, case="avg-varying", dtype=True)


def _check_avg_groups(got, size, salts=None):
    splits = [AVG_GROUP_SPLIT]
    batches = avg_batches(splits, salts=salts)
    everyone = avg_run(avg_model(), batches)[0]
    for ranks in AVG_GROUPS[size]:
        where = f"group=dist.new_group({ranks}) of {size} ranks"
        for rank in ranks:
            mine = got[rank]["grads"]
            if len(ranks) < size and all(k in mine and np.allclose(
                    mine[k], everyone[k], atol=1e-6, rtol=1e-5) for k in everyone):
                fail("avg-group", f"rank {rank}: average_gradients(model, n, {where}) averaged "
                                  f"over all {size} ranks; it must average over the ranks of "
                                  f"`group` only ({ranks}): pass group=group to every all_reduce")
        _check_avg_case("avg-group", "tied", "float32", splits, [got[r] for r in ranks], ranks,
                        where, salts)
