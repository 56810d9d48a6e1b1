"""Malformed submissions, zeros with a reason, and the grading report of ``course.py autograde``.

Before any submission is dispatched (serially, ``--jobs N`` or ``--slurm`` alike),
:func:`find_malformed` checks every ``COURSE/submitted/<student>/<assignment>/`` against the
assignment's source notebook (``COURSE/source/<stem>/<stem>.ipynb``, the normalized solution
that course.py installs). A submission is *malformed* when nbgrader cannot grade it:

* no ``<assignment>.ipynb`` in its folder, or a file nbformat cannot read as a notebook
  (not UTF-8, not JSON, no ``cells``, a version it cannot convert to 4; an nbformat 3
  notebook that converts is graded);
* a cell whose ``metadata.nbgrader`` has no ``grade_id`` (a copied cell), two cells with one
  grade_id, a grade_id the source does not have;
* a graded cell whose nbgrader metadata nbgrader does not repair: ``grade``, ``task`` or
  ``schema_version`` unlike the source's, ``solution`` unlike a locked cell's, no numeric
  ``points``; a cell_type change that nbgrader cannot convert back (a markdown cell with
  ``attachments`` that was a code cell).

What nbgrader repairs is left to it and graded as before: a deleted, edited or moved CHECK
or setup cell, ``points`` or ``locked`` edited, a cell_type change it converts back. Cells
are numbered from 1 in the reasons.

A malformed submission is not graded: :func:`record_zero` gives it an empty submission in
the gradebook, so ``nbgrader export`` lists it with score 0 and the assignment's max score.
A submission nbgrader fails to grade (a crashed kernel, ``--job-timeout``) gets the same 0,
its reason the error line nbgrader printed (:func:`nbgrader_errors`, :func:`job_failure`).
:func:`report_rows`, :func:`write_report` and :func:`print_report` list every submission
with its score, status (graded / malformed / failed) and reason, in
``COURSE/grading_report.csv`` and on the terminal.

Used by scripts/course.py (autograde) and scripts/slurm_grade.py (merge).
"""
import copy
import csv
import json
import re
import shutil
import warnings
from pathlib import Path

import nbformat

REPORT = "grading_report.csv"
FIELDS = ["student", "assignment", "score", "max_score", "status", "reason"]
AGAIN = "then grade again"
STUDENT_RE = re.compile(r"Creating/updating student with ID '(.+?)'")
FAILED_RE = re.compile(r"There was an error processing assignment '(.+?)' for student '(.+?)'")
GENERIC = ("There was an error processing", "Please see the", "Traceback")


def source_cells(path):
    """The nbgrader cells of an assignment's source notebook.

    Args:
        path: COURSE/source/<stem>/<stem>.ipynb.
    Returns:
        {grade_id: (cell_type, nbgrader metadata dict)}.
    """
    nb = nbformat.read(str(path), as_version=4)
    return {c.metadata.nbgrader["grade_id"]: (c.cell_type, dict(c.metadata.nbgrader))
            for c in nb.cells if "nbgrader" in c.metadata}


def find_malformed(course, pairs):
    """Check every submission of ``pairs`` against its assignment's source notebook.

    Args:
        course: the course folder (Path).
        pairs: [(assignment, student)] of COURSE/submitted.
    Returns:
        {(assignment, student): one-line reason} for the submissions nbgrader cannot grade.
    """
    sources, malformed = {}, {}
    for assignment, student in pairs:
        if assignment not in sources:
            sources[assignment] = source_cells(course / "source" / assignment / f"{assignment}.ipynb")
        reason = check_submission(course / "submitted" / student / assignment, assignment,
                                  sources[assignment])
        if reason:
            malformed[assignment, student] = reason
    return malformed


def check_submission(folder, stem, source):
    """Why nbgrader cannot grade one submission folder, or None.

    Args:
        folder: COURSE/submitted/<student>/<stem>.
        stem: the assignment (its notebook is <stem>.ipynb).
        source: :func:`source_cells` of the assignment.
    Returns:
        A one-line reason (what is wrong, what the instructor can do), or None.
    """
    path = folder / f"{stem}.ipynb"
    if not path.is_file():
        others = sorted(p.name for p in folder.glob("*.ipynb"))
        if others:
            return (f"no {stem}.ipynb in the submission, only {', '.join(others)}: rename the "
                    f"student's notebook to {stem}.ipynb, {AGAIN}")
        return (f"no {stem}.ipynb in the submission's folder: put the student's notebook there "
                f"as {stem}.ipynb (or delete the empty folder), {AGAIN}")
    nb, reason = read_notebook(path)
    if reason:
        return reason
    problems = cell_problems(nb.cells, source)
    if len(problems) > 1:
        return f"{problems[0]} (and {len(problems) - 1} more problem(s) like it)"
    return problems[0] if problems else None


def read_notebook(path):
    """Read a submitted notebook as nbformat 4, as nbgrader does.

    Args:
        path: the notebook file.
    Returns:
        (notebook, None), or (None, reason) when nbgrader could not read it.
    """
    again = f"ask the student for the notebook again (or repair the file), {AGAIN}"
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except UnicodeDecodeError:
        return None, f"{path.name} is not a notebook (not UTF-8 text): {again}"
    except json.JSONDecodeError as err:
        return None, f"{path.name} is not a notebook (not JSON: {err.msg}, line {err.lineno}): {again}"
    if not isinstance(data, dict):
        return None, f"{path.name} is not a notebook (JSON, but not an object): {again}"
    if data.get("nbformat") == 4 and not isinstance(data.get("cells"), list):
        return None, f"{path.name} is not a notebook (no 'cells' list): {again}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nb = nbformat.reads(text, as_version=4)
    except Exception as err:      # nbformat raises several kinds
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
        return None, (f"{path.name} is not a notebook nbformat can read as version 4 "
                      f"(nbformat {data.get('nbformat')!r}: {first}): {again}")
    if not all(isinstance(c, dict) and isinstance(c.get("metadata"), dict) and "cell_type" in c
               for c in nb.cells):
        return None, f"{path.name} has a cell without a cell_type or metadata: {again}"
    return nb, None


def cell_problems(cells, source):
    """Every problem of a notebook's nbgrader cells, compared with the source's.

    Args:
        cells: the submission's cells (nbformat 4).
        source: :func:`source_cells` of the assignment.
    Returns:
        [one-line reason], in cell order.
    """
    problems, seen = [], {}
    for number, cell in enumerate(cells, 1):
        if "nbgrader" not in cell.metadata:
            continue
        line = cell.get("source", "")
        line = (line if isinstance(line, str) else "".join(line)).split("\n", 1)[0][:40]
        where = f"cell {number} ({line!r})" if line.strip() else f"cell {number}"
        problem = cell_problem(cell, number, source, seen)
        if problem:
            problems.append(f"{where} {problem}")
    return problems


def cell_problem(cell, number, source, seen):
    """What nbgrader cannot grade in one cell that has nbgrader metadata, or None.

    Args:
        cell: the cell; number: its position (from 1); source: :func:`source_cells`;
        seen: {grade_id: number of the first cell with it}, updated here.
    Returns:
        The rest of a reason (after "cell N ('first line')"), or None.
    """
    meta = cell.metadata["nbgrader"]
    if not isinstance(meta, dict):
        return f"has nbgrader metadata that is not a dictionary: delete its metadata, {AGAIN}"
    gid = meta.get("grade_id")
    if not gid:
        return (f"has nbgrader metadata without a grade_id (a copied cell?): delete the copy or "
                f"its metadata, {AGAIN}")
    if gid in seen:
        return (f"has grade_id {gid!r}, as cell {seen[gid]} has (a copied cell?): delete the "
                f"copy, {AGAIN}")
    seen[gid] = number
    if gid not in source:
        return (f"has grade_id {gid!r}, which the assignment does not have: delete the cell or "
                f"its nbgrader metadata, {AGAIN}")
    cell_type, want = source[gid]
    if cell.cell_type != cell_type and not converts(cell, cell_type):
        return (f"(grade_id {gid!r}) is a {cell.cell_type} cell that nbgrader cannot turn back "
                f"into the assignment's {cell_type} cell: make it a {cell_type} cell again "
                f"(without attachments), {AGAIN}")
    wrong = metadata_difference(meta, want)
    if wrong:
        return (f"(grade_id {gid!r}) has nbgrader metadata unlike the assignment's ({wrong}): "
                f"copy the cell's metadata from the released notebook, {AGAIN}")
    return None


def converts(cell, cell_type):
    """Whether nbgrader's OverwriteCells can turn ``cell`` into a valid ``cell_type`` cell."""
    from nbgrader.preprocessors import OverwriteCells
    try:
        OverwriteCells().update_cell_type(nbformat.from_dict(copy.deepcopy(cell)), cell_type)
    except Exception:
        return False
    return True


def metadata_difference(meta, want):
    """The nbgrader metadata a submitted cell has that nbgrader neither repairs nor grades.

    Args:
        meta: the submitted cell's ``metadata.nbgrader``; want: the source cell's.
    Returns:
        "key is X, should be Y" for the first such key, or "".
    """
    flags = ["grade", "task"] + (["solution"] if want.get("locked") else [])
    for key in flags:
        if bool(meta.get(key, False)) != bool(want.get(key, False)):
            return f"{key} is {bool(meta.get(key, False))}, should be {bool(want.get(key, False))}"
    if meta.get("schema_version", 0) != want.get("schema_version", 0):
        return f"schema_version is {meta.get('schema_version')!r}, should be {want.get('schema_version')!r}"
    if want.get("grade"):
        try:
            float(meta["points"])
        except (KeyError, TypeError, ValueError):
            return f"points is {meta.get('points')!r}, should be {want.get('points')!r}"
    return ""


def record_zero(course, assignment, student):
    """Give a submission 0 in the course's gradebook: an empty submission (no scores), so
    ``nbgrader export`` lists it with score 0 and the assignment's max score; any earlier
    grading of it (its gradebook entry, COURSE/autograded/<student>/<assignment>) is removed.

    Args:
        course: the course folder; assignment, student: the submission.
    """
    from nbgrader.api import Gradebook, MissingEntry
    from sqlalchemy.exc import SAWarning
    course = Path(course)
    stamp = course / "submitted" / student / assignment / "timestamp.txt"
    extra = {"timestamp": stamp.read_text().strip()} if stamp.is_file() else {}
    with warnings.catch_warnings(), Gradebook("sqlite:///" + str(course / "gradebook.db")) as gb:
        warnings.simplefilter("ignore", SAWarning)
        gb.update_or_create_student(student)
        try:
            gb.remove_submission(assignment, student)
        except MissingEntry:
            pass
        try:
            gb.add_submission(assignment, student, **extra)
        except Exception:           # an unreadable timestamp.txt: no timestamp then
            gb.db.rollback()
            gb.add_submission(assignment, student)
    shutil.rmtree(course / "autograded" / student / assignment, ignore_errors=True)


def nbgrader_errors(lines):
    """The submissions that ``nbgrader autograde`` reported failing, with its error line.

    Args:
        lines: nbgrader autograde's output lines (one run, one or more students).
    Returns:
        {(assignment, student): the last line of the error nbgrader printed for it (the
        exception of its traceback, e.g. "nbclient.exceptions.DeadKernelError: Kernel died")}.
    """
    last, student, block = {}, None, False
    for line in lines:
        found = STUDENT_RE.search(line)
        if found:
            student, block = found[1], False
        elif "| ERROR]" in line:
            message = line.split("| ERROR]", 1)[1].strip()
            block = message.startswith("Traceback")
            if message and not message.startswith(GENERIC):
                last[student] = message[:200]
        elif line.startswith("["):
            block = False
        elif block and line.strip():
            last[student] = line.strip()[:200]
    failed = {found.groups() for found in map(FAILED_RE.search, lines) if found}
    return {(a, s): last.get(s, "nbgrader reported an error") for a, s in failed}


def serial_failures(course, stem, students, lines, start):
    """The submissions one ``nbgrader autograde STEM`` run (scripts/course.py) did not grade.

    Args:
        course: the course folder; stem: the assignment; students: those it was to grade;
        lines: its output; start: time.time() when it started.
    Returns:
        ({(stem, student): reason}, whether one has neither a fresh autograded notebook
        nor an error of its own: nbgrader stopped before it).
    """
    errors, failed, stopped = nbgrader_errors(lines), {}, False
    for student in students:
        graded = Path(course) / "autograded" / student / stem / f"{stem}.ipynb"
        if (stem, student) in errors:
            failed[stem, student] = f"not graded: {errors[stem, student]} (see the log above)"
        elif not graded.is_file() or graded.stat().st_mtime < start - 1:
            failed[stem, student] = "not graded: nbgrader stopped before it (see the log above)"
            stopped = True
    return failed, stopped


def job_failure(folder, pair, status, job_timeout):
    """The reason one job of scripts/parallel_grade.py (or a SLURM task) failed.

    Args:
        folder: its job folder (log.txt there); pair: (assignment, student);
        status: its status ("failed", "timeout", "failed (merge: ...)", "never ran");
        job_timeout: seconds it was allowed.
    Returns:
        A one-line reason that names the log.
    """
    log = Path(folder) / "log.txt"
    if status == "timeout":
        what = f"ran past --job-timeout ({job_timeout} s); its processes were killed"
    elif status == "failed" and log.is_file():
        lines = log.read_text(errors="replace").splitlines()
        what = nbgrader_errors(lines).get(tuple(pair), "nbgrader exited with an error")
    else:
        what = status
    return f"not graded: {what} (log: {log})"


def read_grades(path):
    """{(assignment, student): (score, max_score)} from nbgrader's grades.csv."""
    with open(path, newline="") as f:
        return {(r["assignment"], r["student_id"]): (float(r["score"]), float(r["max_score"]))
                for r in csv.DictReader(f)}


def report_rows(grades_csv, pairs, malformed, failed):
    """One row per submission, sorted by student then assignment.

    Args:
        grades_csv: COURSE/grades.csv (nbgrader export).
        pairs: [(assignment, student)], every submission;
        malformed, failed: {(assignment, student): reason}.
    Returns:
        [dict with the keys of FIELDS]; status "malformed", "failed" or "graded".
    """
    grades, rows = read_grades(grades_csv), []
    for pair in sorted(pairs, key=lambda p: (p[1], p[0])):
        score, max_score = grades.get(tuple(pair), ("", ""))
        status = "malformed" if pair in malformed else "failed" if pair in failed else "graded"
        rows.append({"student": pair[1], "assignment": pair[0],
                     "score": "" if score == "" else f"{score:g}",
                     "max_score": "" if max_score == "" else f"{max_score:g}",
                     "status": status, "reason": malformed.get(pair) or failed.get(pair) or ""})
    return rows


def write_report(course, rows):
    """Write COURSE/grading_report.csv (the columns of FIELDS); return its path."""
    path = Path(course) / REPORT
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_report(course):
    """The rows of COURSE/grading_report.csv."""
    with open(Path(course) / REPORT, newline="") as f:
        return list(csv.DictReader(f))


def print_report(rows, out=print):
    """Print the grade table: student, assignment, score, max_score, status, and the reason
    beside each submission given 0 without grading; then a one-line summary."""
    width = max([len("student")] + [len(r["student"]) for r in rows])
    awidth = max([len("assignment")] + [len(r["assignment"]) for r in rows])
    out(f"{'student':<{width}}  {'assignment':<{awidth}}  {'score':>7}  {'max_score':>9}  status")
    for r in rows:
        reason = f"  {r['reason']}" if r["reason"] else ""
        out(f"{r['student']:<{width}}  {r['assignment']:<{awidth}}  {r['score']:>7}  "
            f"{r['max_score']:>9}  {r['status']}{reason}")
    counts = {s: sum(r["status"] == s for r in rows) for s in ("graded", "malformed", "failed")}
    zeros = " (0 points each, the reason beside it)" if counts["malformed"] + counts["failed"] else ""
    out(f"{counts['graded']} graded, {counts['malformed']} malformed, {counts['failed']} "
        f"failed{zeros}")
