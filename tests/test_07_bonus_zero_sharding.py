"""Notebook 07 (bonus: ZeRO-1 optimizer-state sharding): the three checkers against the
known-wrong files and the blank release, a crash in one stage costing only its points, and the
whole notebook autograded as the solution and as the blank release.

``check_sharded`` and ``check_checkpoint`` share their launches (one per world size, 2 and 3
ranks) per file content; ``check_memory`` launches nothing."""
import re
from pathlib import Path

import pytest

from exercise_utils import checks_zero
from exercise_utils.notebook_files import extract_writefiles
from grading import autograde_solution_and_blank

ROOT = Path(__file__).resolve().parents[1]
STEM = "07_bonus_zero_sharding"
SOLUTION = ROOT / "solutions" / f"{STEM}.ipynb"
RELEASE = ROOT / "notebooks" / f"{STEM}.ipynb"
POINTS = 8
WRONG = ROOT / "tests" / "wrong"
CHECKERS = {"memory": checks_zero.check_memory, "sharded": checks_zero.check_sharded,
            "checkpoint": checks_zero.check_checkpoint}

# Each known-wrong file and a fragment of the message its checker must give.
EXPECTED = {
    "07_memory_stage1_grads": "expected 3.14062e+10 bytes (31.41 GB) for the stage 1, P_os",
    "07_sharded_full_state": "each rank must keep state only for its own shard",
    "07_sharded_no_sync": "every rank must receive the updated parameters from their owners",
    "07_sharded_unbalanced": "unbalanced partition with 2 ranks",
    "07_sharded_group_defaults": "its hyper-parameters must be kept",
    "07_checkpoint_local_indices": "map each rank's local indices to the global ones",
}


def exercise_of(stem):
    return next(name for name in CHECKERS if stem[3:].startswith(name))


@pytest.fixture(scope="module")
def solution_file(tmp_path_factory):
    return extract_writefiles(SOLUTION, tmp_path_factory.mktemp("solution07"))["07_zero"]


@pytest.fixture(scope="module")
def blank_file(tmp_path_factory):
    """The release's student file: every solution region replaced by a raise."""
    return extract_writefiles(RELEASE, tmp_path_factory.mktemp("blank07"))["07_zero"]


def test_release_regions_sit_inside_function_bodies(blank_file):
    text = Path(blank_file).read_text()
    raises = re.findall(r"^( *)raise NotImplementedError\(\)$", text, flags=re.M)
    assert len(raises) >= 8 and all(len(indent) >= 4 for indent in raises)
    compile(text, "blank", "exec")


def test_every_wrong_file_has_an_expected_message():
    stems = {p.stem for p in WRONG.glob("07_*.py")}
    assert stems == set(EXPECTED), "tests/wrong/07_* and EXPECTED must list the same files"


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_checker_rejects_wrong_file(stem):
    with pytest.raises(AssertionError) as err:
        CHECKERS[exercise_of(stem)](WRONG / f"{stem}.py")
    assert EXPECTED[stem] in str(err.value)


def test_blank_is_reported_as_not_implemented(blank_file):
    path = blank_file
    for name, check in CHECKERS.items():
        with pytest.raises(AssertionError, match="not implemented yet: ") as err:
            check(path)
        assert str(path) in str(err.value), name


def test_a_crashing_checkpoint_costs_only_its_own_points(tmp_path, solution_file):
    """load_state_dict raising (not NotImplementedError) fails the combined launch; the
    training stage is then run on its own and passes."""
    text = Path(solution_file).read_text().replace(
        '        groups, state, local = [], {}, 0\n',
        '        raise KeyError("params")\n', 1)
    path = tmp_path / "07_zero.py"
    path.write_text(text)
    with pytest.raises(AssertionError, match="rank . raised KeyError"):
        checks_zero.check_checkpoint(path)
    checks_zero.check_sharded(path)


# ------------------------------------------------------------------ whole notebook
@pytest.mark.notebook
def test_autograde_solution_and_blank(tmp_path):
    graded, seconds = autograde_solution_and_blank(tmp_path, STEM, POINTS, len(CHECKERS), 900)
    assert "7.5B (ZeRO paper)" in graded and "torch zero" in graded
