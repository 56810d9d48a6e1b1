"""Autograding notebooks and reading the results, in the tests of notebooks 01 to 04.

The autograde tests run every check cell on the solution and on the blank release, so they
also prove that each checker accepts the solution ("all checks passed") and says "not
implemented yet" for the blank release; separate checker runs on those files would only
repeat that work.
"""
import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import dropper  # noqa: E402
from exercise_utils.notebook_files import PART_RE, parts_of  # noqa: E402
from test_pipeline import UNSAFE  # noqa: E402 - [] where the grading sandbox runs

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("DTFS_ARTIFACTS", ROOT / "work" / "artifacts"))


def check_outputs(course, student, stem):
    """Return ``{first line of each # CHECK cell: its outputs as JSON text}`` for one student."""
    path = course / "autograded" / student / stem / f"{stem}.ipynb"
    cells = json.loads(path.read_text())["cells"]
    return {"".join(c["source"]).split("\n")[0]: json.dumps(c.get("outputs", []))
            for c in cells if "".join(c["source"]).startswith("# CHECK ")}


def assert_every_check_says(course, student, stem, expected, count):
    """Assert that all ``count`` check cells of ``student`` printed ``expected``."""
    checks = check_outputs(course, student, stem)
    assert len(checks) == count, sorted(checks)
    for first_line, outputs in checks.items():
        assert expected in outputs, (student, first_line, outputs[-1500:])


def assert_passing_checks_print_one_line(course, student, stem):
    """Assert that each check cell of ``student`` (who passed them all) shows exactly one
    line, the check's summary: no ``True`` or other value after it (issue 39)."""
    path = course / "autograded" / student / stem / f"{stem}.ipynb"
    for cell in json.loads(path.read_text())["cells"]:
        if not "".join(cell["source"]).startswith("# CHECK "):
            continue
        outs = cell.get("outputs", [])
        text = "".join("".join(o.get("text", "")) for o in outs)
        assert [o.get("output_type") for o in outs] == ["stream"] and \
            text.count("\n") == 1 and text.startswith("✓ "), (
            f"{student}: {''.join(cell['source']).splitlines()[0]} showed {outs}")


def graded_only(text, keep_checks=None):
    """A submission of notebook ``text`` that skipped the ungraded runs (demos, experiments).

    Keeps markdown, the setup cell, the ``%%writefile`` cells and the graded cells (with
    ``keep_checks``, only the ``# CHECK <name>`` cells named there). Used for the blank
    release: its ungraded cells are the solution's (``course.py release --check`` proves it),
    which the solution's autograde already runs; running them again only costs minutes.
    """
    nb = json.loads(text)

    def keep(cell):
        src = "".join(cell["source"])
        if cell["cell_type"] != "code" or src.startswith(("%%writefile", "%%part", "# Setup")):
            return True
        if src.startswith("# CHECK ") and keep_checks is not None:
            return src.split()[2] in keep_checks
        return "nbgrader" in cell["metadata"]
    nb["cells"] = [c for c in nb["cells"] if keep(c)]
    return json.dumps(nb, indent=1)


def with_files(text, files):
    """A submission of notebook ``text`` whose cells that write a student file write ``files``
    (``{path: file text}``) instead: a ``%%writefile`` cell the whole text, the ``%%part``
    cells of a file with part marks (``# ---- part k/n ...``) part ``k`` each, and of a file
    without them (a whole file, as a cheat is written) part 1 the whole text and the other
    parts nothing. Used to grade a whole file (a cheat) as a notebook."""
    nb = json.loads(text)
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        first = src.split("\n", 1)[0]
        part = PART_RE.match(first)
        if part and part["path"] in files:
            text, parts = files[part["path"]], parts_of(files[part["path"]])
            body = parts.get(int(part["k"]), "") if parts else text if part["k"] == "1" else ""
        elif first.startswith("%%writefile") and first.split()[-1] in files:
            body = files[first.split()[-1]]
        else:
            continue
        cell["source"] = first + "\n" + body
    return json.dumps(nb, indent=1)


def assert_ran_without_errors(course, student, stem):
    """Assert that no cell of ``student``'s autograded notebook ended in an error (the
    autograder goes on after a failing cell, so a broken demo would not lower the score)."""
    path = course / "autograded" / student / stem / f"{stem}.ipynb"
    for cell in json.loads(path.read_text())["cells"]:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", (
                f"{student}: the cell starting {''.join(cell['source'])[:80]!r} raised "
                f"{out.get('ename')}: {_ends(out.get('evalue', ''))}")


def _ends(text, head=400, tail=3000):
    """The start and the end of a long error (a launch's last output holds the cause)."""
    return text if len(text) <= head + tail else f"{text[:head]}\n[...]\n{text[-tail:]}"


def autograde(tmp_path, stem, submissions, timeout=1500, whole_notebook=True, limits=None):
    """Autograde submissions of one notebook with ``scripts/course.py autograde``.

    Args:
        tmp_path: a fresh folder for the nbgrader course.
        stem: the notebook stem, e.g. "04_resnet_cifar_data_parallel".
        submissions: ``{student id: notebook text}``.
        timeout: seconds for the whole autograde run.
        whole_notebook: run every cell (``--whole-notebook``): the solution's run is also the
            proof that the notebook runs top to bottom. False: graded-only, as instructors grade.
        limits: ``--limits`` for the run (e.g. ``"hang=20"``), None: the defaults.
    Returns:
        (course folder, {student id: score}, seconds the run took).
    """
    # (the course's default cell timeout, 600 s, and so its check limit, 300 s: a slow
    # machine's cell is not a hung one; beside two other test workers notebook 03's whole
    # autograde took 490 s, 241 s the day before)
    course = tmp_path / "course"
    for student, text in submissions.items():
        target = course / "submitted" / student / stem
        target.mkdir(parents=True)
        (target / f"{stem}.ipynb").write_text(text)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "course.py"), "autograde",
                           "--course", str(course), "--cell-timeout", "600", *UNSAFE,
                           *(["--whole-notebook"] if whole_notebook else []),
                           *(["--limits", limits] if limits else [])],
                          capture_output=True, text=True, timeout=timeout)
    seconds = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(course / "grades.csv") as f:
        scores = {row["student_id"]: float(row["score"]) for row in csv.DictReader(f)}
    return course, scores, seconds


def autograde_solution_and_blank(tmp_path, stem, points, checks, timeout=1500):
    """Autograde the solution and the blank release (without its demo cells) of one notebook.

    Asserts full marks for the solution and 0 for the blank (the dropper's: a blank whose
    files plant modules named after what the judge imports, wherever its ranks can write),
    "all checks passed" from each of the ``checks`` check cells of the solution and "not
    implemented yet" from the blank's, and no error in any of the solution's cells.

    Returns:
        (the solution's autograded notebook as text, seconds the run took).
    """
    solution = (ROOT / "solutions" / f"{stem}.ipynb").read_text()
    release = (ROOT / "notebooks" / f"{stem}.ipynb").read_text()
    # The blank is the dropper (tests/dropper.py): it plants modules under every name a traced
    # grading run imports, wherever its ranks can write; unless the judge imports one of them,
    # it is the blank release (tests/test_isolation.py: with the defences off it scores)
    blank = dropper.notebook(graded_only(release))
    course, scores, seconds = autograde(tmp_path, stem, {"solution": solution, "blank": blank},
                                        timeout)
    assert scores == {"solution": float(points), "blank": 0.0}, (scores, {
        first: _ends(outputs) for first, outputs in check_outputs(course, "solution", stem).items()
        if "all checks passed" not in outputs})
    assert_every_check_says(course, "solution", stem, "all checks passed", checks)
    assert_passing_checks_print_one_line(course, "solution", stem)
    assert_ran_without_errors(course, "solution", stem)
    assert_every_check_says(course, "blank", stem, "not implemented yet: ", checks)
    assert_failures_are_short(course, "blank", stem)
    record_seconds(stem, seconds)
    return graded_text(course, "solution", stem), seconds


def record_seconds(stem, seconds):
    """Keep how long a notebook's autograde took (``$DTFS_ARTIFACTS/autograde_seconds.jsonl``,
    one line a run): a figure to report, never asserted (a test is no benchmark: the same run
    took 196 s on a quiet machine and 317 s beside other work)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with open(ARTIFACTS / "autograde_seconds.jsonl", "a") as f:
        f.write(json.dumps({"notebook": stem, "seconds": round(seconds, 1),
                            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")


def first_screen(outputs):
    """The lines a failed CHECK cell shows before "more" is opened: its box (text form, up to
    the "▸ more" line) and the error's traceback lines (``outputs``: the cell's outputs as
    JSON text)."""
    lines = []
    for out in json.loads(outputs):
        if out["output_type"] == "display_data":
            text = "".join(out["data"].get("text/plain", "")).splitlines()
            lines += text[:next((i for i, t in enumerate(text) if t.startswith("▸ more")),
                                len(text))]
        elif out["output_type"] == "error":
            lines += [line for tb in out["traceback"] for line in tb.splitlines()]
        elif out["output_type"] == "stream":
            lines += out["text"].splitlines()
    return lines


def assert_failures_are_short(course, student, stem, limit=12):
    """Every CHECK cell of ``student`` failed with a box (issue 26): a first screen of at most
    ``limit`` lines, the error as one line, no checker source or frames on it."""
    for first_line, outputs in check_outputs(course, student, stem).items():
        screen = first_screen(outputs)
        assert '"output_type": "error"' in outputs, (first_line, outputs[-1500:])
        assert len(screen) <= limit, (first_line, screen)
        assert not any("exercise_utils/" in line for line in screen), (first_line, screen)


def graded_text(course, student, stem):
    """The autograded notebook of ``student`` as text."""
    return (course / "autograded" / student / stem / f"{stem}.ipynb").read_text()


# ------------------------------------------------ checks shared by the notebooks' test files
def assert_release_regions_in_function_bodies(blank_file, at_least):
    """The blank student file compiles and each of its ``raise NotImplementedError()`` (at
    least ``at_least``) sits inside a function body, never at module level."""
    text = Path(blank_file).read_text()
    raises = re.findall(r"^( *)raise NotImplementedError\(\)$", text, flags=re.M)
    assert len(raises) >= at_least and all(len(indent) >= 4 for indent in raises), raises
    compile(text, "blank", "exec")


# ------------------------------------- what a student meets on a blank release (issue 39)
# Cells of the blank releases that run only the course's own code (demos of the library, the
# experiments that take no student file): on the blank release they run as on the solution,
# whose whole-notebook autograde runs them already, so the blank run leaves them out. Each is
# named by a piece of its source found in exactly one cell; every other launched cell must
# fail on the blank release (so a cell missing here is found: it would pass).
COURSE_ONLY = {
    "01_mpi_parallel_sgd": ['"work/01_hello.py"', "pickle_vs_buffer"],
    "02_shared_memory_hogwild": ['"work/02_start_methods.py"', "epoch_orders(",
                                 '"work/02_race.py"'],
    "03_torch_distributed_collectives": ['"work/03_hello.py"', '"work/03_hello_tcp.py"',
                                         '"work/03_p2p.py"', '"work/03_collectives.py"',
                                         '["shape"], timeout', '"DETAIL"}', '["skip"]'],
    "04_resnet_cifar_data_parallel": ["# Data:", "train_sample = runner.load_data("],
    "05_ddp_torchrun_fault_tolerance": ["lx.sweep()", "two_agents(", 'rate="1gbit"',
                                        "cluster_commands(", "join.demo("],
    "08_bonus_powersgd": ["paper.table()"],
}
TRACEBACK = re.compile(r'Traceback \(most recent call last\)|^\s*File "|^\s*-+> \d|'
                       r'\x1b\[|Error\s+Traceback')


def launched_cells(text, stem):
    """The blank release ``text`` of notebook ``stem`` cut to what the test runs: the setup
    cell, every ``%%writefile`` cell (the blank files) and every launched cell (try cells,
    experiments, benchmarks; not the CHECK cells, which the autograde tests hold to the same)
    but the :data:`COURSE_ONLY` ones. Returns ``(notebook, indices of the launched cells)``."""
    nb = json.loads(text)
    only = COURSE_ONLY.get(stem, [])
    sources = ["".join(c["source"]) for c in nb["cells"]]
    for piece in only:
        hits = [s for s in sources if piece in s]
        assert len(hits) == 1, f"{stem}: COURSE_ONLY's {piece!r} is in {len(hits)} cells"
    keep, launched = [], []
    for cell, src in zip(nb["cells"], sources):
        if cell["cell_type"] != "code" or src.startswith("# CHECK "):
            continue
        if not src.startswith(("%%writefile", "%%part", "# Setup")):
            if any(piece in src for piece in only):
                continue
            launched.append(len(keep))
        keep.append(cell)
    nb["cells"] = keep
    return nb, launched


def rendered(outputs):
    """A cell's output as the page shows it, line by line: streams, each display's plain
    text as last updated (a box up to its "▸ more" line, folded below it), errors."""
    lines = []
    for out in outputs:
        kind = out["output_type"]
        if kind in ("display_data", "execute_result"):
            text = "".join(out["data"].get("text/plain", "")).splitlines()
            lines += text[:next((i + 1 for i, t in enumerate(text) if t.startswith("▸ more")),
                                len(text))]
        elif kind == "error":
            lines += [line for tb in out["traceback"] for line in tb.splitlines()]
        else:
            lines += "".join(out["text"]).splitlines()
    return [line for line in lines if line.strip()]


def assert_launched_cells_open_with_their_box(stem, folder, timeout=300):
    """Run every launched cell of notebook ``stem``'s blank release in a student's kernel
    (nbclient, the release copied into ``folder``, as ``make lab`` does) and hold each one's
    first screen (:data:`exercise_utils.display.FIRST_SCREEN` lines) to issue 39's rule: it
    fails, its box's title ("✗ ...") is the first line or comes after at most three lines the
    cell printed before its first launch, the box up to "▸ more" fits on the screen, and no
    traceback shows on it. Returns ``{cell's first line: its first screen}``."""
    import nbformat
    from nbclient import NotebookClient

    from exercise_utils.display import FIRST_SCREEN
    nb, launched = launched_cells((ROOT / "notebooks" / f"{stem}.ipynb").read_text(), stem)
    folder.mkdir(parents=True, exist_ok=True)
    notebook = nbformat.reads(json.dumps(nb), as_version=4)
    NotebookClient(notebook, timeout=timeout, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(folder)}}).execute()
    screens, bad = {}, []
    for index in launched:
        cell = notebook.cells[index]
        first = cell.source.splitlines()[0]
        lines = rendered(cell.outputs)
        screen = screens[first] = lines[:FIRST_SCREEN]
        title = next((i for i, line in enumerate(lines) if line.startswith("✗ ")), None)
        more = next((i for i, line in enumerate(lines) if line.startswith("▸ more")), None)
        why = ("no box: the cell did not fail on the blank release (course-only? then name "
               "it in COURSE_ONLY)" if title is None else
               f"{title} lines before the box" if title > 3 else
               "the box does not fit on the first screen" if more is None or more >= FIRST_SCREEN
               else "a traceback on the first screen" if any(TRACEBACK.search(line)
                                                              for line in screen) else None)
        if why:
            bad.append(f"{stem}, cell {first!r}: {why}:\n  " + "\n  ".join(screen))
    assert not bad, "\n".join(bad)
    return screens
