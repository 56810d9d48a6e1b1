"""Try cells (issue 39): after each part of an exercise file, a cell runs what that part wrote,
on 2 gloo ranks where it communicates, and prints what each rank computed beside what one
process computes, in numbers a student can read. Not a check: nothing is judged or graded (the
CHECK cells do that); a wrong part shows as a difference, a part not written yet as the short
box of :mod:`.display`, at once, without starting any rank.

A topic's ``tries`` module defines one *try* per part: a module-level function ``try_x(student,
ctx)`` that runs inside every rank (as a checker's probe does, :func:`.harness.run_ranks`:
ranks forked from the session's zygote, in the grading sandbox where there is one) and returns
the lines that rank prints; and a :class:`Try` naming it, the functions it calls and the
number of ranks::

    TRIES = {"api": Try(try_api, ("init", "partition_dataset"), "the API")}
    def run(name, work=WORK):
        tries.run(TRIES, name, work)

Used by the try cells of 04_resnet_cifar_data_parallel to 10_bonus_model_parallel.
"""
import ast
import time
from dataclasses import dataclass
from pathlib import Path

from . import display, harness, progress
from .contract import CheckFailure
from .notebook_files import (PART_MARK_RE, no_file, part_cell, parts_of, unimplemented,
                             unwritten)


@dataclass(frozen=True)
class Try:
    """One try: ``probe(student, ctx, **kwargs) -> [lines]`` run on ``ranks`` ranks
    (``backend`` ``"gloo"``, or ``"none"``: independent processes, which set up their group
    themselves); ``needs``: the functions and methods (``Class.method``) of the student's file
    it calls, in the file's order; ``what``: what it tries, for its messages; ``kwargs``: a
    function called in the kernel at each run, returning the probe's keyword arguments (a
    free port), or None."""
    probe: object
    needs: tuple
    what: str
    ranks: int = 2
    backend: str = "gloo"
    kwargs: object = None


def defined(path):
    """The functions and methods (``Class.method``) the file at ``path`` defines; empty if it
    cannot be read or parsed. Read as text, never run."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            names.update(f"{node.name}.{f.name}" for f in node.body
                         if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return names


def ready(path, needs):
    """Raise :class:`.display.NotReady` (shown as a short box) where the file at ``path`` is
    missing, does not parse, lacks a function of ``needs`` (its cell not run yet) or still
    raises NotImplementedError in one (named with what else is still to write)."""
    if not Path(path).is_file():
        raise display.NotReady(no_file(path) + " Then run this cell.")
    text = Path(path).read_text()
    try:
        ast.parse(text)
    except SyntaxError as err:
        unrun = parts_not_run(text)
        raise display.NotReady(
            f"{path} is not valid Python (line {err.lineno}: {err.msg})" + (
                f": its part {unrun[0]} is not written yet (a part may continue the class of "
                f"the one before it): run the cell `%%part {unrun[1]}` first, then this cell."
                if unrun else ": fix the cell that wrote it and run it again, then this "
                "cell.")) from None
    have = defined(path)
    missing = [n for n in needs if n not in have]
    if missing:
        unrun = parts_not_run(text)
        raise display.NotReady(f"{', '.join(missing)} not found in {path}: run the cells "
                               "above that write it first" + (
                                   f" (part {unrun[0]}: the cell `%%part {unrun[1]}`)"
                                   if unrun else "") + ", then this cell.")
    todo = unimplemented(path)
    waiting = [n for n in needs if n in todo]
    if waiting:
        raise display.NotWritten(waiting[0], unwritten(
            waiting, path, [n for n in todo if n not in waiting], this_cell=True))


def parts_not_run(text):
    """``(K, "PATH K/N")`` of the first part of a file built by ``%%part`` cells whose cell
    has not run yet (:func:`.notebook_files.parts_of`), or None."""
    marks = [PART_MARK_RE.match(line) for line in text.splitlines()]
    found = [m for m in marks if m]
    if not found:
        return None
    n, have = int(found[0][2]), parts_of(text)
    path = part_cell(found[0].string).rsplit(" ", 1)[0]
    k = next((k for k in range(1, n + 1) if k not in have), None)
    return None if k is None else (k, f"{path} {k}/{n}")


def run(tries, name, path):
    """Run the try ``tries[name]`` (a :class:`Try`) against the student's file ``path`` and
    print what every rank computed (``rank r: line``); a failure is a short box."""
    if name not in tries:
        raise ValueError(f"the try must be one of {', '.join(map(repr, tries))}, got {name!r}")
    one = tries[name]
    ready(path, one.needs)
    start = time.monotonic()
    progress.top()                   # the box of a failure goes above the ranks' lines
    try:
        with harness.session():
            lines = harness.run_ranks(path, one.probe, one.ranks, one.backend,
                                      one.kwargs() if one.kwargs else None,
                                      what=f"the try of {one.what}")
    except CheckFailure as err:
        err.check, err.seconds = f"the try of {one.what}", display.seconds_since(start)
        raise
    same = all(said == lines[0] for said in lines)
    for rank, said in enumerate(lines[:1] if same else lines):
        for line in said:
            print(line if one.ranks == 1 else f"{'every rank' if same else f'rank {rank}'}: "
                  f"{line}")
    print(f"({one.ranks} {'ranks' if one.ranks > 1 else 'process'}, "
          f"{display.seconds_since(start):.1f} s)")
