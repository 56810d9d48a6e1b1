"""Every requirement a notebook states is checked, or the sentence goes.

Each notebook's package has ``requirements.py`` with ``REQUIREMENTS = {exercise: [sentence,
...]}``: the sentences of the notebook (its text or a docstring of its ``%%writefile`` cells)
that a correct file must satisfy, quoted word for word. For every exercise (every ``# CHECK
<exercise>`` cell):

* each sentence appears in the solution notebook (so a rewording there shows up here);
* each sentence is quoted in the docstring of at least one wrong file
  ``tests/wrong/NN_<exercise>_*.py`` (whose test proves the check rejects it);
* each wrong file quotes at least one sentence of its exercise;
* the exercise has at least two wrong files.

Quotes are compared with white space collapsed (a docstring may wrap a sentence).
"""
import ast
import importlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PENDING = set()   # every notebook lists its requirements


def numbers():
    return sorted(p.stem[:2] for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))


def listed():
    """The notebooks whose package has a requirements.py."""
    return [n for n in numbers() if (ROOT / "exercise_utils" / notebook(n).stem[3:] /
                                     "requirements.py").exists()]


def norm(text):
    return re.sub(r"\s+", " ", text).strip()


def notebook(number):
    return next((ROOT / "solutions").glob(f"{number}_*.ipynb"))


def exercises(number):
    text = notebook(number).read_text()
    return sorted(set(re.findall(r"# CHECK (\w+) \(", text)))


def notebook_text(number):
    cells = json.loads(notebook(number).read_text())["cells"]
    return norm(" ".join("".join(c["source"]) for c in cells))


def requirements(number):
    package = notebook(number).stem[3:]
    return importlib.import_module(f"exercise_utils.{package}.requirements").REQUIREMENTS


def wrong_files(number, exercise):
    """{stem: normalised docstring} of the wrong files of one exercise."""
    others = [e for e in exercises(number) if e != exercise and e.startswith(exercise + "_")]
    found = {}
    for path in sorted((ROOT / "tests" / "wrong").glob(f"{number}_{exercise}_*.py")):
        if any(path.stem.startswith(f"{number}_{o}_") for o in others):
            continue
        found[path.stem] = norm(ast.get_docstring(ast.parse(path.read_text())) or "")
    return found


def test_every_notebook_lists_its_requirements():
    assert set(numbers()) - set(listed()) == PENDING, "update PENDING when a notebook is done"


@pytest.mark.parametrize("number", listed())
def test_requirements_cover_every_exercise_and_quote_the_notebook(number):
    reqs, text = requirements(number), notebook_text(number)
    assert sorted(reqs) == exercises(number), "one entry per CHECK cell"
    for exercise, sentences in reqs.items():
        assert sentences, exercise
        for sentence in sentences:
            assert norm(sentence) in text, f"{exercise}: not in the notebook: {sentence!r}"


@pytest.mark.parametrize("number", listed())
def test_every_requirement_has_a_wrong_file_and_every_wrong_file_a_requirement(number):
    for exercise, sentences in requirements(number).items():
        wrong = wrong_files(number, exercise)
        assert len(wrong) >= 2, f"{exercise}: fewer than two wrong files: {sorted(wrong)}"
        for sentence in sentences:
            quoting = [stem for stem, doc in wrong.items() if norm(sentence) in doc]
            assert quoting, f"{exercise}: no wrong file quotes the requirement {sentence!r}"
        for stem, doc in wrong.items():
            assert any(norm(s) in doc for s in sentences), (
                f"{stem}.py quotes none of the requirements of {exercise}: put the sentence "
                f"it violates in its docstring (Violates: \"...\")")


def test_the_rule_can_fail(tmp_path, monkeypatch):
    """A requirement no wrong file quotes, and a sentence the notebook does not state, fail."""
    reqs = {e: list(s) for e, s in requirements("01").items()}
    reqs["shards"].append("Shards are returned as numpy arrays.")
    monkeypatch.setattr(importlib.import_module("exercise_utils.mpi_parallel_sgd.requirements"),
                        "REQUIREMENTS", reqs)
    with pytest.raises(AssertionError, match="not in the notebook"):
        test_requirements_cover_every_exercise_and_quote_the_notebook("01")
    with pytest.raises(AssertionError, match="no wrong file quotes"):
        test_every_requirement_has_a_wrong_file_and_every_wrong_file_a_requirement("01")
