#!/usr/bin/env python3
"""Grade a class on a SLURM cluster: an sbatch array job, then a dependent merge job.

    python scripts/course.py autograde --course DIR --slurm [--per-task K] [--sbatch-arg ARG]

``submit`` (called by course.py after ``generate_assignment``) prepares one job folder per
submission (scripts/parallel_grade.py: its own gradebook copy, nbgrader config, kernels over
IPC sockets), writes ``DIR/.grading/tasks.json`` and two scripts, and submits them:

* ``grade.sbatch``: an array job, task i grading submissions i*K .. i*K+K-1 of tasks.json,
  each in its own folder, each writing ``status.json`` there;
* ``merge.sbatch``: ``--dependency=afterany`` on the array (it runs whether tasks succeeded
  or not), merging every graded folder into ``DIR/gradebook.db``, giving 0 to the
  submissions that failed (their logs are kept), exporting ``DIR/grades.csv`` and writing
  ``DIR/grading_report.csv`` (scripts/submissions.py), with the malformed submissions that
  course.py found and gave 0 before submitting (``DIR/.grading/malformed.json``).

The course folder must be on a file system that every node sees, as the course's venv is.
``python scripts/slurm_grade.py task DIR I`` and ``... merge DIR`` are what the scripts run.
"""
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import parallel_grade  # noqa: E402
import submissions  # noqa: E402

HERE = Path(__file__).resolve()


def _grading(course):
    return Path(course) / parallel_grade.JOBS_DIR


def write_scripts(course, pairs, per_task, sbatch_args, job_timeout):
    """Write tasks.json, grade.sbatch and merge.sbatch; return (grade script, merge script)."""
    grading = _grading(course)
    tasks = [pairs[i:i + per_task] for i in range(0, len(pairs), per_task)]
    (grading / "tasks.json").write_text(json.dumps(tasks, indent=1))
    py, me = shlex.quote(sys.executable), shlex.quote(str(HERE))
    extra = [f"#SBATCH {arg}" for arg in sbatch_args]
    minutes = max(1, (job_timeout * per_task + 59) // 60 + 5)
    grade = grading / "grade.sbatch"
    grade.write_text("\n".join([
        "#!/bin/bash", "#SBATCH --job-name=dtfs-grade", f"#SBATCH --array=0-{len(tasks) - 1}",
        "#SBATCH --ntasks=1", "#SBATCH --cpus-per-task=1", f"#SBATCH --time={minutes}",
        f"#SBATCH --output={grading}/slurm-grade-%A_%a.out", *extra, "",
        f'exec {py} {me} task {shlex.quote(str(course))} "$SLURM_ARRAY_TASK_ID"', ""]))
    merge = grading / "merge.sbatch"
    merge.write_text("\n".join([
        "#!/bin/bash", "#SBATCH --job-name=dtfs-merge", "#SBATCH --ntasks=1", "#SBATCH --time=30",
        f"#SBATCH --output={grading}/slurm-merge-%j.out", *extra, "",
        f"exec {py} {me} merge {shlex.quote(str(course))}", ""]))
    return grade, merge


def submit(course, pairs, malformed, per_task, sbatch_args, job_timeout, write_config, env):
    """Prepare the job folders, write the scripts and submit them.

    Args:
        course: the course folder; pairs: [(assignment, student)] to grade;
        malformed: {(assignment, student): reason}, given 0 already, for the report;
        per_task: submissions per array task; sbatch_args: extra #SBATCH lines;
        job_timeout: seconds per submission; write_config(folder): writes a job's config;
        env: the environment of sbatch.
    Returns:
        (array job id, merge job id).
    """
    grading = _grading(course)
    grading.mkdir(parents=True, exist_ok=True)
    (grading / "malformed.json").write_text(json.dumps([[*pair, reason] for pair, reason
                                                        in sorted(malformed.items())], indent=1))
    for pair in pairs:
        folder = parallel_grade.prepare_job(course, *pair)
        write_config(folder)
        (folder / "timeout").write_text(str(job_timeout))
    grade, merge = write_scripts(course, pairs, per_task, sbatch_args, job_timeout)
    array_id = _sbatch([str(grade)], env)
    merge_id = _sbatch([f"--dependency=afterany:{array_id}", str(merge)], env)
    return array_id, merge_id


def _sbatch(args, env):
    proc = subprocess.run(["sbatch", "--parsable", *args], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip().split(";")[0]


def task(course, index):
    """Grade the submissions of array task ``index`` (each writes status.json in its folder)."""
    tasks = json.loads((_grading(course) / "tasks.json").read_text())
    for assignment, student in tasks[index]:
        folder = parallel_grade.job_folder(course, assignment, student)
        timeout = int((folder / "timeout").read_text())
        status, seconds = parallel_grade.run_job(folder, assignment, student,
                                                 [sys.executable, "-m", "nbgrader"], None, timeout)
        (folder / "status.json").write_text(json.dumps({"status": status, "seconds": seconds}))
        print(f"{student}/{assignment}: {status} ({seconds:.0f} s)", flush=True)


def merge(course):
    """Merge every graded job folder into the course; give 0 to the submissions that failed or
    never ran; export grades.csv; write grading_report.csv (and grades.failed.json).

    Returns:
        0, or 1 when nbgrader export failed.
    """
    course = Path(course)
    tasks = json.loads((_grading(course) / "tasks.json").read_text())
    pairs = [tuple(pair) for chunk in tasks for pair in chunk]
    malformed = {(a, s): reason for a, s, reason in
                 json.loads((_grading(course) / "malformed.json").read_text())}
    failed = {}
    for assignment, student in pairs:
        folder = parallel_grade.job_folder(course, assignment, student)
        status_file = folder / "status.json"
        status = json.loads(status_file.read_text())["status"] if status_file.is_file() else "never ran"
        if status == "ok":
            try:
                parallel_grade.merge(folder, course, assignment, student)
                shutil.rmtree(folder, ignore_errors=True)
                continue
            except Exception as err:
                status = f"merge failed: {err}"
        timeout = int((folder / "timeout").read_text())
        failed[assignment, student] = submissions.job_failure(folder, (assignment, student),
                                                              status, timeout)
        submissions.record_zero(course, assignment, student)
        print(f"NOT GRADED: {student}/{assignment}: {failed[assignment, student]}")
    grades = course / "grades.csv"
    proc = subprocess.run([sys.executable, "-m", "nbgrader", "export", "--to", str(grades)],
                          cwd=course, capture_output=True, text=True)
    print(proc.stdout[-2000:] + proc.stderr[-2000:])
    if proc.returncode:
        return 1
    (course / "grades.failed.json").write_text(json.dumps(sorted(failed)))
    rows = submissions.report_rows(grades, pairs + list(malformed), malformed, failed)
    print(f"grades: {grades}; report: {submissions.write_report(course, rows)}")
    submissions.print_report(rows)
    return 0


def wait(job_ids, env, timeout, poll=2.0):
    """Wait until none of ``job_ids`` is queued or running (for --wait); False on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(job_ids)], env=env,
                              capture_output=True, text=True)
        if proc.returncode == 0 and not proc.stdout.strip():
            return True
        time.sleep(poll)
    return False


if __name__ == "__main__":
    if sys.argv[1:2] == ["task"]:
        task(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1:2] == ["merge"]:
        sys.exit(merge(sys.argv[2]))
    else:
        sys.exit(__doc__)
