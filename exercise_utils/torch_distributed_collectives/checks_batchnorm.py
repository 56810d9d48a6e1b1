"""Checker of notebook 03's SyncBatchNorm exercise (``work/03_sync_batchnorm.py``).

:func:`check_sync_batchnorm` runs the student's ``DistributedBatchNorm`` (through
``convert_batchnorm``) in fresh gloo processes (3 ranks, then 2; one launch each) on every case
of :func:`.probes_batchnorm.bn_cases`: a baseline, then one dimension changed at a time. It
compares outputs, input and parameter gradients, running statistics and eval-mode outputs with
one ``nn.BatchNorm`` on the concatenated batch. On the baseline each aspect has its own case
(``bn-output``, ``bn-backward``, ``bn-running``, ``bn-eval``); on any other input whatever fails
is charged to that input's case (``bn-spatial``, ``bn-float64``, ...), see :mod:`.requirements`.
Where links are observed (grading) all links together must carry what the statistics'
all_reduces put there (``bn-wire``, :mod:`.wire`), whatever the ranks do in their own memory.

Used in 03_torch_distributed_collectives.
"""
import numpy as np
import torch

from ..contract import fail
from ..harness import HANG_AFTER, check, observing, run_ranks
from ..compare import assert_close
from . import probes_batchnorm
from .probes_batchnorm import BN_STEPS, bn_cases, bn_data, bn_layer, bn_rows, bn_run
from .wire import check_bn_wire

TIMEOUT = HANG_AFTER     # seconds without progress before a launch is a hang (harness)


def _bn_candidates(case, x):
    """Training outputs of two flawed BatchNorms: local statistics; unweighted means of them."""
    layer, dims = bn_layer(case), [0] + list(range(2, x.dim()))
    view = (1, -1) + (1,) * (x.dim() - 2)
    chunks = list(torch.split(x.double(), case["sizes"]))
    if any(len(c) == 0 for c in chunks):
        return []
    local = [(c.mean(dims), c.var(dims, unbiased=False)) for c in chunks]
    unweighted = [tuple(sum(s) / len(local) for s in zip(*local))] * len(local)
    weight, bias = ((t.detach().double().view(view) for t in (layer.weight, layer.bias))
                    if layer.affine else (1.0, 0.0))
    return [[((c - m.view(view)) / torch.sqrt(v.view(view) + 1e-5) * weight + bias).numpy()
             for c, (m, v) in zip(chunks, stats)] for stats in (local, unweighted)]


BN_FORWARD_FLAWS = (
    "plain BatchNorm on the local batch: the ranks did not combine their statistics",
    "normalised with the unweighted average of the ranks' means and variances: wrong when local "
    "batch sizes differ, and the average of variances misses the spread between the ranks' means")
BN_HINTS = {
    "output": "normalise with the mean and biased variance of the global batch (all ranks): "
              "all_reduce the count, sum and sum of squares per channel; mean = sum/N, "
              "var = sumsq/N - mean^2; output (x - mean) / sqrt(var + eps) * weight + bias",
    "input.grad": "the output is right, so the statistics are right, but autograd does not see "
                  "how they depend on the other ranks' inputs: the all_reduce must be "
                  "differentiable: use torch.distributed.nn.functional.all_reduce, not "
                  "dist.all_reduce (invisible to autograd) or a detached tensor",
    "running_mean": "it must move towards the mean of the global batch (momentum None: "
                    "cumulative average with factor 1/num_batches_tracked)",
    "running_var": "the running variance must use the unbiased variance of the global batch: "
                   "sumsq/N - mean^2 scaled by N/(N-1) (momentum None: cumulative average with "
                   "factor 1/num_batches_tracked)",
    "eval output": "eval mode must normalise with the running statistics (without running "
                   "statistics, track_running_stats=False: with the global batch's, as in "
                   "training)"}
# What each case holds the layer to (the notebook's words), for the messages.
BN_PROMISE = {
    "bn-output": "mean and biased variance per channel over all ranks' samples (and positions); "
                 "Local batch sizes may differ",
    "bn-backward": "a differentiable torch.distributed.nn.functional.all_reduce (SUM) of the "
                   "count, the sum and the sum of squares, so backward is right on every rank",
    "bn-running": "When tracking, num_batches_tracked += 1 and running_mean / running_var move "
                  "towards the global mean and the *unbiased* global variance",
    "bn-eval": "Eval mode (given): normalises with the running statistics",
    "bn-spatial": "inputs (N, C) or (N, C, ...): mean and biased variance per channel over all "
                  "ranks' samples (and positions)",
    "bn-momentum": "momentum: as in nn.BatchNorm1d (momentum=None: cumulative average, factor "
                   "1 / num_batches_tracked)",
    "bn-float64": "float32 or float64: the output, gradients and running statistics keep the "
                  "input's dtype (no float32 statistics for float64 inputs)",
    "bn-empty-rank": "Local batch sizes may differ (a rank's batch may even be empty)",
    "bn-eps": "output (x - mean) / sqrt(var + eps) * weight + bias: eps inside the square root "
              "(a channel whose variance is about eps shows it)",
    "bn-no-stats": "affine=False has no weight or bias; without running statistics "
                   "(track_running_stats=False) eval mode normalises with the global batch's "
                   "statistics, as in training",
    "bn-group": "the statistics span the batches of its ranks only",
}
BN_TOL = {"float32": (1e-4, 1e-3), "float64": (1e-10, 1e-8)}


def _bn_where(case, ranks):
    kind = f"DistributedBatchNorm{2 if len(case['spatial']) == 2 else 1}d"
    shape = ("(N, C)", "(N, C, L)", "(N, C, H, W)")[len(case["spatial"])]
    extra = "" if case.get("affine", True) else ", affine=False, track_running_stats=False"
    near = ", channel 0 nearly constant (variance about eps)" if case.get("near_constant") else ""
    return (f"{kind} on {case['dtype']} inputs {shape}, {ranks}, local batch sizes "
            f"{case['sizes']}, momentum={case['momentum']}{extra}{near}")


def _bn_close(aspect, name, got, want, where, case, rank=None, hint=""):
    """Compare one array; the message leads with what the case changed (the notebook's words),
    or on the baseline with what to do for this array."""
    charged = aspect(case["case"])
    advice = f"{BN_HINTS.get(name, '')}{hint}"
    if charged == case["case"] != "bn-output":
        text = f"the notebook: {BN_PROMISE[charged]}. Else: {advice}"
    else:
        text = f"{advice}. The notebook: {BN_PROMISE[charged]}."
    atol, rtol = BN_TOL[case["dtype"]]
    assert_close({name: got}, {name: want}, f"{where}: {text}", rank, atol, rtol, case=charged,
                 dtype=True)


def _aspects(case):
    """On the baseline each aspect is its own case; on any other input all are charged to it."""
    own = {"output": "bn-output", "backward": "bn-backward", "running": "bn-running",
           "eval": "bn-eval"}
    if case["case"] == "bn-output":
        return lambda kind: (lambda _: own[kind])
    return lambda kind: (lambda name: name)


def _check_bn_case(case, steps, x_eval, res, ranks, where, rows):
    """Compare the ranks ``ranks`` (results ``res``; their rows ``rows`` of the inputs
    ``steps``) with one ``nn.BatchNorm`` on those rows."""
    ref = bn_run(bn_layer(case), steps, x_eval, rows)
    sizes = [case["sizes"][r] for r in ranks]
    split = lambda a: np.split(a, np.cumsum(sizes)[:-1])
    aspect = _aspects(case)
    if not all(r["is_student_class"] for r in res):
        fail(aspect("output")(case["case"]),
             f"convert_batchnorm must replace nn.BatchNorm layers by DistributedBatchNorm "
             f"layers ({where})")
    for step, (x, _) in enumerate(steps):
        at = f"step {step + 1}, {where}"
        got = [r["y"][step] for r in res]
        match = lambda cand: all(np.allclose(g, c, atol=1e-4, rtol=1e-3) for g, c in zip(got, cand))
        hint = next((f". Your output is {text}" for text, cand in
                     zip(BN_FORWARD_FLAWS, _bn_candidates(dict(case, sizes=sizes), x[rows]))
                     if match(cand)), "")
        for rank, r, y in zip(ranks, res, split(ref["y"][step])):
            _bn_close(aspect("output"), "output", r["y"][step], y, f"training output, {at}",
                      case, rank, hint)
        for rank, r, dx in zip(ranks, res, split(ref["dx"][step])):
            _bn_close(aspect("backward"), "input.grad", r["dx"][step], dx,
                      f"gradient w.r.t. the input, {at}", case, rank)
        for name in ("dweight", "dbias") if ref["dweight"] else ():
            _bn_close(aspect("backward"), f"{name[1:]}.grad", sum(r[name][step] for r in res),
                      ref[name][step], f"gradient w.r.t. {name[1:]} summed over the ranks, {at}",
                      case)
    for rank, r, want in zip(ranks, res, split(ref["eval"])):
        if case.get("track", True):
            tracked = int(r["buffers"].get("num_batches_tracked", -1))
            if tracked != BN_STEPS:
                fail(aspect("running")(case["case"]),
                     f"rank {rank}: num_batches_tracked is {tracked} after {BN_STEPS} training "
                     f"steps; expected {BN_STEPS}: When tracking, num_batches_tracked += 1 "
                     f"({where})")
            for name in ("running_mean", "running_var"):
                _bn_close(aspect("running"), name, r["buffers"][name], ref["buffers"][name],
                          f"{name} after {BN_STEPS} steps, {where}", case, rank)
        _bn_close(aspect("eval"), "eval output", r["eval"], want, f"eval-mode output, {where}",
                  case, rank)


def _check_bn_groups(case, res, size, salts=None):
    """The group case: each process group normalises over its own ranks only."""
    steps, x_eval = bn_data(case, salts)
    everyone = bn_run(bn_layer(case), steps, x_eval)["y"][0]
    for ranks in case["group"]:
        rows = bn_rows(case["sizes"], ranks)
        where = _bn_where(case, f"group=dist.new_group({ranks}) of {size} ranks")
        mine = everyone[rows.numpy()]
        sizes = [case["sizes"][r] for r in ranks]
        for rank, y in zip(ranks, np.split(mine, np.cumsum(sizes)[:-1])):
            if len(ranks) < size and np.allclose(res[rank]["y"][0], y, atol=1e-4, rtol=1e-3):
                fail("bn-group",
                     f"rank {rank}: {where}: the training output is normalised with the "
                     f"statistics of all {size} ranks; with a group they must span the batches "
                     f"of the group's ranks {ranks} only: pass group=self.group to the all_reduce "
                     f"(convert_batchnorm hands the group to every layer)")
        _check_bn_case(case, steps, x_eval, [res[r] for r in ranks], ranks, where, rows)


@check
def check_sync_batchnorm(path, timeout=TIMEOUT):
    """Check ``DistributedBatchNorm`` (via ``convert_batchnorm``) against ``nn.BatchNorm``
    on the concatenated batch: outputs, input and parameter gradients, running statistics,
    eval mode; with 3 and 2 ranks (one launch each) a baseline, then one dimension changed at
    a time (:func:`.probes_batchnorm.bn_cases`): (N, C, L) and (N, C, H, W) inputs, momentum
    None and 0.3, float64, an empty local batch, a channel whose variance is about eps, a
    layer without affine parameters or running statistics, and (3 ranks) process groups of
    non-consecutive ranks. Where links are observed (grading) with large local batches more
    (:data:`.probes_batchnorm.BN_WIRE`), and all links together must carry what the
    statistics' all_reduces put there, never the batch (``bn-wire``, :mod:`.wire`: right files
    measured 0.16 to 0.41 of the most; the large batch gathered, 8.6 times it)."""
    observed = observing()
    for size in (3, 2):      # 3 first: every case runs there (a group too)
        salts, links = {}, {}    # (at grading each rank's rows derive from a number only it knows)
        res = run_ranks(path, probes_batchnorm.probe_sync_batchnorm, size, "gloo",
                        {"wire": observed}, timeout=timeout, case="bn-output",
                        what="DistributedBatchNorm", salts=salts, links=links)
        cases = bn_cases(size, observed)
        for i, case in enumerate(cases):
            got = [r[i] for r in res]
            if case.get("group"):
                _check_bn_groups(case, got, size, salts)
                continue
            steps, x_eval = bn_data(case, salts)
            ranks = list(range(size))
            _check_bn_case(case, steps, x_eval, got, ranks, _bn_where(case, f"{size} ranks"),
                           bn_rows(case["sizes"], ranks))
        check_bn_wire(links, size, cases)
