"""The course on a real (one-node) SLURM cluster that the tests start and stop themselves:
a class graded by ``course.py autograde --slurm`` (array job + dependent merge job), and
notebook 05's sbatch script (``multinode.slurm_script``) run as printed, not only printed."""
import csv
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import local_slurm
from exercise_utils import launch
from exercise_utils.ddp_torchrun_fault_tolerance import hello, multinode
from test_pipeline import COURSE, FIXTURE, STEM, UNSAFE, by_id

pytestmark = pytest.mark.serial
CRASH = "# solution: double\nimport os\nos._exit(1)  # the kernel dies\n"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = local_slurm.unavailable()
    if reason:
        pytest.skip(reason)
    with local_slurm.LocalSlurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def test_a_class_is_graded_by_an_array_job_and_a_merge_job(tmp_path, slurm, fixture_release):
    blank, solved = (nbformat.read(p, as_version=4) for p in (fixture_release, FIXTURE))
    crashed = nbformat.read(FIXTURE, as_version=4)
    by_id(crashed)["double"].source = CRASH
    copied = nbformat.read(FIXTURE, as_version=4)        # malformed: never dispatched, given 0
    copied.cells.append(nbformat.v4.new_code_cell("pass", metadata={"nbgrader": {"grade": False}}))
    subs = {**{f"s{i}": solved for i in range(3)}, "blank": blank, "crashed": crashed,
            "copied": copied}
    for student, nb in subs.items():
        folder = tmp_path / "course" / "submitted" / student / STEM
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{STEM}.ipynb")
    env = {**slurm.env, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    proc = subprocess.run([sys.executable, str(COURSE), "autograde", "--course", str(tmp_path / "course"),
                           "--solutions", str(FIXTURE.parent), "--slurm", "--wait", "--per-task", "2",
                           "--cell-timeout", "120", *UNSAFE], env=env, capture_output=True, text=True,
                          timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out      # the crashed submission: 0, with nbgrader's error
    assert "array job" in out and "(2 per task)" in out
    with open(tmp_path / "course" / "grades.csv", newline="") as f:
        scores = {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)}
    assert scores == {"s0": 3, "s1": 3, "s2": 3, "blank": 0, "crashed": 0, "copied": 0}, out
    copied = next(line for line in out.splitlines() if line.startswith("copied "))
    assert "malformed" in copied and "without a grade_id" in copied, out
    crashed = next(line for line in out.splitlines() if line.startswith("crashed "))
    assert "failed" in crashed and "DeadKernelError: Kernel died" in crashed, out
    grading = tmp_path / "course" / ".grading"
    assert len(list(grading.glob("slurm-grade-*_*.out"))) == 3      # 5 submissions, 2 per task
    assert (grading / f"{STEM}--crashed" / "log.txt").is_file()


def test_notebook_05_sbatch_script_runs_as_printed(tmp_path, slurm):
    report = tmp_path / "job.json"
    venv = Path(sys.executable).parent
    script = multinode.slurm_script(1, 0, hello.__file__, args=["--out", report],
                                    nproc_per_node=2, time="00:10:00", port=launch.free_port(),
                                    setup=f"source {venv / 'activate'}")
    job = tmp_path / "job.sh"
    job.write_text(script)
    env = {**slurm.env, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["sbatch", "--parsable", "--chdir", str(tmp_path), str(job)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    slurm.wait_for_jobs([proc.stdout.strip()], timeout=300)
    logs = "".join(p.read_text() for p in tmp_path.glob("ddp-*.out"))
    assert report.is_file(), logs
    summary = multinode.verify_job(multinode.load_report(report), nnodes=1, nproc_per_node=2,
                                   expected_params=hello.reference_params(2))
    print(summary)
