"""Checkers of notebook 02: the sampler exercise (``partition_indices`` against the real
thing) and the Hogwild exercise (``train_worker`` and ``hogwild``).

``check_sampler`` compares the student's ``partition_indices`` with
``torch.utils.data.DistributedSampler`` over many (dataset size, replicas, rank, shuffle,
seed, epoch, drop_last) combinations, and names the first problem it finds in this order:
lengths, samples never visited, ignored epoch or seed, dropped samples, padding, exact
order, and that torch's global random state is left alone. ``check_hogwild`` checks what
:func:`.probes.probe_hogwild` recorded: each worker's partition and epochs, its plain SGD steps
(against :func:`reference_worker_state`), its threads, workers that run at the same time
(spawned, not forked) on the shared model, the accuracy, that a crashed worker is reported,
and the default thread count. The probes run in a fresh process
(:func:`exercise_utils.harness.run_ranks`), never in the notebook kernel.

Used in 02_shared_memory_hogwild.
"""
import math
from collections import Counter

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

from ..harness import HANG_AFTER, assert_close, run_ranks, state_arrays
from . import probes
from .probes import (BATCH, EPOCHS, LR, N_SAMPLES, SEED, sampler_cases, shuffled_order,
                     task_data)

SAMPLER_TIMEOUT = HANG_AFTER    # seconds without progress before a check is a hang (harness)
HOGWILD_TIMEOUT = HANG_AFTER
MIN_ACCURACY = 0.7                          # chance is 0.25; the solution reaches about 1.0


# ---------------------------------------------------------------- sampler
def reference_partition(n, replicas, rank, shuffle, seed, epoch, drop_last):
    """What ``DistributedSampler`` yields for a dataset of ``n`` samples."""
    sampler = DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=shuffle,
                                 seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


def _call(n, replicas, rank, shuffle, seed, epoch, drop_last):
    rank = f"0..{replicas - 1}" if rank is None else rank
    return (f"partition_indices({n}, num_replicas={replicas}, rank={rank}, shuffle={shuffle}, "
            f"seed={seed}, epoch={epoch}, drop_last={drop_last})")


def _short(items, limit=16):
    items = list(items)
    return str(items) if len(items) <= limit else str(items[:limit])[:-1] + ", ...]"


def check_sampler(path, timeout=SAMPLER_TIMEOUT):
    """Check ``partition_indices`` of ``path`` against ``torch.utils.data.DistributedSampler``."""
    got, reseeded = run_ranks(path, probes.probe_sampler, 1, "none", timeout=timeout,
                              what="partition_indices")[0]
    groups = dict(zip(sampler_cases(), got))
    for check in (_check_lengths, _check_coverage, _check_epoch_and_seed, _check_dropped,
                  _check_padding, _check_exact):
        for case, per_rank in groups.items():
            check(case, per_rank, groups)
    if reseeded:
        raise AssertionError(
            "partition_indices changed torch's global random state (torch.manual_seed, or "
            "torch.randperm without generator=): every call would reseed the random numbers of "
            "the whole training (initialisation, dropout, augmentation). Shuffle with a "
            "generator of its own: g = torch.Generator(); g.manual_seed(seed + epoch); "
            "torch.randperm(dataset_len, generator=g)")


def _check_lengths(case, per_rank, groups):
    n, replicas, shuffle, seed, epoch, drop_last = case
    want = n // replicas if drop_last else math.ceil(n / replicas)
    for rank, indices in enumerate(per_rank):
        call = _call(n, replicas, rank, shuffle, seed, epoch, drop_last)
        if isinstance(indices, str):
            raise AssertionError(f"{call} {indices}")
        if len(indices) != want:
            rule = ("dataset_len // num_replicas (drop_last=True cuts the tail)" if drop_last
                    else "ceil(dataset_len / num_replicas) (drop_last=False pads with repeated "
                         "samples)")
            raise AssertionError(f"{call} returned {len(indices)} indices; every replica must "
                                 f"get {rule} = {want}")
        bad = [i for i in indices if not 0 <= i < n]
        if bad:
            raise AssertionError(f"{call} returned indices outside range({n}): {_short(bad)}")


def _check_coverage(case, per_rank, groups):
    n, replicas, shuffle, seed, epoch, drop_last = case
    seen = set().union(*per_rank)
    missing = sorted(set(range(n)) - seen)
    if not drop_last and missing:
        raise AssertionError(
            f"{_call(*case[:2], None, *case[2:])}: the replicas together never visit samples "
            f"{_short(missing)}; with drop_last=False every sample must be visited at least once "
            f"per epoch (got {per_rank})")


def _check_epoch_and_seed(case, per_rank, groups):
    n, replicas, shuffle, seed, epoch, drop_last = case
    if not shuffle or n < 10 or (epoch == 0 and seed == 0):
        return      # (small permutations of different seeds can coincide by chance)
    for other, what, fix in (((n, replicas, shuffle, seed, 0, drop_last), "epoch",
                              "seed the generator with seed + epoch, so that every epoch has "
                              "a new order (that is what set_epoch is for)"),
                             ((n, replicas, shuffle, 0, epoch, drop_last), "seed",
                              "seed the generator with seed + epoch")):
        if other != case and groups[other] == per_rank and (
                _reference_group(other) != _reference_group(case)):
            raise AssertionError(
                f"partition_indices ignores the {what}: with dataset_len={n}, num_replicas="
                f"{replicas}, shuffle=True it returns the same indices for seed={other[3]}, "
                f"epoch={other[4]} and for seed={seed}, epoch={epoch}: {per_rank}. Fix: {fix}.")


def _reference_group(case):
    return [reference_partition(case[0], case[1], rank, *case[2:]) for rank in range(case[1])]


def _check_dropped(case, per_rank, groups):
    n, replicas, shuffle, seed, epoch, drop_last = case
    if not drop_last:
        return
    order = shuffled_order(n, shuffle, seed, epoch)
    total = n // replicas * replicas
    dropped, expected = sorted(set(range(n)) - set().union(*per_rank)), sorted(order[total:])
    if dropped != expected:
        raise AssertionError(
            f"{_call(n, replicas, None, shuffle, seed, epoch, drop_last)} drops samples "
            f"{_short(dropped)}; DistributedSampler drops the last {n - total} of the "
            f"{'shuffled ' if shuffle else ''}order, here {_short(expected)}"
            f"{' (so a different few are left out in every epoch): shuffle first, then cut' if shuffle else ''}")


def _check_padding(case, per_rank, groups):
    n, replicas, shuffle, seed, epoch, drop_last = case
    if drop_last or n == 0:
        return
    order = shuffled_order(n, shuffle, seed, epoch)
    total = math.ceil(n / replicas) * replicas
    padded = (order * math.ceil(total / n))[:total]
    expected = sorted((Counter(padded) - Counter(range(n))).elements())
    got = sorted((Counter(i for r in per_rank for i in r) - Counter(range(n))).elements())
    if got != expected:
        raise AssertionError(
            f"{_call(n, replicas, None, shuffle, seed, epoch, drop_last)} pads with samples "
            f"{_short(got)}; DistributedSampler pads the {'shuffled ' if shuffle else ''}order "
            f"by repeating it from its start: the {total - n} extra samples are "
            f"{_short(padded[n:])}")


def _check_exact(case, per_rank, groups):
    for rank, indices in enumerate(per_rank):
        expected = reference_partition(case[0], case[1], rank, *case[2:])
        if indices != expected:
            call = _call(case[0], case[1], rank, *case[2:])
            hint = ("the right samples in the wrong order" if sorted(indices) == sorted(expected)
                    else "other samples than DistributedSampler")
            raise AssertionError(
                f"{call} returned {_short(indices)}, {hint}; expected {_short(expected)}. Replica "
                f"`rank` takes every num_replicas-th index of the padded (or cut) order, starting "
                f"at position rank: order[rank:total:num_replicas]")


# ---------------------------------------------------------------- hogwild
def expected_reads(rank, workers):
    """Sample indices DistributedSampler gives ``rank`` over all epochs (set_epoch each epoch)."""
    return [i for epoch in range(EPOCHS)
            for i in reference_partition(N_SAMPLES, workers, rank, True, SEED, epoch, False)]


def check_hogwild(path, timeout=HOGWILD_TIMEOUT, workers=3, crash_workers=2):
    """Check ``train_worker`` and ``hogwild`` of ``path``: partitions, epochs, threads, the
    shared model, accuracy, and that a crashed worker is reported."""
    res = run_ranks(path, probes.probe_hogwild, 1, "none",
                    {"workers": workers, "crash_workers": crash_workers}, timeout,
                    what="train_worker / hogwild")[0]
    check_serial(res, workers)
    _check_parallel(res, workers)
    if res["crash"] is None:
        raise AssertionError(
            f"hogwild() with {crash_workers} workers returned normally although one worker "
            f"crashed (it raised an exception, so its exit code was 1): after joining, check "
            f"every process's exitcode and raise RuntimeError if one is not 0, or failed "
            f"training goes unnoticed")
    _check_default_threads(res["default_threads"], crash_workers)


def _check_default_threads(default, workers):
    call = f"hogwild(model, dataset, num_workers={workers}) (threads=None)"
    used = sorted({t for seq in default["reads"].values() for _, t in seq})
    if used != [default["share"]]:
        got = f"ran with {used} thread(s)" if used else "read no sample"
        raise AssertionError(
            f"{call}: the workers {got}; threads=None means max(1, os.cpu_count() // "
            f"num_workers) = {default['share']} thread(s) per worker on this machine (its "
            f"share of the cores: more threads than cores slow everything down)")


def check_serial(res, workers):
    call = f"train_worker(rank=1, num_workers={workers}, epochs={EPOCHS})"
    (reads, counts), changed = res["serial"]["reads"], res["serial"]["changed"]
    got = [i for seq in reads.values() for i, _ in seq]
    expected, per_epoch = expected_reads(1, workers), math.ceil(N_SAMPLES / workers)
    if int(counts.sum()) != len(expected):
        raise AssertionError(
            f"{call} read {int(counts.sum())} samples; it must read exactly its own partition, "
            f"{per_epoch} of the {N_SAMPLES} samples per epoch ({len(expected)} in all), through "
            f"DistributedSampler(dataset, num_replicas={workers}, rank=1, shuffle=True, "
            f"seed=seed)")
    epochs = [got[e * per_epoch:(e + 1) * per_epoch] for e in range(EPOCHS)]
    wanted = [expected[e * per_epoch:(e + 1) * per_epoch] for e in range(EPOCHS)]
    if epochs[0] == wanted[0] and all(e == epochs[0] for e in epochs):
        raise AssertionError(
            f"{call} read the same samples in the same order in every epoch "
            f"({_short(epochs[0], 8)}): call sampler.set_epoch(epoch) at the start of every "
            f"epoch, or every epoch repeats epoch 0's shuffle (and each worker its epoch-0 "
            f"partition)")
    for epoch, (a, b) in enumerate(zip(epochs, wanted)):
        if a != b:
            raise AssertionError(
                f"{call} read {_short(a)} in epoch {epoch}; its DistributedSampler (num_replicas="
                f"{workers}, rank=1, shuffle=True, seed=seed) with set_epoch({epoch}) gives "
                f"{_short(b)}")
    _check_threads(call, reads, res["threads"])
    if changed == 0:
        raise AssertionError(f"{call} did not change the model it was given: train `model` "
                             f"itself in place (an optimizer over model.parameters()), not a copy")
    assert_close(res["serial"]["state"], reference_worker_state(workers),
                 f"{call} must take one plain SGD step per batch of its DataLoader: "
                 f"torch.optim.SGD(model.parameters(), lr=lr) with no momentum or weight decay, "
                 f"on F.cross_entropy(model(x), y); the model after it")


def reference_worker_state(workers, rank=1):
    """The model after ``train_worker(rank, workers, ...)`` alone: plain SGD on its batches."""
    x, y = task_data()
    with torch.random.fork_rng(devices=[]):      # the probe's model, without touching ours
        model = probes._model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for epoch in range(EPOCHS):
        order = reference_partition(N_SAMPLES, workers, rank, True, SEED, epoch, False)
        for start in range(0, len(order), BATCH):
            batch = order[start:start + BATCH]
            optimizer.zero_grad()
            F.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()
    return state_arrays(model)


def _check_threads(call, reads, threads):
    used = sorted({t for seq in reads.values() for _, t in seq})
    if used != [threads]:
        raise AssertionError(f"{call} ran with {used} thread(s), but threads={threads} was "
                             f"asked for: call torch.set_num_threads(threads) in the worker")


def _check_parallel(res, workers):
    call = f"hogwild(model, dataset, num_workers={workers}, epochs={EPOCHS})"
    out = res["hogwild"]
    reads, counts = out["reads"]
    pids = sorted(reads)
    if res["parent"] in pids or len(pids) != workers:
        where = "this process (no worker processes)" if res["parent"] in pids else f"{len(pids)} process(es)"
        raise AssertionError(f"{call}: samples were read by {where}; start {workers} worker "
                             f"processes, each running train_worker for its rank")
    if not (counts == EPOCHS).all():
        low, high = np.nonzero(counts < EPOCHS)[0], np.nonzero(counts > EPOCHS)[0]
        detail = (f"samples {_short(high.tolist(), 8)} were read up to {int(counts.max())} "
                  f"times: workers trained on the same samples" if len(high) else
                  f"samples {_short(low.tolist(), 8)} were read fewer times (some never)")
        raise AssertionError(
            f"{call}: every sample must be read exactly {EPOCHS} times (once per epoch, by one "
            f"worker), but {detail}. Give each worker its own rank (0 ... num_workers-1), and "
            f"join every worker before returning.")
    expected = {r: expected_reads(r, workers) for r in range(workers)}
    for pid, seq in reads.items():
        samples = [i for i, _ in seq]
        if samples not in expected.values():
            raise AssertionError(f"{call}: a worker read {_short(samples)}, which is no rank's "
                                 f"DistributedSampler order (rank 0 expected: "
                                 f"{_short(expected[0])})")
    if out["together"] < workers:
        raise AssertionError(
            f"{call}: at most {out['together']} worker process(es) were running at the same "
            f"time: the workers trained one after the other. Start them all, then join them "
            f"all (a join right after each start waits for that worker to finish)")
    _check_threads(call, reads, res["threads"])
    if out["changed"] == 0:
        raise AssertionError(
            f"{call}: the model in the parent process is unchanged after training, so the "
            f"workers trained private copies. Call model.share_memory() before starting the "
            f"workers, pass `model` itself to every worker, and do not copy it in the worker "
            f"(with the fork start method nothing is shared unless you call share_memory())")
    if out["forked"]:
        raise AssertionError(
            f"{call}: the workers were started with fork (a copy of the running process, "
            f"threads excluded: section 1), not spawn. Use torch.multiprocessing.get_context("
            f"\"spawn\").Process (a bare mp.Process forks on Linux up to Python 3.13)")
    if out["accuracy"] < MIN_ACCURACY:
        raise AssertionError(
            f"{call}: the shared model reaches only {out['accuracy']:.2f} training accuracy "
            f"(before: {out['accuracy_before']:.2f}; the reference reaches about 1.0; at least "
            f"{MIN_ACCURACY} is required): do the workers run plain SGD steps with lr on "
            f"F.cross_entropy(model(x), y)?")
