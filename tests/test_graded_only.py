"""Graded-only autograding (scripts/graded_only.py): one test per trick a student could try.

Each trick is a submission of the fixture notebook (tests/fixtures/00_fixture: setup cell,
exercise ``add`` as a ``%%writefile`` file worth 2 points, exercise ``double`` in the kernel
worth 1). Graded-only autograding must give each trick the score of the honest work it
contains; the first three tricks are also graded the whole-notebook way (plain nbgrader),
where they score points they did not earn: that proves the tricks are real and the test can
fail. A static test shows every CHECK cell of the course's notebooks is self-contained.
"""
import ast
import builtins
import copy
import csv
import json
import sys

import nbformat
import pytest

from test_pipeline import FIXTURE, ROOT, STEM, by_id, course, ok

FAKE_LOAD = ("import types\n"
             "load = lambda path: types.SimpleNamespace(add=lambda a, b: a + b)  # no file needed\n")
TRANSFORMER = ('def _swallow(lines):\n'
               '    return ["try:\\n"] + ["    " + l for l in lines] + ["\\nexcept BaseException:\\n    pass\\n"]\n'
               'get_ipython().input_transformers_post.append(_swallow)\n')
MARKER = "import pathlib\npathlib.Path('student_cell_ran.txt').write_text('ran')\n"


def _cell(source):
    return nbformat.v4.new_code_cell(source)


def _index(nb, grade_id):
    return next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def submissions(release, solution):
    """{student: (notebook, score graded-only, score whole-notebook or None)}."""
    blank, solved = nbformat.read(release, as_version=4), nbformat.read(solution, as_version=4)
    subs = {}

    def variant(name, base, edit, graded, whole=None):
        nb = copy.deepcopy(base)
        edit(nb)
        subs[name] = (nb, graded, whole)

    # a cell before the CHECK replaces what the check calls: earns add's 2 points whole-notebook
    variant("monkeypatch", blank, lambda nb: nb.cells.insert(_index(nb, "check_add"), _cell(FAKE_LOAD)),
            0, 2)
    # an IPython input transformer wraps every later cell (the CHECK cells too) in try/except
    variant("transformer", blank, lambda nb: nb.cells.insert(_index(nb, "setup") + 1, _cell(TRANSFORMER)),
            0, 3)

    def code_solution(nb):          # the %%writefile line replaced by Python that runs
        by_id(nb)["00_add"].source = FAKE_LOAD
    variant("code_solution", blank, code_solution, 0, 2)

    def edited_check(nb):
        by_id(nb)["check_add"].source = "# CHECK add (2 points)\npass\n"
    variant("edited_check", blank, edited_check, 0)
    variant("deleted_check", blank, lambda nb: nb.cells.pop(_index(nb, "check_add")), 0)

    def detagged_check(nb):         # no nbgrader metadata: an ordinary (student) cell
        cell = by_id(nb)["check_add"]
        del cell.metadata["nbgrader"]
        cell.source = "# CHECK add (2 points)\npass\n"
    variant("detagged_check", blank, detagged_check, 0)

    def edited_setup(nb):
        by_id(nb)["setup"].source += "\n" + FAKE_LOAD
    variant("edited_setup", blank, edited_setup, 0)
    # honest work around the tricks: a student's own cell never runs; full marks still
    variant("extra_cell", solved, lambda nb: nb.cells.append(_cell(MARKER)), 3)
    variant("deleted_setup", solved, lambda nb: nb.cells.pop(_index(nb, "setup")), 3)

    def moved_check(nb):            # CHECK add above its exercise cell: files are written first
        nb.cells.insert(_index(nb, "00_add"), nb.cells.pop(_index(nb, "check_add")))
    variant("moved_check", solved, moved_check, 3)
    # files beside the notebook (BESIDE) never reach the grading kernel's folder
    variant("beside", solved, lambda nb: None, 3)
    return subs


# Files submitted beside the notebook: a package that would shadow the course's own in the
# grading kernel (its working directory is first on sys.path), and a plain module.
BESIDE = {"beside": {"exercise_utils/__init__.py": "raise SystemExit('shadowed')\n",
                     "helper.py": "VALUE = 1\n"}}


def grade(tmp_path, subs, *extra):
    base = tmp_path / "course"
    for student, (nb, *_rest) in subs.items():
        folder = base / "submitted" / student / STEM
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{STEM}.ipynb")
        for name, text in BESIDE.get(student, {}).items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
    proc = ok(course("autograde", "--course", base, "--solutions", FIXTURE.parent,
                     "--cell-timeout", 60, *extra))
    with open(base / "grades.csv", newline="") as f:
        return base, {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)}, proc


def test_every_trick_scores_only_its_honest_work(tmp_path, fixture_release):
    subs = submissions(fixture_release, FIXTURE)
    base, scores, _ = grade(tmp_path, subs)
    assert scores == {name: float(graded) for name, (_, graded, _) in subs.items()}
    graded = base / "autograded"
    assert not (graded / "extra_cell" / STEM / "student_cell_ran.txt").exists()
    extra = nbformat.read(graded / "extra_cell" / STEM / f"{STEM}.ipynb", as_version=4)
    assert "not run during grading" in json.dumps(extra.cells[-1].outputs)
    written = (graded / "code_solution" / STEM / "work" / "00_add.py").read_text()
    assert written == FAKE_LOAD          # the cell's Python was written to the file, not run
    restored = nbformat.read(graded / "deleted_check" / STEM / f"{STEM}.ipynb", as_version=4)
    assert "check_add" in by_id(restored)
    setup = nbformat.read(graded / "deleted_setup" / STEM / f"{STEM}.ipynb", as_version=4)
    assert "restored from the course's source" in by_id(setup)["setup"].source
    beside = graded / "beside" / STEM
    assert (beside / f"{STEM}.ipynb").exists()
    assert not [p for p in beside.rglob("*") if p.is_file() and p.suffix == ".py"
                and "work" not in p.parts], sorted(beside.rglob("*"))


def test_the_tricks_work_when_the_whole_notebook_runs(tmp_path, fixture_release):
    """Plain nbgrader (``--whole-notebook``) gives the first three tricks unearned points."""
    subs = {name: sub for name, sub in submissions(fixture_release, FIXTURE).items()
            if sub[2] is not None}
    _, scores, _ = grade(tmp_path, subs, "--whole-notebook")
    assert scores == {name: float(whole) for name, (_, _, whole) in subs.items()}


def _names(tree):
    """(names a cell assigns or imports, names it reads)."""
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else read).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return bound, read


@pytest.mark.parametrize("path", sorted((ROOT / "solutions").glob("*.ipynb")), ids=lambda p: p.stem)
def test_check_cells_need_only_the_setup_cell(path):
    """Grading runs the setup cell and the CHECK cells only: a CHECK cell may read no name
    that only an ungraded cell defines."""
    nb = nbformat.read(path, as_version=4)
    setup = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("# Setup")]
    assert len(setup) == 1, "one '# Setup' cell per notebook"
    known = _names(ast.parse(setup[0].source))[0] | set(dir(builtins)) | {"get_ipython", "display"}
    checks = [c for c in nb.cells if c.source.startswith("# CHECK ")]
    assert checks
    for cell in checks:
        bound, read = _names(ast.parse(cell.source))
        assert read <= known | bound, (cell.source.split("\n")[0], sorted(read - known - bound))


# ------------------------------------------------ one file over several cells (%%part, issue 39)
def test_parts_build_one_file_whatever_order_they_run_in(tmp_path, monkeypatch, capsys):
    """``%%part PATH K/N`` (:func:`exercise_utils.notebook_files.part_magic`): each cell owns
    its part, re-running one replaces only it, the parts stay in order, the cell says which
    parts have not run; ``writefile_cells`` builds the same file from a notebook."""
    from exercise_utils import notebook_files as nf
    monkeypatch.chdir(tmp_path)
    nf.part_magic("work/x.py 2/3", "B = 2\n")
    assert capsys.readouterr().out == "Wrote part 2/3 of work/x.py (parts not run yet: 1, 3)\n"
    nf.part_magic("work/x.py 1/3", "A = 1")
    nf.part_magic("work/x.py 3/3", "C = 3\n")
    nf.part_magic("work/x.py 2/3", "B = 20\n")                     # run again, edited
    assert capsys.readouterr().out.splitlines()[-1] == "Wrote part 2/3 of work/x.py"
    text = (tmp_path / "work" / "x.py").read_text()
    assert nf.parts_of(text) == {1: "A = 1\n", 2: "B = 20\n", 3: "C = 3\n"}
    namespace = {}
    exec(text, namespace)
    assert (namespace["A"], namespace["B"], namespace["C"]) == (1, 20, 3)
    with pytest.raises(ValueError, match="between 1 and 3"):
        nf.part_magic("work/x.py 4/3", "D = 4\n")
    with pytest.raises(ValueError, match="usage"):
        nf.part_magic("work/x.py", "D = 4\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"%%part work/x.py {k}/3\n{b}")
                                         for k, b in ((3, "C = 3"), (1, "A = 1"), (2, "B = 20"))])
    nbformat.write(nb, tmp_path / "n.ipynb")
    assert nf.writefile_cells(tmp_path / "n.ipynb") == {"work/x.py": text}


def test_the_grader_builds_a_parted_file_from_the_sources_parts_alone(tmp_path):
    """At grading the parts are written by the grader (never run): the part a cell fills is
    the one its *source* cell names (not the submission's magic line), the file holds only
    this submission's parts (not what its folder held), and a cell whose magic line was
    replaced by Python has that Python written as its part."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import graded_only
    from exercise_utils.notebook_files import parts_of
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "x.py").write_text(
        "# ---- part 3/3 of this file: from the notebook's cell `%%part work/x.py 3/3`\n"
        "PLANTED = True\n")
    built = {}
    for source_line, submitted in (("%%part work/x.py 1/3", "%%part work/x.py 3/3\nA = 1\n"),
                                   ("%%part work/x.py 2/3", "B = 2  # magic line gone\n")):
        cell = nbformat.v4.new_code_cell(submitted)
        graded_only.GradedOnlyExecute._write(None, cell, tmp_path, "work/x.py",
                                             graded_only.PART_RE.match(source_line), built)
        assert "the grader wrote this cell's body" in cell.outputs[0].text
    assert parts_of((tmp_path / "work" / "x.py").read_text()) == {
        1: "A = 1\n", 2: "B = 2  # magic line gone\n"}


def test_a_whole_file_goes_into_the_cells_that_write_it(tmp_path):
    """``grading.with_files`` (a cheat graded as a notebook): a file with part marks part by
    part into its ``%%part`` cells, one without them whole into part 1 (the others empty), a
    ``%%writefile`` cell's file whole; other cells as they were."""
    from exercise_utils import notebook_files as nf
    from grading import with_files
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("%%writefile work/a.py\nraise NotImplementedError\n"),
        nbformat.v4.new_code_cell("%%part work/x.py 1/2\nA = None\n"),
        nbformat.v4.new_code_cell("print('between')"),
        nbformat.v4.new_code_cell("%%part work/x.py 2/2\nB = None\n")])
    marked = nf.with_part(nf.with_part("", "work/x.py", 2, 2, "B = 2\n"), "work/x.py", 1, 2,
                          "A = 1\n")
    for files, parts in (({"work/x.py": marked, "work/a.py": "Z = 0\n"}, {1: "A = 1\n",
                                                                          2: "B = 2\n"}),
                         ({"work/x.py": "W = 1\nV = 2\n"}, {1: "W = 1\nV = 2\n", 2: "\n"})):
        path = tmp_path / "n.ipynb"
        path.write_text(with_files(nbformat.writes(nb), files))
        built = nf.writefile_cells(path)
        assert nf.parts_of(built["work/x.py"]) == parts, built
        assert built["work/a.py"] == files.get("work/a.py", "raise NotImplementedError\n")
        assert nbformat.read(path, as_version=4).cells[2].source == "print('between')"
