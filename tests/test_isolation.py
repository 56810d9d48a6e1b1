"""Grading isolation (issue 35): nothing a rank writes reaches the judge.

The dropper (``tests/dropper.py``: a blank notebook whose exercise files plant modules named
after everything a traced grading run imports or looks for, in every place a rank can write)
takes a grading kernel over when both defences are off: the kernel imports from the
submission's folder (``DTFS_TEST_WEAKEN=safe-path``) and the ranks can write it (here: no
sandbox). Each defence alone stops it: the grading kernels' safe import path
(``PYTHONSAFEPATH``, ``scripts/course.py``), and ranks that never see the submission's
folder (``exercise_utils/hosts.py``, ``DTFS_TEST_WEAKEN=kernel-folder`` binds it back). With
every defence on, the notebooks' own autograde tests grade the dropper as their blank
submission: 0 points on all ten.

The names it plants are those of a real grading run, traced (``tests/import_trace``: every
module name any process of the run looked for, found or not); the first test traces one and
fails if the committed list (``tests/fixtures/traced_imports.txt``) lacks a name it saw.
Refresh the list with ``python tests/test_isolation.py NN_stem ...`` (all ten by default).
"""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dropper  # noqa: E402
from test_sandbox import bwrap  # noqa: E402,F401 - the fixture: installs bubblewrap or skips

ROOT = Path(__file__).resolve().parents[1]
STEM = "01_mpi_parallel_sgd"
pytestmark = pytest.mark.notebook


def _course(tmp_path, stem, submissions):
    course = tmp_path / "course"
    for student, text in submissions.items():
        target = course / "submitted" / student / stem
        target.mkdir(parents=True)
        (target / f"{stem}.ipynb").write_text(text)
    return course


def _no_bwrap(tmp_path):
    """A PATH with everything of this one but ``bwrap``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for folder in os.environ["PATH"].split(os.pathsep):
        for exe in Path(folder).glob("*") if Path(folder).is_dir() else ():
            if exe.name != "bwrap" and not (bin_dir / exe.name).exists():
                (bin_dir / exe.name).symlink_to(exe)
    return f"{Path(sys.executable).parent}{os.pathsep}{bin_dir}"


def grade(tmp_path, stem, submissions, env=(), unsafe=False, timeout=1800):
    """``scripts/course.py autograde`` (quick mode) of ``submissions`` with ``env`` added;
    returns ``({student: score}, output)``."""
    course = _course(tmp_path, stem, submissions)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "course.py"), "autograde",
                           "--course", str(course), "--cell-timeout", "300",
                           *(["--unsafe"] if unsafe else [])],
                          env={**os.environ, "DTFS_QUICK": "1", **dict(env)},
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(course / "grades.csv") as f:
        scores = {row["student_id"]: float(row["score"]) for row in csv.DictReader(f)}
    return scores, proc.stdout + proc.stderr


def traced_run(tmp_path, stem, submissions, env=()):
    """Grade ``submissions`` with every process's imports traced, no sandbox (so that the
    zygotes and ranks can write their logs: without ``bwrap``, the hosts' zygotes run bare),
    every launch on hosts; returns ``(scores, {role: names looked for})``."""
    trace = tmp_path / "trace"
    trace.mkdir()
    canary = tmp_path / "canary"     # (bare hosts share the machine's /tmp: never emptied)
    canary.write_text("")
    env = {"DTFS_IMPORT_TRACE": str(trace), "DTFS_OBSERVE": "1", "PATH": _no_bwrap(tmp_path),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests" / "import_trace"),
                                                       os.environ.get("PYTHONPATH")])),
           **dict(env)}
    scores, _ = grade(tmp_path, stem, submissions, env, unsafe=True)
    assert canary.exists(), "the machine's /tmp was emptied"
    return scores, dropper.traced_names(trace)


def _release(stem):
    return (ROOT / "notebooks" / f"{stem}.ipynb").read_text()


def test_the_dropper_takes_a_kernel_over_only_with_both_defences_off(bwrap, tmp_path):  # noqa: F811
    """Both defences off (the kernel imports from its folder, the ranks write it): the
    dropper's blank notebook scores (so the trick is real and the next tests can fail). Its
    traced run looked for no name the committed list lacks."""
    scores, roles = traced_run(tmp_path, STEM, {"dropper": dropper.notebook(_release(STEM))},
                               {"DTFS_TEST_WEAKEN": "safe-path"})
    assert scores["dropper"] > 0, scores
    seen = {name.split(".")[0] for names in roles.values() for name in names}
    assert {"kernel", "zygote", "rank"} <= set(roles), sorted(roles)
    missing = sorted(n for n in seen - set(dropper.names()) if n.isidentifier()
                     and n not in ("exercise_utils", "__main__"))
    assert not missing, f"tests/fixtures/traced_imports.txt lacks {missing}: refresh it"


@pytest.mark.parametrize("weakened", ["safe-path", "kernel-folder"])
def test_each_defence_alone_stops_the_dropper(bwrap, tmp_path, weakened):  # noqa: F811
    """Graded as instructors grade (the sandbox), with one of the two defences switched off:
    the other stops the dropper (0 points). (The solution graded beside it took 80 % of the
    test's two minutes and proved nothing of the defences: its full marks under the same
    sandbox are the notebook's autograde test.)"""
    scores, out = grade(tmp_path, STEM, {"dropper": dropper.notebook(_release(STEM))},
                        {"DTFS_TEST_WEAKEN": weakened})
    assert scores == {"dropper": 0}, (scores, out[-3000:])
    from grading import check_outputs      # (and graded it was: every check ran and said so)
    checks = check_outputs(tmp_path / "course", "dropper", STEM)
    cells = json.loads(_release(STEM))["cells"]
    count = sum("".join(c["source"]).startswith("# CHECK ") for c in cells)
    assert len(checks) == count > 0 and all("not implemented yet: " in o for o in checks.values()), {
        first: outputs[-500:] for first, outputs in checks.items()}


def refresh(stems, tmp):
    """Trace a grading run of each notebook's solution and dropper and add every name any
    process looked for to tests/fixtures/traced_imports.txt (written after each notebook)."""
    text = dropper.TRACED.read_text() if dropper.TRACED.exists() else ""
    names = {line for line in text.splitlines() if line and not line.startswith("#")}
    for stem in stems:
        folder = Path(tmp) / stem
        folder.mkdir()
        solution = (ROOT / "solutions" / f"{stem}.ipynb").read_text()
        _, roles = traced_run(folder, stem, {"solution": solution,
                                             "dropper": dropper.notebook(_release(stem))})
        names |= {n for found in roles.values() for n in found}
        print(f"{stem}: {sum(map(len, roles.values()))} names ({', '.join(sorted(roles))})",
              flush=True)
        lines = ["# Every module name the processes of a traced grading run looked for (found",
                 "# or not): tests/test_isolation.py; `python tests/test_isolation.py [NN_stem",
                 "# ...]` adds those of a new run.", *sorted(names)]
        dropper.TRACED.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        refresh(sys.argv[1:] or sorted(p.stem for p in (ROOT / "solutions").glob("*.ipynb")),
                tmp)
