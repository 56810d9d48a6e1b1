"""Notebook 07 (bonus: ZeRO-1 optimizer-state sharding), work in progress: the three checkers
against the solution, the known-wrong files and the blank file. The solution lives in
tests/fixtures/07_zero_solution.py until the notebook (solutions/07_bonus_zero_sharding.ipynb)
holds it in its %%writefile work/07_zero.py cell.

``check_sharded`` and ``check_checkpoint`` share their launches (one per world size, 2 and 3
ranks) per file content; ``check_memory`` launches nothing."""
import re
from pathlib import Path

import pytest

from exercise_utils import checks_zero

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "tests" / "fixtures" / "07_zero_solution.py"
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


def blank(text):
    """The release's version of a student file: every solution region raises."""
    return re.sub(r"^( *)### BEGIN SOLUTION\n.*?^ *### END SOLUTION\n",
                  r"\1raise NotImplementedError()\n", text, flags=re.S | re.M)


def test_solution_regions_sit_inside_function_bodies():
    text = SOLUTION.read_text()
    begins = re.findall(r"^( *)### BEGIN SOLUTION$", text, flags=re.M)
    assert len(begins) == text.count("### END SOLUTION") >= 8
    assert all(len(indent) >= 4 for indent in begins)
    compile(blank(text), "blank", "exec")


@pytest.mark.parametrize("name", list(CHECKERS))
def test_solution_passes(name):
    CHECKERS[name](SOLUTION)


def test_every_wrong_file_has_an_expected_message():
    stems = {p.stem for p in WRONG.glob("07_*.py")}
    assert stems == set(EXPECTED), "tests/wrong/07_* and EXPECTED must list the same files"


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_checker_rejects_wrong_file(stem):
    with pytest.raises(AssertionError) as err:
        CHECKERS[exercise_of(stem)](WRONG / f"{stem}.py")
    assert EXPECTED[stem] in str(err.value)


def test_blank_is_reported_as_not_implemented(tmp_path):
    path = tmp_path / "07_zero.py"
    path.write_text(blank(SOLUTION.read_text()))
    for name, check in CHECKERS.items():
        with pytest.raises(AssertionError, match="not implemented yet: ") as err:
            check(path)
        assert str(path) in str(err.value), name


def test_a_crashing_checkpoint_costs_only_its_own_points(tmp_path):
    """load_state_dict raising (not NotImplementedError) fails the combined launch; the
    training stage is then run on its own and passes."""
    text = SOLUTION.read_text().replace(
        '        groups, state, local = [], {}, 0\n',
        '        raise KeyError("params")\n', 1)
    path = tmp_path / "07_zero.py"
    path.write_text(text)
    with pytest.raises(AssertionError, match="rank . raised KeyError"):
        checks_zero.check_checkpoint(path)
    checks_zero.check_sharded(path)
