"""Checker of notebook 02's sampler exercise: ``partition_indices`` against the real thing.

``check_sampler`` compares the student's ``partition_indices`` with
``torch.utils.data.DistributedSampler`` over many (dataset size, replicas, rank, shuffle,
seed, epoch, drop_last) combinations, and names the first problem it finds in this order:
lengths, samples never visited, ignored epoch or seed, dropped samples, padding, exact
order. ``probe_sampler`` runs in a fresh process of the harness
(:func:`exercise_utils.harness.run_ranks`), never in the notebook kernel.

Used in 02_shared_memory_hogwild.
"""
import math
from collections import Counter

import torch
from torch.utils.data import DistributedSampler

from .config import quick
from .harness import run_ranks

MODULE = "exercise_utils.checks_sampler"
TIMEOUT = quick(90, 45)     # seconds before the check is declared hung


def sampler_cases():
    """(dataset_len, num_replicas, shuffle, seed, epoch, drop_last) groups the checker tries."""
    cases = []
    for n in (10, 12, 13, 7, 2, 1, 61, 3, 0):
        for replicas in (3, 2, 4, 5, 1):
            for drop_last in (False, True):
                for shuffle, seeds, epochs in ((True, (0, 7), (0, 1, 2)), (False, (0,), (0, 1))):
                    cases += [(n, replicas, shuffle, seed, epoch, drop_last)
                              for seed in seeds for epoch in epochs]
    return cases


def probe_sampler(student, ctx):
    """Return, for every case, the list of every rank's indices (or what the call raised)."""
    results = []
    for n, replicas, shuffle, seed, epoch, drop_last in sampler_cases():
        per_rank = []
        for rank in range(replicas):
            try:
                got = student.partition_indices(n, replicas, rank, shuffle=shuffle, seed=seed,
                                                epoch=epoch, drop_last=drop_last)
            except NotImplementedError:
                raise
            except Exception as exc:  # reported per case, not as a crash
                per_rank.append(f"raised {type(exc).__name__}: {exc}")
                continue
            try:
                per_rank.append([int(i) for i in got])
            except (TypeError, ValueError):
                per_rank.append(f"returned {got!r}, not a list of int")
        results.append(per_rank)
    return results


def reference_partition(n, replicas, rank, shuffle, seed, epoch, drop_last):
    """What ``DistributedSampler`` yields for a dataset of ``n`` samples."""
    sampler = DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=shuffle,
                                 seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


def _order(n, shuffle, seed, epoch):
    if not shuffle:
        return list(range(n))
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def _call(n, replicas, rank, shuffle, seed, epoch, drop_last):
    rank = f"0..{replicas - 1}" if rank is None else rank
    return (f"partition_indices({n}, num_replicas={replicas}, rank={rank}, shuffle={shuffle}, "
            f"seed={seed}, epoch={epoch}, drop_last={drop_last})")


def _short(items, limit=16):
    items = list(items)
    return str(items) if len(items) <= limit else str(items[:limit])[:-1] + ", ...]"


def check_sampler(path, timeout=TIMEOUT):
    """Check ``partition_indices`` of ``path`` against ``torch.utils.data.DistributedSampler``."""
    got = run_ranks(path, f"{MODULE}:probe_sampler", 1, "none", timeout=timeout,
                    what="partition_indices")[0]
    groups = dict(zip(sampler_cases(), got))
    for check in (_check_lengths, _check_coverage, _check_epoch_and_seed, _check_dropped,
                  _check_padding, _check_exact):
        for case, per_rank in groups.items():
            check(case, per_rank, groups)


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
    order = _order(n, shuffle, seed, epoch)
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
    order = _order(n, shuffle, seed, epoch)
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
