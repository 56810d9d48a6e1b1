"""Notebook 08 (PowerSGD), work in progress: the three checkers against the solution, the
known-wrong files and the blank release, and a crash in PowerSGD costing only its own points.
The solution lives in tests/fixtures/08_powersgd_solution.py until the notebook
(solutions/08_bonus_powersgd.ipynb) holds it in its %%writefile work/08_powersgd.py cell.

The checkers keep their launches' results per file content, so the three checks of one file
cost one launch per world size (2 and 3 gloo ranks); a wrong file usually fails at 2."""
import re
from pathlib import Path

import pytest

from exercise_utils import checks_powersgd

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "tests" / "fixtures" / "08_powersgd_solution.py"
WRONG = ROOT / "tests" / "wrong"
CHECKERS = {"orthogonalize": checks_powersgd.check_orthogonalize,
            "compression_rank": checks_powersgd.check_compression_rank,
            "powersgd": checks_powersgd.check_powersgd}

# Each known-wrong file and a fragment of the message its checker must give.
EXPECTED = {
    "08_orthogonalize_not_normalized": "columns are not unit vectors",
    "08_compression_rank_ignores_rate": "min_compression_rate=0.0) returned 0, expected 4",
    "08_powersgd_no_error_feedback": "error feedback is missing",
    "08_powersgd_no_orthogonalization": "P is not orthogonalized",
    "08_powersgd_compress_1d": "you compressed 1-D tensors (biases)",
    "08_powersgd_q_not_averaged": "the Q's are summed, not averaged",
    "08_powersgd_no_warm_start": "a fresh random Q is drawn every step although warm_start=True",
    "08_powersgd_bytes_in_elements": "count numel() * element_size()",
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
    assert len(begins) == text.count("### END SOLUTION") == 3
    assert all(len(indent) >= 4 for indent in begins)
    compile(blank(text), "blank", "exec")


@pytest.mark.parametrize("name", list(CHECKERS))
def test_solution_passes(name):
    CHECKERS[name](SOLUTION)


def test_every_wrong_file_has_an_expected_message():
    stems = {p.stem for p in WRONG.glob("08_*.py")}
    assert stems == set(EXPECTED), "tests/wrong/08_* and EXPECTED must list the same files"


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_checker_rejects_wrong_file(stem):
    with pytest.raises(AssertionError) as err:
        CHECKERS[exercise_of(stem)](WRONG / f"{stem}.py")
    assert EXPECTED[stem] in str(err.value)


def test_blank_is_reported_as_not_implemented(tmp_path):
    path = tmp_path / "08_powersgd.py"
    path.write_text(blank(SOLUTION.read_text()))
    for name, check in CHECKERS.items():
        with pytest.raises(AssertionError, match="not implemented yet: ") as err:
            check(path)
        assert str(path) in str(err.value), name


def test_a_crash_in_powersgd_costs_only_its_own_points(tmp_path):
    """reduce() raises on rank 1 only: the launch fails (rank 0 waits in its all_reduce); the
    local stages run again alone and pass; check_powersgd names the rank and the error."""
    path = tmp_path / "08_powersgd.py"
    path.write_text(SOLUTION.read_text().replace(
        "        world = dist.get_world_size()\n",
        "        world = dist.get_world_size()\n"
        "        if dist.get_rank() == 1:\n"
        "            raise ValueError('boom on rank 1')\n", 1))
    with pytest.raises(AssertionError, match="rank 1 raised ValueError: boom on rank 1"):
        checks_powersgd.check_powersgd(path)
    checks_powersgd.check_orthogonalize(path)
    checks_powersgd.check_compression_rank(path)
