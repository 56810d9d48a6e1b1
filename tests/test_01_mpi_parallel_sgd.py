"""Notebook 01 (MPI parallel SGD): the probes' counters, and the whole notebook autograded as a
solution, a blank release and a deadlocked submission (its checks against wrong and right files:
``tests/test_checks.py``)."""
import json
from pathlib import Path

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from exercise_utils.mpi_parallel_sgd import checks, probes
from exercise_utils.notebook_files import extract_writefiles, writefile_cells
from grading import (assert_every_check_says, assert_failures_are_short,
                     assert_launched_cells_open_with_their_box,
                     assert_passing_checks_print_one_line,
                     assert_ran_without_errors, autograde, graded_only, graded_text)

ROOT = Path(__file__).resolve().parents[1]
STEM = "01_mpi_parallel_sgd"
SOLUTION = ROOT / "solutions" / f"{STEM}.ipynb"
RELEASE = ROOT / "notebooks" / "01_mpi_parallel_sgd.ipynb"
CHECKERS = {"shards": checks.check_shards, "broadcast": checks.check_broadcast,
            "allreduce_sgd": checks.check_allreduce_sgd,
            "model_averaging": checks.check_model_averaging,
            "convergence": checks.check_convergence}


def test_solution_writes_one_file_per_exercise():
    files = {Path(p).stem for p in writefile_cells(SOLUTION)}
    assert {f"01_{name}" for name in CHECKERS} <= files


def test_counter_sizes_every_kind_of_mpi_buffer():
    """The probe's call counter reads the size of numpy arrays, torch tensors (whose size() is a
    torch.Size: counting it crashed with a TypeError on the student's line) and [buffer, type]."""
    import numpy as np
    import torch
    from mpi4py import MPI
    from exercise_utils.mpi_parallel_sgd.probes import _numel
    assert _numel(torch.zeros(3, 4)) == 12
    assert _numel(np.zeros((2, 5))) == 10
    assert _numel([np.zeros(7, dtype=np.float32), MPI.FLOAT]) == 7


# ------------------------------------------------------------------ pure functions (Hypothesis)
@pytest.fixture(scope="module")
def solution(tmp_path_factory):
    """The solution's files as modules: {stem: module}."""
    from exercise_utils.rankworker import load_student
    folder = tmp_path_factory.mktemp("solution01")
    return {stem: load_student(path) for stem, path in extract_writefiles(SOLUTION, folder).items()
            if stem in ("01_shards", "01_convergence")}


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 10 ** 6), size=st.integers(1, 300))
def test_reference_bounds_meet_the_contract(n, size):
    """The judge's bounds: one pair per rank, tiling range(n) in order, sizes within one, the
    larger first: numpy.array_split's sizes."""
    bounds = checks.reference_bounds(n, size)
    assert len(bounds) == size and bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [b - a for a, b in bounds]
    assert sizes == sorted(sizes, reverse=True) and max(sizes) - min(sizes) <= 1
    assert sizes[:n % size] == [n // size + 1] * (n % size)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 10 ** 6), size=st.integers(1, 300))
def test_solution_bounds_equal_the_reference(solution, n, size):
    got = [list(b) for b in solution["01_shards"].shard_bounds(n, size)]
    assert got == checks.reference_bounds(n, size)


LOSSES = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=500, deadline=None)
@given(prev=st.none() | LOSSES, loss=LOSSES, rel_tol=st.floats(0, 2))
def test_solution_converged_equals_the_reference(solution, prev, loss, rel_tol):
    got = solution["01_convergence"].converged(prev, loss, rel_tol)
    assert type(got) is bool and got == checks.reference_converged(prev, loss, rel_tol)
    assert checks.reference_converged(None, loss, rel_tol) is False


def test_the_sweeps_reach_every_edge_the_contract_names():
    """Bounds: size > n, n = 0, size 1, odd sizes. converged: the first epoch, equality at the
    tolerance, a loss that rose, negative and zero losses, tolerance 0. Scatter: every kind of
    case at both world sizes' worth of ranks, roots other than 0, float64 and >1-d samples.
    SGD: which parameters have a gradient changes between steps, both ways."""
    cases = probes.bounds_cases()
    assert any(s > n > 0 for n, s in cases) and any(n == 0 for n, _ in cases)
    assert any(s == 1 for _, s in cases) and any(s % 2 and s > 1 for _, s in cases)
    conv = probes.converged_cases()
    assert any(p is None for p, _, _ in conv)
    assert any(p is not None and abs(p - lo) == t * abs(p) for p, lo, t in conv)
    assert any(p is not None and p < 0 for p, _, _ in conv) and (0.0, 0.0, 0.01) in conv
    assert any(p is not None and lo > p > 0 for p, lo, _ in conv) and any(t == 0 for *_, t in conv)
    kinds = {c[0] for cases in probes.SCATTER_CASES.values() for c in cases}
    assert kinds == {"scatter-shard", "scatter-root", "scatter-float64", "scatter-empty"}
    assert any(root != 0 for cases in probes.SCATTER_CASES.values() for _, _, root, *_ in cases)
    # SGD: which parameters have a gradient changes between steps, both ways, and a list
    # kept from the first step misses some later on (a parameter frozen in step 1 only)
    none = probes.step_no_grad("sgd-varying")
    assert "sgd-varying" in {c for c, _ in probes.SGD_CASES} and len(none) == probes.SGD_STEPS
    assert any(set(none[t + 1]) - set(none[t]) for t in range(len(none) - 1))      # loses one
    assert set(none[0]) - set(none[1]) - {"frozen"}                  # gets one it never had


def test_a_salt_changes_every_input_a_rank_could_rebuild_and_salt_0_none():
    """The inputs of the multi-rank checks (exercise_utils/mpi_parallel_sgd/inputs.py): with a
    rank's salt its dataset, model (every tensor of its state), rows of the batches and loss
    sum differ from the fixed ones, the other ranks' rows stay; salt 0 is the fixed inputs;
    loss sums stay exact in float64 in any order, a rank without samples keeps 0.0."""
    import numpy as np
    import torch
    from exercise_utils.compare import state_arrays
    from exercise_utils.mpi_parallel_sgd import inputs
    salt = 2 ** 47 + 12345
    for dtype, shape in (("float32", (3,)), ("float64", (2, 2))):
        fixed = inputs.scatter_data(9, dtype, shape)
        salted = inputs.scatter_data(9, dtype, shape, salt)
        assert torch.equal(fixed[1], salted[1]) and not torch.equal(fixed[0], salted[0])
        assert torch.equal(fixed[0], inputs.scatter_data(9, dtype, shape, 0)[0])
        for build in (inputs.bcast_model, inputs.average_model):
            a, b = state_arrays(build(1, dtype)), state_arrays(build(1, dtype, salt))
            assert a.keys() == b.keys() and all(not np.array_equal(a[k], b[k]) for k in a)
            count = int(b["bn.num_batches_tracked"])     # odd, where float32 holds even ones
            assert count % 2 == 1 and 2 ** 24 < count < 2 ** 25
        (x, y), (xs, ys) = inputs.sgd_batches(3, dtype), inputs.sgd_batches(3, dtype, {1: salt})
        rows = slice(inputs.LOCAL_BATCH, 2 * inputs.LOCAL_BATCH)
        assert not torch.equal(x[:, rows], xs[:, rows])
        xs[:, rows], ys[:, rows] = x[:, rows], y[:, rows]
        assert torch.equal(x, xs) and torch.equal(y, ys)
    for case in inputs.GLOBAL:
        for size in (2, 3):
            sums, counts = inputs.global_inputs(case, size, dict.fromkeys(range(size), salt))
            fixed = inputs.global_inputs(case, size, {0: 0})
            assert fixed == tuple(inputs.GLOBAL[case][size]) and counts == fixed[1]
            assert all((s != f) == (c > 0) and s * f >= 0
                       for s, f, c in zip(sums, fixed[0], counts))
            assert sum(sums) == sum(reversed(sums)) == float(np.sum(np.array(sums)[::-1]))


# ------------------------------------------------------------------ whole notebook
def deadlocked_submission(path):
    """The blank release with two exercises done: convergence (right) and model_averaging
    (deadlocks: only the root takes part). Grading restores and runs every CHECK cell; the
    blank ones fail at once ("not implemented yet"), which keeps this test short, and the hang
    in one check cell must cost that cell only."""
    nb = json.loads(graded_only(RELEASE.read_text()))
    solution = {"".join(c["source"]).split("\n")[0]: c["source"]
                for c in json.loads(SOLUTION.read_text())["cells"]}
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if src.startswith("%%writefile work/01_convergence.py"):
            cell["source"] = solution["%%writefile work/01_convergence.py"]
        if src.startswith("%%writefile work/01_model_averaging.py"):
            cell["source"] = ("%%writefile work/01_model_averaging.py\n"
                              "def average_weights(comm, model, root=0):\n"
                              "    if comm.Get_rank() == root:\n"
                              "        comm.gather(None, root=root)   # the others never call it\n")
    path.write_text(json.dumps(nb, indent=1))


@pytest.mark.notebook
def test_autograde_solution_blank_and_deadlock(tmp_path):
    deadlock = tmp_path / "deadlock.ipynb"
    deadlocked_submission(deadlock)
    # hang=10: MPICH's ranks spin while they wait, so the deadlock burns 2 cores until it is
    # seen (60 s by default: about 100 CPU-s of the suite's time); the grader's hang limit
    # cuts it, as an instructor with a class of such submissions would (10 s: the same
    # deadlock's flaw, rank0_only, is told with 10 s in every run of test_checks)
    course, scores, _ = autograde(tmp_path, STEM, {"solution": SOLUTION.read_text(),
                                                   "blank": graded_only(RELEASE.read_text()),
                                                   "deadlock": deadlock.read_text()},
                                  limits="hang=10")
    assert scores == {"solution": 11.0, "blank": 0.0, "deadlock": 2.0}, scores
    assert_every_check_says(course, "solution", STEM, "all checks passed", len(CHECKERS))
    assert_passing_checks_print_one_line(course, "solution", STEM)
    assert_ran_without_errors(course, "solution", STEM)
    assert_every_check_says(course, "blank", STEM, "not implemented yet: ", len(CHECKERS))
    assert_failures_are_short(course, "blank", STEM)
    graded = json.loads(graded_text(course, "deadlock", STEM))
    check = next(c for c in graded["cells"] if "".join(c["source"]).startswith(
        "# CHECK model_averaging"))
    text = json.dumps(check["outputs"])
    assert "hung: ranks issued different collectives?" in text


@pytest.mark.timeout(420)
def test_every_launched_cell_of_the_blank_release_opens_with_its_box(tmp_path):
    """Issue 39: a student who runs a try cell, an experiment or a benchmark before finishing
    the file meets the short box first (which function, what to do), no traceback."""
    assert_launched_cells_open_with_their_box(STEM, tmp_path / "student")
