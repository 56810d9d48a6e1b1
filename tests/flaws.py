"""Known-wrong student files, generated at test time from the solution, one flaw each.

``tests/wrong/NN_flaws.py`` lists notebook NN's flaws: ``FLAWS = [Flaw(...), ...]``. A flaw is a
patch of the solution's file for one exercise (the ``%%writefile`` cell of
``solutions/NN_*.ipynb``, solution regions included) that breaks one clause of the exercise's
contract (``exercise_utils/<topic>/requirements.py``) the way a student would, and names the
check case that must reject it. A patch is a sequence of edits, each either

* ``(old, new)``: ``old`` must occur exactly once in the file, and becomes ``new``; or
* ``Def(name, new)``: the whole definition of the function, method (``Class.method``) or class
  ``name`` becomes ``new`` (indented as the definition was).

A patch that no longer applies (the solution changed) fails its test with the reason, so a
flaw never silently tests a file nobody meant.

Used by ``tests/test_checks.py`` and ``tests/test_requirements.py``.
"""
import ast
import importlib.util
import json
import re
import textwrap
from pathlib import Path
from typing import NamedTuple

from exercise_utils.notebook_files import writefile_cells

ROOT = Path(__file__).resolve().parents[1]
CHECK_RE = re.compile(r"# CHECK (\w+) \(")
CALL_RE = re.compile(r"from (exercise_utils\.[\w.]+) import (check_\w+)\s*\n\s*\2\(\"([^\"]+)\"")


class Flaw(NamedTuple):
    """One known-wrong variant of an exercise's solution file.

    Attributes:
        exercise: the exercise (``# CHECK <exercise>``) whose check must reject it.
        name: short and unique within the notebook (the test id is ``NN_exercise_name``).
        clause: the id of the contract clause it breaks.
        case: the check case that must reject it (one of the clause's cases).
        patch: the edits that turn the solution into it (see the module docstring).
        why: what is wrong, in a sentence, as the student would have written it.
        expect: a fragment the check's message must contain ("" for none).
        timeout: the checker's ``timeout`` (seconds without progress before a hang), for
            flaws that must hang; None: the checker's default.
    """
    exercise: str
    name: str
    clause: str
    case: str
    patch: tuple
    why: str
    expect: str = ""
    timeout: float = None


class Def(NamedTuple):
    """An edit that replaces a whole definition (function, ``Class.method`` or class)."""
    name: str
    new: str


class PatchError(Exception):
    """A flaw's patch does not apply to the solution file."""


def notebook(number):
    return next((ROOT / "solutions").glob(f"{number}_*.ipynb"))


def numbers():
    return sorted(p.stem[:2] for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))


def load(number):
    """The flaws of notebook ``number`` (``tests/wrong/NN_flaws.py``), or [] if it has none."""
    path = ROOT / "tests" / "wrong" / f"{number}_flaws.py"
    if not path.exists():
        return []
    spec = importlib.util.spec_from_file_location(f"flaws_{number}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.FLAWS)


def checkers(number):
    """``{exercise: (module, function name, file name)}`` from the notebook's CHECK cells."""
    found = {}
    for cell in json.loads(notebook(number).read_text())["cells"]:
        src = "".join(cell["source"])
        head = CHECK_RE.match(src)
        if head:
            call = CALL_RE.search(src)
            assert call, f"CHECK {head.group(1)}: no `from ... import check_x` + call found"
            found[head.group(1)] = (call.group(1), call.group(2), Path(call.group(3)).name)
    return found


def checker(number, exercise):
    """The check function of ``exercise`` and the file name its CHECK cell passes it."""
    module, func, name = checkers(number)[exercise]
    return getattr(importlib.import_module(module), func), name


def solution_file(number, name):
    """The text of the solution's ``%%writefile`` cell that writes ``name``."""
    for target, text in writefile_cells(notebook(number)).items():
        if Path(target).name == name:
            return text
    raise KeyError(f"{notebook(number).name} writes no file {name}")


def apply(text, patch):
    """Apply a flaw's edits to ``text`` in order; raise PatchError when one does not apply."""
    for edit in patch:
        if isinstance(edit, Def):
            text = _replace_def(text, edit)
            continue
        old, new = edit
        count = text.count(old)
        if count != 1:
            raise PatchError(f"{old!r} occurs {count} times (it must occur exactly once)")
        text = text.replace(old, new)
    return text


def _replace_def(text, edit):
    tree = ast.parse(text)
    node, body = None, tree.body
    for part in edit.name.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef,
                                                       ast.AsyncFunctionDef))
                     and n.name == part), None)
        if node is None:
            raise PatchError(f"no definition {edit.name}")
        body = node.body
    lines = text.split("\n")
    start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    indent = lines[node.lineno - 1][:node.col_offset]
    new = textwrap.indent(textwrap.dedent(edit.new).strip("\n"), indent)
    return "\n".join(lines[:start] + [new] + lines[node.end_lineno:])


def write(number, flaw, folder):
    """Write the flawed file into ``folder`` (named as the CHECK cell's file); return its path."""
    _, name = checker(number, flaw.exercise)
    text = apply(solution_file(number, name), flaw.patch)
    path = Path(folder) / name
    path.write_text(text)
    return path


def unfinished(number, name, folder):
    """The file of notebook ``number``'s flaw ``name`` with its stubs alone (its ``Def``
    edits: functions still as released, the flaw itself left out), written into ``folder``:
    ``(path, the check of its exercise)``. The piece-by-piece tests (issue 39) run it."""
    flaw = next(f for f in load(number) if f.name == name)
    stubs = tuple(edit for edit in flaw.patch if isinstance(edit, Def))
    return write(number, flaw._replace(patch=stubs), folder), checker(number, flaw.exercise)[0]


def all_flaws():
    """``[(number, flaw)]`` over every notebook."""
    return [(n, f) for n in numbers() for f in load(n)]


def flaw_id(number, flaw):
    return f"{number}_{flaw.exercise}_{flaw.name}"
