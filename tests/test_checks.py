"""Every check against the known-wrong files (rejected, by the case that names the clause they
break) and the correct files written differently from the solution (accepted).

The wrong files are generated from the solution, one flaw each (``tests/wrong/NN_flaws.py``,
see ``tests/flaws.py``); the right files are whole files, ``tests/right/NN_<exercise>_*.py``,
written from the release notebook alone, and judged as at grading (on hosts: salted, the
wire observed) where network namespaces can be made. The solution itself is proven by the
autograde test of each notebook (every CHECK cell passes, graded as instructors grade).
"""
from pathlib import Path

import pytest

import flaws
from exercise_utils import harness
from exercise_utils.contract import CheckFailure

ROOT = Path(__file__).resolve().parents[1]
RIGHT = ROOT / "tests" / "right"


pytestmark = pytest.mark.usefixtures("module_session")    # one zygote, one set of hosts


@pytest.mark.parametrize("number,flaw", flaws.all_flaws(),
                         ids=[flaws.flaw_id(n, f) for n, f in flaws.all_flaws()])
def test_check_rejects_flaw(tmp_path, number, flaw):
    check, _ = flaws.checker(number, flaw.exercise)
    path = flaws.write(number, flaw, tmp_path)
    kwargs = {} if flaw.timeout is None else {"timeout": flaw.timeout}
    with pytest.raises(AssertionError) as err:
        check(path, **kwargs)
    message = str(err.value)
    assert isinstance(err.value, CheckFailure), f"not a CheckFailure: {message[:2000]}"
    assert err.value.case == flaw.case, (
        f"rejected by case {err.value.case!r}, not by {flaw.case!r} (the case the flaw names): "
        f"{message[:2000]}")
    assert flaw.expect in message, message[:2000]


def right_files():
    files = []
    for number in flaws.numbers():
        names = sorted(flaws.checkers(number), key=len, reverse=True)
        for path in sorted(RIGHT.glob(f"{number}_*.py")):
            exercise = next((e for e in names if path.stem[3:].startswith(e + "_")), None)
            files.append((number, exercise, path))
    return files


@pytest.mark.parametrize("number,exercise,path", right_files(),
                         ids=[p.stem for _, _, p in right_files()])
def test_check_accepts_right_file(monkeypatch, number, exercise, path):
    """Judged as at grading: the inputs salted (``DTFS_SALT=1``: each rank's from a number
    only it and the judge know) and, where network namespaces can be made (root), every rank
    on a host of its own (``DTFS_OBSERVE=1``), the bytes on the links judged against the
    envelopes of the checks that observe them (tests/test_wire.py)."""
    assert exercise, f"{path.name}: its name starts with no exercise of notebook {number}"
    monkeypatch.setenv(harness.OBSERVE, "1")
    monkeypatch.setenv(harness.SALT, "1")
    check, _ = flaws.checker(number, exercise)
    check(path)
