"""Malformed submissions (scripts/submissions.py): ``course.py autograde`` gives each 0 with a
one-line reason, grades every other submission as before, lists all of them in
COURSE/grading_report.csv and exits 0.

One course of the fixture notebook (tests/fixtures/00_fixture, 3 points) holds every kind as
a student beside a correct submission, graded in one serial run; a smaller class goes
through ``--jobs 2``. Each malformed kind made nbgrader 0.9.6 fail that submission before
(``KeyError: 'grade_id'``, ``Inconsistent checksums``, a notebook it could not read) or, for
a missing notebook, left the student out of grades.csv altogether.
"""
import copy
import csv
import json

import nbformat
import pytest
from nbgrader.api import Gradebook

from test_pipeline import FIXTURE, STEM, by_id, course

CRASH = "# solution: double\nimport os\nos._exit(1)  # the kernel dies\n"


def _index(nb, grade_id):
    return next(i for i, c in enumerate(nb.cells)
                if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _copied_check(nb, edit):
    cell = copy.deepcopy(nb.cells[_index(nb, "check_add")])
    cell.id = "copied"
    edit(cell.metadata.nbgrader)
    nb.cells.append(cell)


def _markdown_with_attachments(nb):
    index = _index(nb, "check_double")
    cell = nbformat.v4.new_markdown_cell(nb.cells[index].source, metadata=nb.cells[index].metadata)
    cell.id, cell.attachments = nb.cells[index].id, {}
    nb.cells[index] = cell


def _repaired(nb):
    """What nbgrader repairs: a CHECK cell turned markdown, another's points edited."""
    index = _index(nb, "check_double")
    cell = nbformat.v4.new_markdown_cell(nb.cells[index].source, metadata=nb.cells[index].metadata)
    cell.id = nb.cells[index].id
    nb.cells[index] = cell
    by_id(nb)["check_add"].metadata.nbgrader["points"] = 99


# student: (edit of the solved notebook, expected score, status, what the reason says)
NOTEBOOKS = {
    "solved": (lambda nb: None, 3, "graded", ""),
    "no_grade_id": (lambda nb: _copied_check(nb, lambda m: m.pop("grade_id")), 0, "malformed",
                    "cell 10 ('# CHECK add (2 points)') has nbgrader metadata without a grade_id"),
    "same_grade_id": (lambda nb: _copied_check(nb, lambda m: None), 0, "malformed",
                      "has grade_id 'check_add', as cell 6 has"),
    "unknown_grade_id": (lambda nb: _copied_check(nb, lambda m: m.update(grade_id="check_x")),
                         0, "malformed", "grade_id 'check_x', which the assignment does not have"),
    "cell_type": (_markdown_with_attachments, 0, "malformed",
                  "is a markdown cell that nbgrader cannot turn back into the assignment's code"),
    "grade_flag": (lambda nb: by_id(nb)["check_add"].metadata.nbgrader.update(grade=False), 0,
                   "malformed", "(grade is False, should be True)"),
    # what nbgrader repairs is graded as before: a cell type it converts back, points edited
    "repaired": (_repaired, 3, "graded", ""),
    "crashed": (lambda nb: setattr(by_id(nb)["double"], "source", CRASH), 0, "failed",
                "DeadKernelError: Kernel died"),
}
_V4 = json.loads(FIXTURE.read_text())
# student: (file text or None for no notebook, expected reason)
FILES = {
    "not_json": ('{"cells": [', "is not a notebook (not JSON"),
    "no_cells": (json.dumps({k: v for k, v in _V4.items() if k != "cells"}), "(no 'cells' list)"),
    "not_v4": (json.dumps({**_V4, "nbformat": 3}), "nbformat can read as version 4 (nbformat 3"),
    "missing": (None, f"no {STEM}.ipynb in the submission's folder"),
}


def submit(base, students):
    """Write the submissions named in ``students`` into BASE/submitted."""
    solved = nbformat.read(FIXTURE, as_version=4)
    for student in students:
        folder = base / "submitted" / student / STEM
        folder.mkdir(parents=True)
        if student in NOTEBOOKS:
            nb = copy.deepcopy(solved)
            NOTEBOOKS[student][0](nb)
            nbformat.write(nb, folder / f"{STEM}.ipynb")
        elif FILES[student][0] is not None:
            (folder / f"{STEM}.ipynb").write_text(FILES[student][0])


def expected(student):
    """(score, status, reason fragment) a student must get."""
    if student in NOTEBOOKS:
        return NOTEBOOKS[student][1:]
    return 0, "malformed", FILES[student][1]


def graded(base, *extra):
    """Autograde BASE; return (process, {student: report row}, {student: (score, max)})."""
    proc = course("autograde", "--course", base, "--solutions", FIXTURE.parent,
                  "--cell-timeout", 60, *extra)
    with open(base / "grading_report.csv", newline="") as f:
        report = {r["student"]: r for r in csv.DictReader(f)}
    with open(base / "grades.csv", newline="") as f:
        grades = {r["student_id"]: (float(r["score"]), float(r["max_score"]))
                  for r in csv.DictReader(f)}
    return proc, report, grades


def assert_graded(proc, report, grades, students):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert set(report) == set(students) == set(grades)
    for student in students:
        score, status, reason = expected(student)
        row = report[student]
        assert (row["status"], float(row["score"]), float(row["max_score"])) == (status, score, 3), row
        assert grades[student] == (score, 3), student
        assert reason in row["reason"], (student, row["reason"])
        assert bool(row["reason"]) == (status != "graded"), row
        if status != "graded":       # the table shows the reason beside the submission
            line = next(line for line in proc.stdout.splitlines() if line.startswith(student + " "))
            assert status in line and reason in line, line


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    base = tmp_path_factory.mktemp("malformed") / "course"
    students = [*NOTEBOOKS, *FILES]
    submit(base, students)
    return base, students, graded(base)


def test_each_malformed_kind_gets_zero_with_its_reason(serial):
    base, students, (proc, report, grades) = serial
    assert_graded(proc, report, grades, students)
    assert "2 graded, 9 malformed, 1 failed" in proc.stdout
    assert "then grade again" in report["no_grade_id"]["reason"]


def test_malformed_submissions_are_empty_submissions_in_the_gradebook(serial):
    base, _, _ = serial
    with Gradebook("sqlite:///" + str(base / "gradebook.db")) as gb:
        for student in ("no_grade_id", "missing", "not_json", "crashed"):
            sub = gb.find_submission(STEM, student)
            assert (sub.score, sub.max_score) == (0, 3), student
        assert gb.find_submission(STEM, "solved").score == 3
    assert not (base / "autograded" / "no_grade_id").exists()
    assert (base / "autograded" / "solved" / STEM / f"{STEM}.ipynb").is_file()


def test_jobs_give_the_same_zeros_and_reasons(tmp_path):
    base = tmp_path / "course"
    students = ["solved", "no_grade_id", "unknown_grade_id", "not_json", "missing"]
    submit(base, students)
    proc, report, grades = graded(base, "--jobs", 2)
    assert_graded(proc, report, grades, students)
    assert "1/1 graded, 0 failed" in proc.stdout      # only the well-formed one was dispatched
