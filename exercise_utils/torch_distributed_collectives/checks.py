"""Checkers of notebook 03 for data partitions, gradient averaging and the CPU SyncBatchNorm.

``check_partition``, ``check_average_gradients`` and ``check_sync_batchnorm`` run the student
file in fresh processes through :func:`exercise_utils.harness.run_ranks` (world sizes 2 and
3, the probes of :mod:`.probes`), compare with a reference computed here, and raise
``AssertionError`` with a message the student can act on. ``check_sync_batchnorm`` compares
outputs, input and parameter gradients, running statistics and eval-mode outputs with a single
``nn.BatchNorm`` on the concatenated batch, with unequal local batch sizes. With 3 ranks,
``check_average_gradients`` and ``check_sync_batchnorm`` also run inside process groups (rank
0 alone, ranks 1 and 2), whose results must cover their own ranks only. The ring all-reduce's
checker is :mod:`.checks_ring`.

Used in 03_torch_distributed_collectives.
"""
import math

import numpy as np
import torch

from ..harness import HANG_AFTER, assert_close, run_ranks
from . import probes
from .probes import (AVG_GROUP_SPLIT, AVG_GROUPS, AVG_SPLITS, BAD_CASES, BN_CASES, BN_GROUP_CASE,
                     BN_GROUPS, BN_STEPS, LABEL_CASES, PARTITIONER_CASES, SIZE_CASES, avg_batches,
                     avg_model, avg_run, bn_data, bn_layer, bn_run, rows)

TIMEOUT = HANG_AFTER     # seconds without progress before a launch is a hang (harness)


# ---------------------------------------------------------------- partitions
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


def _fmt(fractions):
    return "[" + ", ".join(f"{f:.4g}" for f in fractions) + "]"


def check_partition(path, timeout=TIMEOUT):
    """Check ``partition_sizes``, ``DataPartitioner`` and ``label_partitions`` of ``path``.

    Two processes with different global random states must compute the same partitions.
    """
    res = run_ranks(path, probes.probe_partition, 2, "none", timeout=timeout,
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
def _avg_diagnosis(got, splits, batches):
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
            return f" Your gradients are {text}"
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


def check_average_gradients(path, timeout=TIMEOUT):
    """Check ``average_gradients``: SGD with unequal local batches equals single-process SGD;
    with 3 ranks also inside process groups (``group=``), each averaging over its own ranks."""
    for size in (2, 3):
        splits = AVG_SPLITS[size]
        batches = avg_batches(splits)
        ref_grads, ref_state = avg_run(avg_model(), batches)
        out = run_ranks(path, probes.probe_average_gradients, size, "gloo", timeout=timeout,
                        what="average_gradients")
        res = [(r["grads"], r["state"]) for r in out]
        for rank, (grads, _) in enumerate(res):
            if set(grads) != set(ref_grads):
                raise AssertionError(f"rank {rank}: after average_gradients the parameters with a "
                                     f"gradient are {sorted(grads)}; expected {sorted(ref_grads)} "
                                     f"(leave parameters whose grad is None alone)")
            for name in grads:
                if not np.allclose(grads[name], res[0][0][name], atol=1e-6, rtol=1e-5):
                    raise AssertionError(
                        f"rank 0 and rank {rank} hold different gradients of {name} after "
                        f"average_gradients: {_why_ranks_differ(grads, res[0][0])}")
        hint = _avg_diagnosis(res[0][0], splits, batches)
        for rank, (grads, state) in enumerate(res):
            assert_close(grads, ref_grads, f"gradients after average_gradients in step 1 with "
                         f"local batch sizes {splits[0]} must equal the gradient of the mean loss "
                         f"over all {sum(splits[0])} samples: sum_r (n_r / N) * g_r.{hint}", rank)
            assert_close(state, ref_state, f"parameters after {len(splits)} SGD steps with local "
                         f"batch sizes {splits} must equal single-process SGD on the concatenated "
                         f"batches", rank)
        if size in AVG_GROUPS:
            _check_avg_groups([r["group_grads"] for r in out], size)


def _span(sizes, ranks):
    """The rows of the concatenated batch that the (consecutive) ``ranks`` hold."""
    return slice(sum(sizes[:ranks[0]]), sum(sizes[:ranks[-1] + 1]))


def _check_avg_groups(got, size):
    batches = avg_batches([AVG_GROUP_SPLIT])
    everyone = avg_run(avg_model(), batches)[0]
    for ranks in AVG_GROUPS[size]:
        part = _span(AVG_GROUP_SPLIT, ranks)
        want = avg_run(avg_model(), batches, lambda step: part)[0]
        call = (f"average_gradients(model, n, group=dist.new_group({ranks})) with local batch "
                f"sizes {AVG_GROUP_SPLIT} on {size} ranks")
        for rank in ranks:
            if all(k in got[rank] and np.allclose(got[rank][k], everyone[k], atol=1e-6,
                                                  rtol=1e-5) for k in want):
                raise AssertionError(
                    f"rank {rank}: {call} averaged over all {size} ranks; it must average over "
                    f"the ranks of `group` only ({ranks}): pass group=group to every all_reduce")
            assert_close(got[rank], want, f"{call} must give the gradient of the mean loss over "
                         f"the samples of the group's ranks {ranks} only", rank)


# ---------------------------------------------------------------- SyncBatchNorm
def _bn_candidates(case, x):
    """Training outputs of two flawed BatchNorms: local statistics; unweighted means of them."""
    layer, dims = bn_layer(case), [0] + list(range(2, x.dim()))
    view = (1, -1) + (1,) * (x.dim() - 2)
    chunks = torch.split(x.double(), case["sizes"])
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
              "var = sumsq/N - mean^2",
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


def _bn_close(name, got, want, where, rank=None, hint=""):
    assert_close({name: got}, {name: want}, f"{where}: {BN_HINTS.get(name, '')}{hint}", rank,
                 1e-4, 1e-3)


def _bn_where(case, ranks):
    kind = f"DistributedBatchNorm{2 if case['spatial'] else 1}d"
    extra = "" if case.get("affine", True) else ", affine=False, track_running_stats=False"
    return (f"{kind}, {ranks}, local batch sizes {case['sizes']}, momentum={case['momentum']}"
            f"{extra}")


def _check_bn_case(case, steps, x_eval, res, ranks, where):
    """Compare the ranks ``ranks`` (results ``res``, local batches ``case['sizes']`` of the
    inputs ``steps``) with one ``nn.BatchNorm`` on their concatenated batches."""
    ref, sizes = bn_run(bn_layer(case), steps, x_eval), case["sizes"]
    split = lambda a: np.split(a, np.cumsum(sizes)[:-1])
    if not all(r["is_student_class"] for r in res):
        raise AssertionError(f"convert_batchnorm must replace nn.BatchNorm layers by "
                             f"DistributedBatchNorm layers ({where})")
    for step, (x, _) in enumerate(steps):
        at = f"step {step + 1}, {where}"
        got = [r["y"][step] for r in res]
        match = lambda cand: all(np.allclose(g, c, atol=1e-4, rtol=1e-3) for g, c in zip(got, cand))
        hint = next((f". Your output is {text}" for text, cand in
                     zip(BN_FORWARD_FLAWS, _bn_candidates(case, x)) if match(cand)), "")
        for rank, r, y in zip(ranks, res, split(ref["y"][step])):
            _bn_close("output", r["y"][step], y, f"training output, {at}", rank, hint)
        for rank, r, dx in zip(ranks, res, split(ref["dx"][step])):
            _bn_close("input.grad", r["dx"][step], dx, f"gradient w.r.t. the input, {at}", rank)
        for name in ("dweight", "dbias") if ref["dweight"] else ():
            _bn_close(f"{name[1:]}.grad", sum(r[name][step] for r in res), ref[name][step],
                      f"gradient w.r.t. {name[1:]} summed over the ranks, {at}")
    for rank, r, want in zip(ranks, res, split(ref["eval"])):
        if case.get("track", True):
            tracked = int(r["buffers"].get("num_batches_tracked", -1))
            if tracked != BN_STEPS:
                raise AssertionError(f"rank {rank}: num_batches_tracked is {tracked} after "
                                     f"{BN_STEPS} training steps; expected {BN_STEPS} ({where})")
            for name in ("running_mean", "running_var"):
                _bn_close(name, r["buffers"][name], ref["buffers"][name],
                          f"{name} after {BN_STEPS} steps, {where}", rank)
        _bn_close("eval output", r["eval"], want, f"eval-mode output, {where}", rank)


def _check_bn_groups(size, res):
    """The group case: each process group of ``BN_GROUPS[size]`` normalises over its own ranks."""
    case, (steps, x_eval) = BN_GROUP_CASE, bn_data(BN_GROUP_CASE)
    everyone = bn_run(bn_layer(case), steps, x_eval)["y"][0]
    for ranks in BN_GROUPS[size]:
        part = _span(case["sizes"], ranks)
        sub = dict(case, sizes=[case["sizes"][r] for r in ranks])
        where = _bn_where(sub, f"group=dist.new_group({ranks}) of {size} ranks")
        mine = everyone[part]
        for rank, y in zip(ranks, np.split(mine, np.cumsum(sub["sizes"])[:-1])):
            if len(ranks) < size and np.allclose(res[rank]["y"][0], y, atol=1e-4, rtol=1e-3):
                raise AssertionError(
                    f"rank {rank}: {where}: the training output is normalised with the "
                    f"statistics of all {size} ranks; with a group they must span the batches "
                    f"of the group's ranks {ranks} only: pass group=self.group to the all_reduce "
                    f"(convert_batchnorm hands the group to every layer)")
        _check_bn_case(sub, [(x[part], w[part]) for x, w in steps], x_eval[part],
                       [res[r] for r in ranks], ranks, where)


def check_sync_batchnorm(path, timeout=TIMEOUT):
    """Check ``DistributedBatchNorm`` (via ``convert_batchnorm``) against ``nn.BatchNorm``
    on the concatenated batch: outputs, input and parameter gradients, running statistics,
    eval mode; BatchNorm1d and 2d, unequal local batch sizes, 2 and 3 ranks, a layer without
    affine parameters or running statistics, and (3 ranks) process groups."""
    for size in (2, 3):
        res = run_ranks(path, probes.probe_sync_batchnorm, size, "gloo", timeout=timeout,
                        what="DistributedBatchNorm")
        for i, case in enumerate(BN_CASES[size]):
            steps, x_eval = bn_data(case)
            _check_bn_case(case, steps, x_eval, [r[i] for r in res], list(range(size)),
                           _bn_where(case, f"{size} ranks"))
        if size in BN_GROUPS:
            _check_bn_groups(size, [r[len(BN_CASES[size])] for r in res])
