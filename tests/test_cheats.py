"""Cheating student files (tests/cheats/): each must be rejected as an integrity violation.

A cheat is a file that would score full marks if the check trusted what runs beside it in the
ranks: it forges the result files, patches the probe or its recorder at import, or reaches a
collective below the functions the recorder wraps while decoy calls satisfy the counts.
:mod:`exercise_utils.integrity` and :mod:`exercise_utils.pgwatch` must catch every one, with
a message saying the check's integrity was violated.
"""
import importlib
from pathlib import Path

import pytest

from exercise_utils.integrity import VIOLATION

ROOT = Path(__file__).resolve().parents[1]
CHEATS = ROOT / "tests" / "cheats"
pytestmark = pytest.mark.usefixtures("module_session")    # one zygote, one set of hosts


def checker_for(stem):
    """The ``check_<exercise>`` a cheat ``NN_<exercise>_<trick>`` targets, from the notebook's
    package (every ``checks*`` module)."""
    number, rest = stem[:2], stem[3:]
    notebook = next((ROOT / "solutions").glob(f"{number}_*.ipynb")).stem
    package = ROOT / "exercise_utils" / notebook[3:]
    found = {}
    for module in sorted(package.glob("checks*.py")):
        mod = importlib.import_module(f"exercise_utils.{package.name}.{module.stem}")
        found.update({name[6:]: fn for name, fn in vars(mod).items()
                      if name.startswith("check_") and callable(fn)})
    name = max((n for n in found if rest.startswith(n + "_")), key=len)
    return found[name]


def test_every_cheat_names_its_checker():
    stems = [p.stem for p in CHEATS.glob("*.py")]
    assert len(stems) >= 5, stems
    for stem in stems:
        assert checker_for(stem).__name__.startswith("check_"), stem


@pytest.mark.parametrize("on_hosts", ["0", "1"])
@pytest.mark.parametrize("stem", sorted(p.stem for p in CHEATS.glob("*.py")))
def test_cheat_is_rejected_as_an_integrity_violation(monkeypatch, stem, on_hosts):
    """On a student's machine (``on_hosts`` 0: the in-rank defences' message) and as at
    grading (1: each rank on a host of its own, salted, the wire observed, as root; the
    in-rank defences still say what the file did, or the wire rejects it)."""
    from exercise_utils import harness
    monkeypatch.setenv(harness.OBSERVE, on_hosts)
    with pytest.raises(AssertionError) as err:
        checker_for(stem)(CHEATS / f"{stem}.py")
    message = str(err.value)
    assert VIOLATION in message or (on_hosts == "1" and "the network counted" in message), \
        message[-2000:]


JUDGE = CHEATS / "judge"
REPLAYS = {"07": "exercise_utils.bonus_zero_sharding.replay"}   # the judges' own references


@pytest.mark.parametrize("stem", sorted(p.stem for p in JUDGE.glob("*.py")))
def test_a_cheat_that_turns_the_ranks_reference_fails_the_judges(monkeypatch, stem):
    """tests/cheats/judge/: files that make the reference computed beside them in the ranks
    agree with them. Judged by that reference (the replay switched off) each passes, so the
    trick is real and this test can fail; the judge's own replay fails the case the docstring
    names."""
    import re
    cheat = JUDGE / f"{stem}.py"
    case = re.search(r"Must fail\s+``([\w-]+)``", cheat.read_text())[1]
    check, replay = checker_for(stem), importlib.import_module(REPLAYS[stem[:2]])
    with monkeypatch.context() as patched:
        for name in ("judge", "judge_checkpoint"):
            patched.setattr(replay, name, lambda res, *args: res)
        check(cheat)
    with pytest.raises(AssertionError) as err:
        check(cheat)
    assert getattr(err.value, "case", None) == case, str(err.value)[-2000:]


SALTED = CHEATS / "salted"


@pytest.mark.parametrize("stem", sorted(p.stem for p in SALTED.glob("*.py")))
def test_a_cheat_that_rebuilds_the_other_ranks_inputs_fails_where_they_are_salted(monkeypatch,
                                                                                  stem):
    """tests/cheats/salted/: files that compute the combined result from the other ranks'
    inputs, rebuilt locally, beside decoy collectives. Without salts each passes (the trick is
    real, this test can fail); with salts (as at grading: DTFS_SALT=1) every rank's inputs
    derive from a number only it was given, and the case the docstring names fails."""
    import re
    from exercise_utils import harness
    cheat = SALTED / f"{stem}.py"
    case = re.search(r"Must fail\s+``([\w-]+)``", cheat.read_text())[1]
    check = checker_for(stem)
    monkeypatch.setenv(harness.SALT, "0")
    check(cheat)
    monkeypatch.setenv(harness.SALT, "1")
    with pytest.raises(AssertionError) as err:
        check(cheat)
    assert getattr(err.value, "case", None) == case, str(err.value)[-2000:]
