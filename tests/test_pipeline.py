"""Tests of scripts/course.py: metadata, release, drift check, autograding, feedback.

Uses the tiny source notebook tests/fixtures/00_fixture/00_fixture.ipynb: exercise
``add`` (a ``%%writefile work/00_add.py`` cell, 2 points) and exercise ``double``
(kernel code, 1 point). nbgrader runs for real, in temporary course directories.
"""
import contextlib
import csv
import importlib.util
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from exercise_utils import sandbox

ROOT = Path(__file__).resolve().parents[1]
COURSE = ROOT / "scripts" / "course.py"
FIXTURE = ROOT / "tests" / "fixtures" / "00_fixture" / "00_fixture.ipynb"
STEM = "00_fixture"


def _load_course_module():
    spec = importlib.util.spec_from_file_location("course_script", COURSE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


course_script = _load_course_module()


# Where no sandbox can run (no bubblewrap, no root), autograde refuses without --unsafe: the
# grading tests then grade unsandboxed, and the sandbox's own tests skip, saying why.
UNSAFE = [] if sandbox.unavailable() is None else ["--unsafe"]


def course(*args):
    """Run ``course.py ARGS`` in this process (each new Python process pays ~2.5 s CPU
    just importing nbformat's jsonschema stack); nbgrader still runs as subprocesses."""
    if args and args[0] == "autograde":
        args = (*args, *UNSAFE)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = course_script.main([str(a) for a in args])
    return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())


def course_cli(*args, timeout=300):
    """Run ``python scripts/course.py ARGS`` as the Makefile does (venv bin dir first on PATH)."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return subprocess.run([sys.executable, str(COURSE), *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=timeout)


def ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def by_id(nb):
    return {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells if "nbgrader" in c.metadata}


@pytest.fixture
def solutions(tmp_path):
    folder = tmp_path / "solutions"
    folder.mkdir()
    shutil.copy(FIXTURE, folder / f"{STEM}.ipynb")
    return folder


def edit_fixture(folder, index, source):
    """Replace the source of cell ``index`` of the fixture copy in ``folder``."""
    path = folder / f"{STEM}.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[index].source = source
    nbformat.write(nb, path)


# ---------------------------------------------------------------- meta

def test_fixture_is_normalized(solutions):
    ok(course("meta", "--check", "--solutions", solutions))


def test_meta_sets_metadata_and_is_idempotent(solutions):
    path = solutions / f"{STEM}.ipynb"
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:  # make it look hand-edited: stale metadata, outputs, counts
        cell.metadata.pop("nbgrader", None)
        cell.metadata["execution"] = {"iopub.status.busy": "2024-01-01T00:00:00"}
        if cell.cell_type == "code":
            cell.execution_count = 7
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hi\n")]
    nb.cells[0].metadata["nbgrader"] = {"grade": True, "grade_id": "stale", "points": 5}
    nb.metadata.pop("kernelspec", None)
    nbformat.write(nb, path)

    check = course("meta", "--check", "--solutions", solutions)
    assert check.returncode == 1 and STEM in check.stderr
    ok(course("meta", "--solutions", solutions))
    assert path.read_bytes() == FIXTURE.read_bytes()
    ok(course("meta", "--solutions", solutions))  # second run changes nothing
    assert path.read_bytes() == FIXTURE.read_bytes()
    ok(course("meta", "--check", "--solutions", solutions))

    nb = nbformat.read(path, as_version=4)
    cells = by_id(nb)
    assert set(cells) == {"setup", "00_add", "double", "check_add", "check_double"}
    assert cells["setup"].metadata["nbgrader"] == {
        "schema_version": 3, "solution": False, "grade": False, "locked": True, "task": False,
        "grade_id": "setup"}
    assert cells["00_add"].metadata["nbgrader"] == {
        "schema_version": 3, "solution": True, "grade": False, "locked": False, "task": False,
        "grade_id": "00_add"}
    assert cells["check_add"].metadata["nbgrader"] == {
        "schema_version": 3, "solution": False, "grade": True, "locked": True, "task": False,
        "points": 2, "grade_id": "check_add"}
    assert cells["check_double"].metadata["nbgrader"]["points"] == 1
    assert "nbgrader" not in nb.cells[0].metadata
    assert all(c.outputs == [] and c.execution_count is None for c in nb.cells if c.cell_type == "code")
    assert nb.metadata["kernelspec"]["name"] == "python3"


def test_meta_gives_each_part_of_a_file_its_own_id():
    """A ``%%part work/NN_name.py K/N`` cell (one file over several cells, issue 39) is a
    solution cell with id ``NN_name_partK``; one without a solution region is refused
    (nbgrader would replace the whole cell, given code and all)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import nbmeta
    part = nbformat.v4.new_code_cell("%%part work/10_x.py 2/5\ndef f():\n    ### BEGIN "
                                     "SOLUTION\n    return 1\n    ### END SOLUTION\n")
    assert nbmeta.cell_metadata(part, 3) == {
        "schema_version": 3, "solution": True, "grade": False, "locked": False, "task": False,
        "grade_id": "10_x_part2"}
    with pytest.raises(nbmeta.MetaError, match="needs a solution region"):
        nbmeta.cell_metadata(nbformat.v4.new_code_cell("%%part work/10_x.py 1/5\nA = 1\n"), 2)


def test_meta_rejects_duplicate_ids(solutions):
    edit_fixture(solutions, 7, "# solution: 00_add\ndef double(x):\n    ### BEGIN SOLUTION\n"
                               "    return 2 * x\n    ### END SOLUTION")
    proc = course("meta", "--solutions", solutions)
    assert proc.returncode == 1
    assert "duplicate grade_id '00_add'" in proc.stderr and "cell 7" in proc.stderr


def test_meta_rejects_solution_cell_without_id(solutions):
    edit_fixture(solutions, 7, "def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n"
                               "    ### END SOLUTION")
    before = (solutions / f"{STEM}.ipynb").read_bytes()
    proc = course("meta", "--solutions", solutions)
    assert proc.returncode == 1
    assert "cell 7" in proc.stderr and "without an id" in proc.stderr
    assert (solutions / f"{STEM}.ipynb").read_bytes() == before  # nothing rewritten


# ---------------------------------------------------------------- release

@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """One release of the fixture: (solutions dir, notebooks dir)."""
    base = tmp_path_factory.mktemp("release")
    (base / "solutions").mkdir()
    shutil.copy(FIXTURE, base / "solutions" / f"{STEM}.ipynb")
    ok(course("release", "--solutions", base / "solutions", "--notebooks", base / "notebooks"))
    return base / "solutions", base / "notebooks"


def test_release_strips_solutions_and_keeps_writefile(released):
    _, notebooks = released
    text = (notebooks / f"{STEM}.ipynb").read_text()
    for secret in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "return a + b",
                   "return 2 * x", "add(-1, 1)", "double(-2)"):
        assert secret not in text, secret
    nb = nbformat.read(notebooks / f"{STEM}.ipynb", as_version=4)
    assert all(c.outputs == [] and c.execution_count is None for c in nb.cells if c.cell_type == "code")
    cells = by_id(nb)
    assert cells["00_add"].source.startswith("%%writefile work/00_add.py\n")
    assert "raise NotImplementedError()" in cells["00_add"].source
    assert "assert add_module.add(1, 2) == 3" in cells["check_add"].source  # visible test kept


def test_release_is_deterministic_and_check_detects_drift(released, tmp_path):
    solutions, notebooks = released
    shutil.copytree(notebooks, tmp_path / "nb")
    # --check re-releases in a fresh temporary course and compares bytes: passing means
    # two independent releases are byte-identical.
    proc = ok(course("release", "--check", "--solutions", solutions, "--notebooks", tmp_path / "nb"))
    assert "generate_assignment" in proc.stdout

    shutil.copytree(solutions, tmp_path / "sol")
    shutil.copy(solutions / f"{STEM}.ipynb", tmp_path / "sol" / "00_copy.ipynb")  # never released
    with open(tmp_path / "nb" / f"{STEM}.ipynb", "a") as f:
        f.write(" ")  # hand edit of a released notebook
    shutil.copy(tmp_path / "nb" / f"{STEM}.ipynb", tmp_path / "nb" / "99_orphan.ipynb")
    proc = course("release", "--check", "--solutions", tmp_path / "sol", "--notebooks", tmp_path / "nb")
    assert proc.returncode == 1
    assert f"{STEM}.ipynb: drift" in proc.stderr
    assert "00_copy.ipynb: missing" in proc.stderr
    assert "99_orphan.ipynb: no solution source" in proc.stderr
    assert not (tmp_path / "nb" / "00_copy.ipynb").exists()  # --check writes nothing


# ---------------------------------------------------------------- autograde

def solve_only(released_nb, solution_nb, grade_id):
    """The released notebook with one solution cell filled in from the solution notebook."""
    nb = nbformat.read(released_nb, as_version=4)
    by_id(nb)[grade_id].source = by_id(nbformat.read(solution_nb, as_version=4))[grade_id].source
    return nb


def test_autograde_end_to_end(released, tmp_path, monkeypatch):
    monkeypatch.setenv("DTFS_QUICK", "1")  # must reach the kernels that run the submissions
    solutions, notebooks = released
    source, release = solutions / f"{STEM}.ipynb", notebooks / f"{STEM}.ipynb"
    submissions = {
        "solved": nbformat.read(source, as_version=4),
        "blank": nbformat.read(release, as_version=4),
        "partial": solve_only(release, source, "00_add"),
    }
    for student, nb in submissions.items():
        folder = tmp_path / "course" / "submitted" / student / STEM
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{STEM}.ipynb")

    proc = ok(course("autograde", "--course", tmp_path / "course", "--solutions", solutions,
                     "--cell-timeout", 60))
    with open(tmp_path / "course" / "grades.csv", newline="") as f:
        grades = {r["student_id"]: (float(r["score"]), float(r["max_score"])) for r in csv.DictReader(f)}
    assert grades == {"solved": (3, 3), "blank": (0, 3), "partial": (2, 3)}
    assert "partial" in proc.stdout and "max_score" in proc.stdout
    autograded = tmp_path / "course" / "autograded" / "blank" / STEM / f"{STEM}.ipynb"
    errors = [o.ename for c in nbformat.read(autograded, as_version=4).cells
              for o in c.get("outputs", []) if o.output_type == "error"]
    assert "NotImplementedError" in errors  # blank cells fail, grading itself does not
    solved = tmp_path / "course" / "autograded" / "solved" / STEM / f"{STEM}.ipynb"
    assert "DTFS_QUICK = 1" in solved.read_text()

    proc = ok(course("feedback", "--course", tmp_path / "course"))
    html = tmp_path / "course" / "feedback" / "partial" / STEM / f"{STEM}.html"
    assert html.is_file() and str(html) in proc.stdout


def test_autograde_without_submissions_explains_layout(tmp_path):
    proc = course("autograde", "--course", tmp_path / "empty")
    assert proc.returncode == 1 and "submitted/<student>/<assignment>" in proc.stderr
    assert (tmp_path / "empty" / "submitted").is_dir()


# ---------------------------------------------------------------- the real repository

def test_repository_notebooks_have_no_drift():
    if not list((ROOT / "solutions").glob("*.ipynb")):
        pytest.skip("no solution notebooks yet")
    ok(course_cli("release", "--check"))
