"""``course.py autograde --jobs N`` (scripts/parallel_grade.py): N submissions at once, each in
its own folder, merged into one gradebook; a crashed or hung submission costs only itself."""
import csv
import json

import nbformat
import psutil

from test_pipeline import FIXTURE, STEM, by_id, course

HANG = '%%writefile work/00_add.py\ndef add(a, b):\n    while True:\n        pass\n'
CRASH = "# solution: double\nimport os\nos._exit(1)  # the kernel dies\n"


def test_four_jobs_grade_a_class_and_isolate_failures(tmp_path, fixture_release):
    blank, solved = (nbformat.read(p, as_version=4) for p in (fixture_release, FIXTURE))
    hung, crashed = nbformat.read(fixture_release, as_version=4), nbformat.read(FIXTURE, as_version=4)
    by_id(hung)["00_add"].source = HANG
    by_id(crashed)["double"].source = CRASH
    subs = {**{f"s{i}": solved for i in range(4)}, "blank": blank, "hung": hung, "crashed": crashed}
    for student, nb in subs.items():
        folder = tmp_path / "course" / "submitted" / student / STEM
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{STEM}.ipynb")
    before = {p.pid for p in psutil.process_iter()}
    proc = course("autograde", "--course", tmp_path / "course", "--solutions", FIXTURE.parent,
                  "--jobs", 4, "--job-timeout", 120, "--cell-timeout", 600)
    # (a right job takes 20-30 s here alone, and ran past 45 s under CI's load: a slow machine is not a hang)
    # two submissions failed, each given 0 with a reason: every one handled, exit 0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(tmp_path / "course" / "grades.csv", newline="") as f:
        scores = {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)}
    assert scores == {"s0": 3, "s1": 3, "s2": 3, "s3": 3, "blank": 0, "hung": 0, "crashed": 0}
    out = proc.stdout
    assert "7/7 graded, 2 failed" in out and "TIMEOUT" in out and "FAILED" in out
    with open(tmp_path / "course" / "grading_report.csv", newline="") as f:
        report = {r["student"]: (r["status"], r["reason"]) for r in csv.DictReader(f)}
    assert {s: status for s, (status, _) in report.items()} == {
        "s0": "graded", "s1": "graded", "s2": "graded", "s3": "graded", "blank": "graded",
        "hung": "failed", "crashed": "failed"}
    assert "ran past --job-timeout (120 s)" in report["hung"][1]
    assert "DeadKernelError: Kernel died" in report["crashed"][1]
    for student in ("hung", "crashed"):
        assert (tmp_path / "course" / ".grading" / f"{STEM}--{student}" / "log.txt").is_file()
    for student in ("s0", "blank"):
        graded = tmp_path / "course" / "autograded" / student / STEM / f"{STEM}.ipynb"
        assert "check_add" in json.dumps(json.loads(graded.read_text())["cells"])
    survivors = [p for p in psutil.process_iter(["pid", "cmdline"])
                 if p.pid not in before and "ipykernel" in " ".join(p.info["cmdline"] or [])
                 and _runs_in(p, tmp_path)]    # other tests' kernels may run beside this one
    assert not survivors, survivors        # the hung submission's kernel was killed too


def _runs_in(proc, folder):
    try:
        return str(folder) in proc.cwd()
    except psutil.Error:
        return False
