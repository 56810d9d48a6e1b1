"""Notebook 01 (MPI parallel SGD): its checkers against the solution and known-wrong files,
and the whole notebook autograded as a solution, a blank release and a deadlocked submission."""
import json
from pathlib import Path

import pytest

from exercise_utils.mpi_parallel_sgd import checks
from exercise_utils.notebook_files import writefile_cells
from grading import (assert_every_check_says, assert_ran_without_errors, autograde,
                     graded_only, graded_text)

ROOT = Path(__file__).resolve().parents[1]
STEM = "01_mpi_parallel_sgd"
SOLUTION = ROOT / "solutions" / f"{STEM}.ipynb"
RELEASE = ROOT / "notebooks" / "01_mpi_parallel_sgd.ipynb"
WRONG = ROOT / "tests" / "wrong"
RIGHT = ROOT / "tests" / "right"
CHECKERS = {"shards": checks.check_shards, "broadcast": checks.check_broadcast,
            "allreduce_sgd": checks.check_allreduce_sgd,
            "model_averaging": checks.check_model_averaging,
            "convergence": checks.check_convergence}
TIMEOUT = 45   # a hung wrong file is reported after this
HANG_TIMEOUT = 20   # for the files that must hang: their launch always ends in a timeout
MUST_HANG = {"01_allreduce_sgd_rank0_only"}

# Each known-wrong file and a fragment of the message its checker must give.
EXPECTED = {
    "01_shards_drop_remainder": "covers 9 of 11 samples",
    "01_shards_last_takes_rest": "may differ by at most one",
    "01_shards_scatter_ignores_root": "rank 0 raised",
    "01_broadcast_wrong_root": "must hold rank 1's initial parameters",
    "01_broadcast_rebinds": "replaced the model's tensors instead of copying into them",
    "01_allreduce_sgd_sum_not_average": "must equal single-process SGD",
    "01_allreduce_sgd_per_parameter": "expected exactly one comm.Allreduce per step",
    "01_allreduce_sgd_rank0_only": "hung: ranks issued different collectives?",
    "01_model_averaging_root_only": "rank 1 differs by",
    "01_model_averaging_wrong_divisor": "must hold the mean of all 3 ranks' parameters",
    "01_convergence_local_loss": "global_loss differs between ranks",
    "01_convergence_mean_of_means": "expected 0.400000",
    "01_convergence_seed_bug": "converged(None, 1.0, 0.01) raised TypeError",
    "01_shards_bcast_whole_dataset": "rank 1 received 44 numbers, but its shard holds only 16",
    "01_shards_proportional_bounds": "in rank order with the larger ones first",
    "01_broadcast_parameters_only": "in bn.running_mean",
    "01_broadcast_float_tensors_only": "in bn.num_batches_tracked",
    "01_convergence_not_prev_loss": "converged(0.0, 0.0, 0.01) returned False, expected True "
                                    "(a previous loss of 0.0 is a loss",
    "01_convergence_relative_to_new_loss": "converged(1.0, 0.75, 0.25) returned False",
    "01_allreduce_sgd_no_copy_back": "must equal single-process SGD",
    "01_allreduce_sgd_pickle_allreduce": "made these calls per step: {'allreduce': 1.0}",
    "01_model_averaging_rebinds": "average_weights replaced the model's tensors",
    "01_model_averaging_generator_reused": "must hold the mean of all 3 ranks' parameters",
}


def exercise_of(stem):
    return next(name for name in CHECKERS if stem[3:].startswith(name))


def test_solution_writes_one_file_per_exercise():
    files = {Path(p).stem for p in writefile_cells(SOLUTION)}
    assert {f"01_{name}" for name in CHECKERS} <= files


def test_every_wrong_file_has_an_expected_message_and_every_checker_two():
    stems = {p.stem for p in WRONG.glob("01_*.py")}
    assert stems == set(EXPECTED), "tests/wrong/01_* and EXPECTED must list the same files"
    per_checker = {name: sum(exercise_of(s) == name for s in stems) for name in CHECKERS}
    assert min(per_checker.values()) >= 2, per_checker


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_checker_rejects_wrong_file(stem):
    timeout = HANG_TIMEOUT if stem in MUST_HANG else TIMEOUT
    with pytest.raises(AssertionError) as err:
        CHECKERS[exercise_of(stem)](WRONG / f"{stem}.py", timeout=timeout)
    assert EXPECTED[stem] in str(err.value)


@pytest.mark.parametrize("stem", sorted(p.stem for p in RIGHT.glob("01_*.py")))
def test_checker_accepts_right_file(stem):
    """Correct files written differently from the solution (tests/right/) must pass."""
    CHECKERS[exercise_of(stem)](RIGHT / f"{stem}.py")


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
    course, scores, _ = autograde(tmp_path, STEM, {"solution": SOLUTION.read_text(),
                                                   "blank": graded_only(RELEASE.read_text()),
                                                   "deadlock": deadlock.read_text()})
    assert scores == {"solution": 11.0, "blank": 0.0, "deadlock": 2.0}, scores
    assert_every_check_says(course, "solution", STEM, "all checks passed", len(CHECKERS))
    assert_ran_without_errors(course, "solution", STEM)
    assert_every_check_says(course, "blank", STEM, "not implemented yet: ", len(CHECKERS))
    graded = json.loads(graded_text(course, "deadlock", STEM))
    check = next(c for c in graded["cells"] if "".join(c["source"]).startswith(
        "# CHECK model_averaging"))
    text = json.dumps(check["outputs"])
    assert "hung: ranks issued different collectives?" in text
