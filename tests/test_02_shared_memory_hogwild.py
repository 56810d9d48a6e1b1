"""Notebook 02 (shared-memory Hogwild): the sampler's reference and the solution's sampler
against the contract (Hypothesis), the sweeps' reach, the recorders of the Hogwild probe
(reads, start/join order, the gate that tells lock-free workers from serialized ones), the
experiment script's helpers, and the whole notebook autograded as a solution and as a blank
release (its checks against wrong and right files: ``tests/test_checks.py``)."""
import math
import multiprocessing
import os
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exercise_utils.notebook_files import extract_writefiles, writefile_cells
from exercise_utils.shared_memory_hogwild import checks, experiments, probes, recorders, train
from exercise_utils.shared_memory_hogwild.reference import reference_partition
from grading import (autograde_solution_and_blank,
                     assert_launched_cells_open_with_their_box)

ROOT = Path(__file__).resolve().parents[1]
STEM = "02_shared_memory_hogwild"
SOLUTION = ROOT / "solutions" / f"{STEM}.ipynb"
RIGHT = ROOT / "tests" / "right"
CHECKERS = {"sampler": checks.check_sampler, "hogwild": checks.check_hogwild}
POINTS = 8.0            # 3 (sampler) + 5 (hogwild)


def exercise_of(stem):
    return next(name for name in CHECKERS if stem[3:].startswith(name))


def test_solution_writes_one_file_per_exercise():
    files = {Path(p).stem for p in writefile_cells(SOLUTION)}
    assert {f"02_{name}" for name in CHECKERS} <= files


def test_every_checker_has_two_right_files():
    per_checker = {name: sum(exercise_of(p.stem) == name for p in RIGHT.glob("02_*.py"))
                   for name in CHECKERS}
    assert min(per_checker.values()) >= 2, per_checker


# ------------------------------------------------------------------ sampler (Hypothesis)
@pytest.fixture(scope="module")
def solution(tmp_path_factory):
    """The solution's sampler file as a module."""
    from exercise_utils.rankworker import load_student
    folder = tmp_path_factory.mktemp("solution02")
    return load_student(extract_writefiles(SOLUTION, folder)["02_sampler"])


PARTITIONS = dict(n=st.integers(0, 300), replicas=st.integers(1, 9), shuffle=st.booleans(),
                  seed=st.integers(0, 2 ** 63 - 100), epoch=st.integers(0, 99),
                  drop_last=st.booleans())


@settings(max_examples=300, deadline=None)
@given(**PARTITIONS)
def test_reference_partition_meets_the_contract(n, replicas, shuffle, seed, epoch, drop_last):
    """The judge's partition (DistributedSampler's): one order for everybody, randperm seeded
    with seed + epoch (or 0..n-1), padded from its start or cut, replica `rank` takes
    order[rank::replicas]; a list of int."""
    shares = [reference_partition(n, replicas, r, shuffle, seed, epoch, drop_last)
              for r in range(replicas)]
    per = n // replicas if drop_last else math.ceil(n / replicas)
    assert all(type(s) is list and len(s) == per for s in shares)
    assert all(type(i) is int for s in shares for i in s)
    order = (torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
             if shuffle else list(range(n)))
    padded = (order * (per * replicas // n + 1))[:per * replicas] if n else []
    assert [padded[j * replicas + r] for j in range(per) for r in range(replicas)] == [
        s[j] for j in range(per) for s in shares]
    if not drop_last:
        assert set().union(*shares) == set(range(n))


@settings(max_examples=300, deadline=None)
@given(rank_pick=st.integers(0, 8), **PARTITIONS)
def test_solution_partition_equals_the_reference(solution, rank_pick, n, replicas, shuffle,
                                                 seed, epoch, drop_last):
    rank = rank_pick % replicas
    got = solution.partition_indices(n, replicas, rank, shuffle=shuffle, seed=seed, epoch=epoch,
                                     drop_last=drop_last)
    assert type(got) is list and all(type(i) is int for i in got)
    assert got == reference_partition(n, replicas, rank, shuffle, seed, epoch, drop_last)


def test_the_sweeps_reach_every_edge_the_contract_names():
    """Sampler: 1 to 5 replicas, n = 0, n = 1, n smaller than the replicas, exact multiples and
    remainders, both drop_last and shuffle values, seeds and epochs 0 and not, defaults and
    positional calls, in the order the check judges them. Hogwild: train_worker on float32,
    float64 and EdgeNet; hogwild with 3, 2 and 1 workers; a worker that raises and one killed."""
    cases = probes.sampler_cases()
    groups = [c[0] for c in cases]
    assert groups == sorted(groups, key=["base", "small", "empty", "signature"].index)
    keyword = [c[1:] for c in cases if c[-1] == "keywords"]
    assert {r for _, r, *_ in keyword} >= {1, 2, 3, 4, 5}
    for r in range(1, 6):
        assert any(n == 0 and rr == r for n, rr, *_ in keyword)
        assert any(0 < n < rr == r for n, rr, *_ in keyword) or r == 1
        assert any(n % rr == 0 < n and rr == r for n, rr, *_ in keyword)
        assert any(n % rr and n > rr == r for n, rr, *_ in keyword) or r == 1
    assert any(n == 1 for n, *_ in keyword)
    for n, r, shuffle, seed, epoch, drop_last, _ in keyword:
        assert (n, r, not shuffle, 0, 0, drop_last, "keywords") in keyword or shuffle
    assert {c[2] for c in keyword} == {True, False} and {c[5] for c in keyword} == {True, False}
    assert {c[3] for c in keyword if c[2]} >= {0, 7} and {c[4] for c in keyword} >= {0, 1, 2}
    assert {c[-1] for c in cases} == {"keywords", "defaults", "positional"}
    assert {kind for _, kind, _ in probes.SERIAL_CASES} == {"mlp", "edge"}
    assert {dtype for *_, dtype in probes.SERIAL_CASES} == {"float32", "float64"}
    assert (probes.WORKERS, probes.KILL_WORKERS) == (3, 1)
    assert probes.crash_workers() > os.cpu_count()     # the floor of max(1, cores // workers)


def test_sampler_probe_stops_an_endless_loop(tmp_path):
    """A sampler that loops for ever on an empty dataset is stopped after CPU_LIMIT seconds of
    CPU time (not the check's 600 s limit for endless loops), charged to its case."""
    path = tmp_path / "02_sampler.py"
    path.write_text("""import math
import torch


def partition_indices(n, r, rank, shuffle=True, seed=0, epoch=0, drop_last=False):
    while n == 0:
        pass
    order = (torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
             if shuffle else list(range(n)))
    total = (n // r if drop_last else math.ceil(n / r)) * r
    order = (order * (total // n + 1))[:total]
    return order[rank:total:r]
""")
    start = time.monotonic()
    with pytest.raises(AssertionError) as err:
        checks.check_sampler(path)
    assert err.value.case == "sampler-empty" and "an endless loop?" in str(err.value)
    assert time.monotonic() - start < 120


def test_sampler_reference_is_torch():
    assert checks.reference_partition(2, 3, 2, False, 0, 0, False) == [0]
    assert checks.reference_partition(10, 3, 0, False, 0, 0, True) == [0, 3, 6]


# ------------------------------------------------------------------ the Hogwild recorders
def _read_many(data, index, times):
    for _ in range(times):
        data[index]


def test_recording_dataset_tells_forked_readers(monkeypatch):
    """A worker forked from the probe's process inherits its marker (check_hogwild rejects
    fork); the probe's own reads are not a fork's."""
    monkeypatch.setattr(recorders, "_FORKED_FROM", os.getpid())
    data = recorders.RecordingDataset(torch.zeros(2, 3), torch.zeros(2), slots=2)
    data[0]
    assert not data.was_forked()
    child = multiprocessing.get_context("fork").Process(target=_read_many, args=(data, 1, 1))
    child.start()
    child.join()
    assert data.was_forked()


def test_recording_dataset_loses_no_read_when_workers_race():
    """Workers in different epochs can read one sample at the same moment: every read must
    keep its own slot (the checker once lost reads here under load and blamed the student)."""
    workers, times = 4, 300
    data = recorders.RecordingDataset(torch.zeros(2, 3), torch.zeros(2), slots=workers * times)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_read_many, args=(data, 1, times)) for _ in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    reads, counts = data.reads()
    assert int(counts[1]) == workers * times
    assert sorted(len(seq) for seq in reads.values()) == [times] * workers


def _quick_exit():
    pass


def _sleep(seconds):
    time.sleep(seconds)


def test_workers_together_counts_start_and_join_calls_not_processes_seen_alive():
    """On a busy machine a worker may finish before the next one starts (seen in CI: "at most
    2 worker process(es) were running at the same time" for a correct start-all-then-join-all
    file). The count comes from the order of the calls, so timing cannot change it."""
    ctx = multiprocessing.get_context("fork")
    with recorders.StartJoinCounter() as together:
        procs = [ctx.Process(target=_quick_exit) for _ in range(3)]
        for p in procs:
            p.start()
            time.sleep(0.3)               # each worker is long gone before the next starts
        for p in procs:
            p.join()
    assert together.most == 3 and together.unseen_end() == []
    with recorders.StartJoinCounter() as one_by_one:
        for _ in range(3):
            p = ctx.Process(target=_quick_exit)
            p.start()
            p.join()
    assert one_by_one.most == 1
    from multiprocessing.process import BaseProcess
    assert BaseProcess.start.__qualname__ == "BaseProcess.start"      # restored afterwards


def test_a_process_never_joined_is_seen_whatever_the_timing():
    """hogwild that raises after joining only some workers leaves the others unjoined: seen
    from the calls (a finished but unjoined worker counts as well), then cleaned up."""
    ctx = multiprocessing.get_context("fork")
    with recorders.StartJoinCounter() as counter:
        quick, slow = ctx.Process(target=_quick_exit), ctx.Process(target=_sleep, args=(30,))
        late = ctx.Process(target=_quick_exit)
        for p in (quick, slow, late):
            p.start()
        quick.join()
        time.sleep(0.5)                 # `late` has ended, but nobody joined it
        assert [i for i, _ in counter.unseen_end()] == [1, 2]
        counter.cleanup()
    assert not slow.is_alive() and counter.unseen_end() == []


def _forward(model, lock, rounds, whole=False):
    torch.set_num_threads(1)
    x = torch.zeros(2, probes.FEATURES)
    with lock if whole else _nothing():
        for _ in range(rounds):
            with _nothing() if whole or lock is None else lock:
                model(x)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("lock", ["none", "step", "whole"])
def test_the_gate_tells_lock_free_workers_from_serialized_ones(lock):
    """Each worker's first forward waits at the gate. Lock-free, all three get there; with a
    lock around each forward pass, or around a worker's whole run, the others wait for the lock
    (asleep, no CPU), the watch sees it after SETTLE seconds and opens the gate: "serial".
    Either way everyone finishes."""
    ctx = multiprocessing.get_context("fork")
    gate = recorders.Gate()
    model = probes.make_model(gate=gate)
    args = (model, None if lock == "none" else ctx.Lock(), 5, lock == "whole")
    with recorders.StartJoinCounter() as counter, \
            recorders.ConcurrencyWatch(gate, counter, 3) as watch:
        procs = [ctx.Process(target=_forward, args=args) for _ in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    assert all(p.exitcode == 0 for p in procs)
    assert (watch.verdict, watch.most) == (("together", 3) if lock == "none" else ("serial", 1))
    assert len(watch.blocked) == (0 if lock == "none" else 2)


def test_the_gate_never_calls_a_slow_start_serial():
    """A worker that is still computing (here: spinning for 5 s before its first forward) is
    not blocked, however long it takes: the gate waits for it."""
    ctx = multiprocessing.get_context("fork")
    gate = recorders.Gate()
    model = probes.make_model(gate=gate)
    with recorders.StartJoinCounter() as counter, \
            recorders.ConcurrencyWatch(gate, counter, 2) as watch:
        procs = [ctx.Process(target=_forward, args=(model, None, 1)),
                 ctx.Process(target=_spin_then_forward, args=(model, 5))]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    assert (watch.verdict, watch.most) == ("together", 2)


def _spin_then_forward(model, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    _forward(model, None, 1)


# ------------------------------------------------------------------ experiment helpers
def test_parse_run():
    assert train.parse_run("serial", cores=2) == (0, 2)
    assert train.parse_run("serialx1", cores=2) == (0, 1)
    assert train.parse_run("2x1", cores=2) == (2, 1)
    assert train.parse_run("4x", cores=2) == (4, 1)
    assert train.parse_run("2xauto", cores=8) == (2, 4)
    with pytest.raises(ValueError):
        train.parse_run("0x1")


def test_epoch_orders_shows_the_forgotten_set_epoch():
    lines = experiments.epoch_orders(12, 2, 2, set_epoch=False).splitlines()
    assert lines[1].split(":")[1] == lines[3].split(":")[1]       # epoch 0 == epoch 1
    lines = experiments.epoch_orders(12, 2, 2, set_epoch=True).splitlines()
    assert lines[1].split(":")[1] != lines[3].split(":")[1]


# ------------------------------------------------------------------ whole notebook
@pytest.mark.notebook
def test_autograde_solution_and_blank(tmp_path):
    graded, _ = autograde_solution_and_blank(tmp_path, STEM, POINTS, len(CHECKERS))


@pytest.mark.timeout(420)
def test_every_launched_cell_of_the_blank_release_opens_with_its_box(tmp_path):
    """Issue 39: a student who runs a try cell, an experiment or a benchmark before finishing
    the file meets the short box first (which function, what to do), no traceback."""
    assert_launched_cells_open_with_their_box(STEM, tmp_path / "student")
