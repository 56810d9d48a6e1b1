"""Notebook 07 (bonus: ZeRO-1 optimizer-state sharding): the pure functions against the judge's
references (Hypothesis), the sweeps' reach, a crash in one stage costing only its points, and
the whole notebook autograded as the solution and as the blank release, with the rows of the
benchmark it ran (``bench``, quick sizes) checked. Its checks against the wrong and right files:
``tests/test_checks.py``.

``check_sharded`` and ``check_checkpoint`` share their launches (one per world size, 2, 3 and 1
ranks) per file content; ``check_memory`` launches nothing."""
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exercise_utils.bonus_zero_sharding import (bench, checks, checks_checkpoint, checks_memory,
                                                probes)
from exercise_utils.bonus_zero_sharding.checks_sharded import greedy
from exercise_utils.notebook_files import extract_writefiles
from grading import (assert_release_regions_in_function_bodies, autograde_solution_and_blank,
                     assert_launched_cells_open_with_their_box)

ROOT = Path(__file__).resolve().parents[1]
STEM = "07_bonus_zero_sharding"
SOLUTION = ROOT / "solutions" / f"{STEM}.ipynb"
RELEASE = ROOT / "notebooks" / f"{STEM}.ipynb"
POINTS = 8
CHECKERS = {"memory": checks.check_memory, "sharded": checks.check_sharded,
            "checkpoint": checks_checkpoint.check_checkpoint}


@pytest.fixture(scope="module")
def solution_file(tmp_path_factory):
    return extract_writefiles(SOLUTION, tmp_path_factory.mktemp("solution07"))["07_zero"]


@pytest.fixture(scope="module")
def blank_file(tmp_path_factory):
    """The release's student file: every solution region replaced by a raise."""
    return extract_writefiles(RELEASE, tmp_path_factory.mktemp("blank07"))["07_zero"]


def test_release_regions_sit_inside_function_bodies(blank_file):
    assert_release_regions_in_function_bodies(blank_file, 8)


def test_the_sharded_check_reports_piece_by_piece(tmp_path):
    """partition_parameters written, ShardedOptimizer's construction as released: the check
    judges the partition with every world size, says it passed and names the rest (issue
    39); a bug in the partition is shown first (tests/wrong/07_flaws.py,
    ``unsorted_greedy_optimizer_unfinished``)."""
    import flaws
    path, check = flaws.unfinished("07", "unsorted_greedy_optimizer_unfinished", tmp_path)
    with pytest.raises(AssertionError) as err:
        check(path)
    assert str(err.value) == (
        f"not implemented yet: ShardedOptimizer.__init__ in {path} still raises "
        "NotImplementedError. Replace the `raise` line with your code, then run the cell "
        "`%%part work/07_zero.py 3/4` again. Finished and passing with 2, 3 and 1 ranks: "
        "partition_parameters."), str(err.value)


def test_a_crashing_checkpoint_costs_only_its_own_points(tmp_path, solution_file):
    """load_state_dict raising (not NotImplementedError) fails the combined launch; the
    training stage is then run on its own and passes."""
    text = Path(solution_file).read_text().replace(
        '        groups, state, local = [], {}, 0\n',
        '        raise KeyError("params")\n', 1)
    path = tmp_path / "07_zero.py"
    path.write_text(text)
    with pytest.raises(AssertionError, match="rank . raised KeyError"):
        checks_checkpoint.check_checkpoint(path)
    checks.check_sharded(path)


# ------------------------------------------------------------------ pure functions (Hypothesis)
@pytest.fixture(scope="module")
def solution(solution_file):
    """The solution's file as a module (it imports torch, not torch.distributed's group)."""
    from exercise_utils.rankworker import load_student
    return load_student(solution_file)


PSI = st.integers(0, 10 ** 13) | st.floats(0, 1e13, allow_nan=False)
K = st.integers(0, 64) | st.floats(0, 64, allow_nan=False)
DEVICES = st.integers(1, 10 ** 5)


@settings(max_examples=300, deadline=None)
@given(psi=PSI, n=DEVICES, k=K)
def test_reference_memory_meets_the_contract(psi, n, k):
    """Stage 0 replicates (2 + 2 + K) Psi; each stage keeps at most what the one before kept;
    stage 3 is stage 0 over N_d; with one device every stage is stage 0."""
    got = [checks_memory.expected_bytes(psi, n, s, k) for s in range(4)]
    assert math.isclose(got[0], (4 + k) * psi, rel_tol=1e-12)
    assert all(b <= a * (1 + 1e-12) for a, b in zip(got, got[1:]))
    assert math.isclose(got[3] * n, got[0], rel_tol=1e-12, abs_tol=1e-9)
    if n == 1:
        assert all(math.isclose(g, got[0], rel_tol=1e-12) for g in got)


@settings(max_examples=400, deadline=None)
@given(psi=PSI, n=DEVICES, k=K, stage=st.integers(0, 3))
def test_solution_memory_equals_the_reference(solution, psi, n, k, stage):
    got = solution.bytes_per_device(psi, n, stage, k=k)
    assert isinstance(got, float)
    assert math.isclose(got, checks_memory.expected_bytes(psi, n, stage, k), rel_tol=1e-12,
                        abs_tol=1e-9)


@settings(max_examples=200, deadline=None)
@given(stage=st.integers().filter(lambda s: s not in range(4))
       | st.floats().filter(lambda s: s not in (0, 1, 2, 3)))
def test_solution_memory_rejects_every_invalid_stage(solution, stage):
    with pytest.raises(ValueError):
        solution.bytes_per_device(1000, 2, stage)


NUMELS = st.lists(st.integers(0, 10 ** 6) | st.sampled_from([1, 2, 3]), max_size=30)


@st.composite
def partitions(draw):
    numels, size = draw(NUMELS), draw(st.integers(1, 12))
    loads = draw(st.none() | st.lists(st.integers(0, 10 ** 6) | st.sampled_from([0, 5]),
                                      min_size=size, max_size=size))
    return numels, size, loads


@settings(max_examples=400, deadline=None)
@given(case=partitions())
def test_reference_partition_meets_the_contract(case):
    """One owner per parameter among the ranks; loads not modified; each parameter, taken
    largest first (ties: lower index), goes to a least-loaded rank (ties: lower rank); from
    zero loads the spread is at most the largest parameter, more ranks than (non-empty) parameters
    give each its own rank in order of size, and equal non-zero sizes go round-robin."""
    numels, size, loads = case
    before = None if loads is None else list(loads)
    owners = greedy(numels, size, loads)
    assert loads == before and len(owners) == len(numels)
    assert all(0 <= o < size for o in owners)
    current = list(loads or [0] * size)
    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        least = min(current)
        assert current[owners[i]] == least and owners[i] == current.index(least)
        current[owners[i]] += numels[i]
    if loads is None and numels:
        assert max(current) - min(current) <= max(numels)
        order = sorted(range(len(numels)), key=lambda i: (-numels[i], i))
        # Both claims need sizes above zero: a 0-element parameter leaves its rank's load
        # unchanged, so the next one ties there and goes to the same (lower) rank.
        if len(numels) <= size and min(numels) > 0:
            assert [owners[i] for i in order] == list(range(len(numels)))
        if len(set(numels)) == 1 and numels[0] > 0:
            assert owners == [i % size for i in range(len(numels))]


@settings(max_examples=400, deadline=None)
@given(case=partitions())
def test_solution_partition_equals_the_reference(solution, case):
    numels, size, loads = case
    given_loads = None if loads is None else list(loads)
    got = solution.partition_parameters(list(numels), size, given_loads)
    assert type(got) is list and got == greedy(numels, size, loads)
    assert given_loads == loads, "loads: Not modified"


def test_the_sweeps_reach_every_edge_the_contract_names():
    """partition: no parameter, more ranks than parameters, one rank, distinct sizes in the
    greedy case, ties in sizes and in loads, loads given; memory: every stage at N_d = 1, K
    other than 12 (0 included), K left out, Psi = 0, results that an integer division would
    round, invalid stages below, above and between the valid ones; world sizes 1, 2 and 3."""
    cases = probes.partition_cases()
    by = {}
    for name, sizes, world, loads in cases:
        by.setdefault(name, []).append((sizes, world, loads))
    assert set(by) == {"partition-greedy", "partition-ties", "partition-loads"}
    greedy_cases = by["partition-greedy"]
    assert any(not s for s, _, _ in greedy_cases) and any(0 < len(s) < w for s, w, _ in greedy_cases)
    assert any(w == 1 for _, w, _ in greedy_cases)
    assert all(len(set(s)) == len(s) and loads is None for s, _, loads in greedy_cases)
    assert any(len(set(s)) < len(s) for s, _, _ in by["partition-ties"])
    assert any(len(set(s)) == 1 and len(s) > w > 1 for s, w, _ in by["partition-ties"])
    assert all(loads is not None for *_, loads in by["partition-loads"])
    assert any(len(set(loads)) < len(loads) for *_, loads in by["partition-loads"])
    memory = checks_memory.memory_cases()
    kinds = {name for name, *_ in memory}
    assert kinds == {"memory-stages", "memory-k", "memory-one-device"}
    assert {k for name, _, _, k in memory if name == "memory-k"} >= {0, 8}
    assert any(k is None for *_, k in memory) and any(psi == 0 for _, psi, _, _ in memory)
    assert any(n == 1 for *_, n, _ in memory) and any(n > 1000 - 1 for *_, n, _ in memory)
    assert any(isinstance(psi, int) and k and (k * psi) % n for _, psi, n, k in memory)
    invalid = checks_memory.INVALID_STAGES
    assert min(invalid) < 0 and max(invalid) > 3 and any(0 < s < 3 and s % 1 for s in invalid)
    assert sorted(checks.WORLD_SIZES) == [1, 2, 3]


# ------------------------------------------------------------------ whole notebook
@pytest.mark.notebook
def test_autograde_solution_and_blank(tmp_path):
    graded, seconds = autograde_solution_and_blank(tmp_path, STEM, POINTS, len(CHECKERS))
    assert "7.5B (ZeRO paper)" in graded and "torch zero" in graded
    # the benchmark the notebook ran (quick sizes): its rows, table and plot
    results = tmp_path / "course" / "autograded" / "solution" / STEM / "results"
    assert_benchmark_rows(json.loads((results / "07_zero_bench.json").read_text()), tmp_path)


def assert_benchmark_rows(rows, tmp_path):
    """One row per variant, world size and rank; the optimizer state measured per rank is the
    whole with 1 rank and about 1/N of it with N ranks for both sharded optimizers; every
    variant trains alike. No timing or RSS assertions (a test is no benchmark)."""
    worlds = tuple(bench.WORLD_SIZES)
    keys = [(r["variant"], r["world_size"], r["rank"]) for r in rows]
    assert sorted(keys) == sorted((v, w, r) for w in worlds for v in bench.VARIANTS
                                  for r in range(w))
    full = next(r["state_mb"] for r in rows if r["variant"] == "adam" and r["world_size"] == 1)
    assert full == pytest.approx(2 * rows[0]["param_mb"], rel=0.01), "AdamW: two moments"
    for r in rows:
        assert r["param_diff"] < 1e-6, f"{r['variant']} with {r['world_size']} ranks trained " \
                                       "differently from AdamW"
        assert r["rss_mb"] >= 0
        if r["variant"] == "adam":
            assert r["state_mb"] == full, "plain AdamW keeps the whole state on every rank"
    for world in worlds:
        for variant in ("sharded", "torch zero"):
            shares = [r["state_mb"] for r in rows
                      if r["variant"] == variant and r["world_size"] == world]
            assert sum(shares) == pytest.approx(full, rel=1e-6), (variant, world, shares)
            assert max(shares) <= 1.3 * full / world, (variant, world, shares)
    summary = {(s["variant"], s["world_size"]): s for s in bench.summary(rows)}
    assert summary[("adam", 1)]["state_vs_adam"] == 1.0
    text = bench.table(rows)
    assert "state MB (max rank)" in text and "torch zero" in text
    bench.plot(rows, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").stat().st_size > 0


@pytest.mark.timeout(420)
def test_every_launched_cell_of_the_blank_release_opens_with_its_box(tmp_path):
    """Issue 39: a student who runs a try cell, an experiment or a benchmark before finishing
    the file meets the short box first (which function, what to do), no traceback."""
    assert_launched_cells_open_with_their_box(STEM, tmp_path / "student")
