"""Checkers of notebook 02: the sampler exercise (``partition_indices`` against the real
thing) here, the Hogwild exercise (``train_worker`` and ``hogwild``) in :mod:`.checks_hogwild`.

``check_sampler`` compares the student's ``partition_indices`` with
``torch.utils.data.DistributedSampler`` over the cases of :func:`.probes.sampler_cases`
(dataset sizes 0 to 1000, 1 to 5 replicas, every rank, both shuffles and drop_lasts, several
seeds and epochs, defaults and positional calls), run in one fresh process
(:func:`exercise_utils.harness.run_ranks`), never in the notebook kernel. It names the first
problem it finds, most basic first, each through :func:`~exercise_utils.contract.fail` with its
case of the contract (:mod:`.requirements`): a list of int, lengths, one order for everybody,
epoch and seed used, the order itself, what drop_last drops, what padding repeats, the
interleaved shares; then datasets smaller than the replicas, empty ones, the signature, and
torch's global random state left alone.

Used in 02_shared_memory_hogwild.
"""
import math
from collections import Counter

from ..contract import fail
from ..harness import HANG_AFTER, check, run_ranks
from . import probes
from .checks_hogwild import check_hogwild  # noqa: F401 - the CHECK cell imports it from here
from .probes import sampler_cases
from .reference import reference_partition, short, shuffled_order

SAMPLER_TIMEOUT = HANG_AFTER    # seconds without progress before a check is a hang (harness)
RULE = ("replica `rank` takes every num_replicas-th index of the padded (or cut) order, "
        "starting at position rank: order[rank:total:num_replicas]")


def _call(case, rank=None):
    n, replicas, shuffle, seed, epoch, drop_last, how = case
    rank = f"0..{replicas - 1}" if rank is None else rank
    if how == "defaults":
        return f"partition_indices({n}, {replicas}, {rank})"
    if how == "positional":
        return (f"partition_indices({n}, {replicas}, {rank}, {shuffle}, {seed}, {epoch}, "
                f"{drop_last})")
    return (f"partition_indices({n}, num_replicas={replicas}, rank={rank}, shuffle={shuffle}, "
            f"seed={seed}, epoch={epoch}, drop_last={drop_last})")


def _reference(case, rank):
    n, replicas, shuffle, seed, epoch, drop_last, how = case
    if how == "defaults":
        shuffle, seed, epoch, drop_last = True, 0, 0, False
    return reference_partition(n, replicas, rank, shuffle, seed, epoch, drop_last)


@check
def check_sampler(path, timeout=SAMPLER_TIMEOUT):
    """Check ``partition_indices`` of ``path`` against ``torch.utils.data.DistributedSampler``."""
    got, reseeded = run_ranks(path, probes.probe_sampler, 1, "none", timeout=timeout,
                              what="partition_indices", case="sampler-type")[0]
    groups = {}
    for (group, *case), per_rank in zip(sampler_cases(), got):
        groups.setdefault(group, {})[tuple(case)] = per_rank
    base = groups["base"]
    for rule in (_check_type, _check_lengths, _check_cover, _check_epoch, _check_seed,
                 _check_order, _check_no_shuffle, _check_dropped, _check_padding, _check_exact):
        for case, per_rank in base.items():
            rule(case, per_rank, base)
    for group in ("small", "empty", "signature"):
        for case, per_rank in groups[group].items():
            _check_type(case, per_rank, case_id=f"sampler-{group}")
            _check_exact(case, per_rank, case_id=f"sampler-{group}")
    if reseeded:
        fail("sampler-global-rng",
             "partition_indices changed torch's global random state (torch.manual_seed, or "
             "torch.randperm without generator=): every call would reseed the random numbers of "
             "the whole training (initialisation, dropout, augmentation). Shuffle with a "
             "generator of its own: g = torch.Generator(); g.manual_seed(seed + epoch); "
             "torch.randperm(dataset_len, generator=g)")


def _check_type(case, per_rank, groups=None, case_id="sampler-type"):
    for rank, got in enumerate(per_rank):
        if isinstance(got, dict) and "raised" in got:
            fail(case_id, f"{_call(case, rank)} raised {got['raised']}; it must return a list "
                          f"for every rank below num_replicas, also when the dataset is empty "
                          f"or smaller than num_replicas")
        if isinstance(got, dict):
            fail(case_id, f"{_call(case, rank)} returned a {got['returned']} ({got['value']}); "
                          f"\"Returns a list of int.\": Python ints in a list (e.g. "
                          f"tensor.tolist()), as list(DistributedSampler(...)) gives")


def _check_lengths(case, per_rank, groups):
    n, replicas, shuffle, seed, epoch, drop_last, _ = case
    want = n // replicas if drop_last else math.ceil(n / replicas)
    for rank, indices in enumerate(per_rank):
        if len(indices) != want:
            rule = ("dataset_len // num_replicas (drop_last=True cuts the tail)" if drop_last
                    else "ceil(dataset_len / num_replicas) (drop_last=False pads with repeated "
                         "samples)")
            fail("sampler-length", f"{_call(case, rank)} returned {len(indices)} indices; every "
                                   f"replica must get {rule} = {want}")


def _check_cover(case, per_rank, groups):
    n, replicas, shuffle, seed, epoch, drop_last, _ = case
    every = [i for indices in per_rank for i in indices]
    bad = sorted({i for i in every if not 0 <= i < n})
    if bad:
        fail("sampler-cover", f"{_call(case)} returned indices outside range({n}): {short(bad)}")
    twice = sorted(i for i, k in Counter(every).items() if k > 1)
    missing = sorted(set(range(n)) - set(every))
    if (drop_last and twice) or (not drop_last and missing):
        what = (f"samples {short(twice)} go to several replicas although drop_last=True "
                f"repeats none" if drop_last else
                f"the replicas together never visit samples {short(missing)}, although "
                f"drop_last=False visits every sample at least once per epoch")
        fail("sampler-cover", f"{_call(case)}: {what} (got {short(per_rank, 5)}). All the "
                              f"replicas cut their shares from one order for everybody: the "
                              f"same shuffle (seeded with seed + epoch only, never the rank)")


def _differs_from(case, other, per_rank, groups, what, fix, case_id):
    if other == case or other not in groups or groups[other] != per_rank:
        return
    if [_reference(other, r) for r in range(case[1])] != [
            _reference(case, r) for r in range(case[1])]:
        fail(case_id,
             f"partition_indices ignores the {what}: with dataset_len={case[0]}, num_replicas="
             f"{case[1]}, shuffle=True it returns the same indices for seed={other[3]}, "
             f"epoch={other[4]} and for seed={case[3]}, epoch={case[4]}: {short(per_rank, 4)}. "
             f"Fix: {fix}.")


def _check_epoch(case, per_rank, groups):
    n, replicas, shuffle, seed, epoch, drop_last, how = case
    if shuffle and n >= 10:     # (small permutations of other seeds can coincide by chance)
        _differs_from(case, (n, replicas, shuffle, seed, 0, drop_last, how), per_rank, groups,
                      "epoch", "seed the generator with seed + epoch, so that every epoch has "
                               "a new order (that is what set_epoch is for)", "sampler-epoch")


def _check_seed(case, per_rank, groups):
    n, replicas, shuffle, seed, epoch, drop_last, how = case
    if shuffle and n >= 10:
        _differs_from(case, (n, replicas, shuffle, 0, epoch, drop_last, how), per_rank, groups,
                      "seed", "seed the generator with seed + epoch", "sampler-seed")


def _check_order(case, per_rank, groups, shuffle=True, case_id="sampler-order"):
    n, replicas, shuffled, seed, epoch, drop_last, _ = case
    if replicas != 1 or shuffled != shuffle:
        return
    expected = shuffled_order(n, shuffle, seed, epoch)
    if per_rank[0] != expected:
        rule = ("torch.randperm(dataset_len, generator=g) with g a torch.Generator seeded "
                "with seed + epoch" if shuffle else "0, 1, ..., dataset_len - 1 (shuffle=False: "
                                                    "no shuffle, whatever the seed and epoch)")
        fail(case_id, f"{_call(case, 0)} returned {short(per_rank[0])}; with one replica the "
                      f"share is the whole order: {rule} = {short(expected)}")


def _check_no_shuffle(case, per_rank, groups):
    _check_order(case, per_rank, groups, shuffle=False, case_id="sampler-no-shuffle")


def _check_dropped(case, per_rank, groups):
    n, replicas, shuffle, seed, epoch, drop_last, _ = case
    if not drop_last:
        return
    order = shuffled_order(n, shuffle, seed, epoch)
    total = n // replicas * replicas
    dropped, expected = sorted(set(range(n)) - set().union(*per_rank)), sorted(order[total:])
    if dropped != expected:
        fail("sampler-drop",
             f"{_call(case)} drops samples {short(dropped)}; DistributedSampler drops the last "
             f"{n - total} of the {'shuffled ' if shuffle else ''}order, here {short(expected)}"
             f"{' (so a different few are left out in every epoch): shuffle first, then cut' if shuffle else ''}")


def _check_padding(case, per_rank, groups):
    n, replicas, shuffle, seed, epoch, drop_last, _ = case
    if drop_last:
        return
    order = shuffled_order(n, shuffle, seed, epoch)
    total = math.ceil(n / replicas) * replicas
    padded = (order * math.ceil(total / n))[:total]
    expected = sorted((Counter(padded) - Counter(range(n))).elements())
    got = sorted((Counter(i for r in per_rank for i in r) - Counter(range(n))).elements())
    if got != expected:
        fail("sampler-padding",
             f"{_call(case)} pads with samples {short(got)}; DistributedSampler pads the "
             f"{'shuffled ' if shuffle else ''}order by repeating it from its start: the "
             f"{total - n} extra samples are {short(padded[n:])}")


def _check_exact(case, per_rank, groups=None, case_id="sampler-interleave"):
    for rank, indices in enumerate(per_rank):
        expected = _reference(case, rank)
        if indices != expected:
            hint = ("the right samples in the wrong order" if sorted(indices) == sorted(expected)
                    else "other samples than DistributedSampler")
            fail(case_id, f"{_call(case, rank)} returned {short(indices)}, {hint}; expected "
                          f"{short(expected)}. {_WHY.get(case_id, RULE)}")


_WHY = {"sampler-small": "With fewer samples than replicas the order is repeated again and "
                         "again (not once) up to ceil(dataset_len / num_replicas) * num_replicas "
                         "indices; then " + RULE,
        "sampler-empty": "An empty dataset gives every replica an empty list.",
        "sampler-signature": "The signature is partition_indices(dataset_len, num_replicas, "
                             "rank, shuffle=True, seed=0, epoch=0, drop_last=False): these "
                             "defaults, and the arguments in this order."}
