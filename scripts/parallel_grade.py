"""Grade submissions N at a time, each in its own nbgrader course folder, merged afterwards.

``grade_all`` gives every (assignment, student) pair its own *job folder*
``COURSE/.grading/<assignment>--<student>/``: a copy of the course's gradebook (which holds
the assignment after ``generate_assignment``), the course's ``source/`` (a link), the one
submission, and an ``nbgrader_config.py`` whose kernels talk over IPC sockets in a short
private folder (``DTFS_KERNEL_IPC``: no TCP port for two kernels to collide on; the checks' own launches take a
fresh port each, :func:`exercise_utils.launch.free_port`). ``nbgrader autograde A --student
S`` runs there. When it finishes, the parent, and only the parent, merges its scores into
the course's gradebook (one writer: no sqlite lock contention) and moves the autograded
folder into the course. A submission that crashes, or runs past ``job_timeout`` (its whole
process tree is killed), costs only itself: it is reported, its log kept, the others go on.

Used by scripts/course.py (autograde --jobs N) and scripts/slurm_grade.py (one task each).
"""
import concurrent.futures
import os
import shutil
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import psutil

JOBS_DIR = ".grading"


def submission_pairs(course, assignments):
    """[(assignment, student)] of COURSE/submitted; every student is put in the gradebook, so
    that one whose grading fails is still exported (score 0)."""
    from nbgrader.api import Gradebook
    course = Path(course)
    pairs = [(stem, p.parent.name) for stem in assignments
             for p in sorted((course / "submitted").glob(f"*/{stem}")) if p.is_dir()]
    with Gradebook("sqlite:///" + str(course / "gradebook.db")) as gb:
        for student in sorted({student for _, student in pairs}):
            gb.update_or_create_student(student)
    return pairs


def job_folder(course, assignment, student):
    return Path(course) / JOBS_DIR / f"{assignment}--{student}"


def prepare_job(course, assignment, student):
    """Make the job folder of one submission (config written later, by :func:`run_job`)."""
    course = Path(course)
    folder = job_folder(course, assignment, student)
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "source").mkdir(parents=True)
    os.symlink(course / "source" / assignment, folder / "source" / assignment)
    shutil.copytree(course / "submitted" / student / assignment,
                    folder / "submitted" / student / assignment, symlinks=False)
    shutil.copy(course / "gradebook.db", folder / "gradebook.db")
    return folder


def run_job(folder, assignment, student, nbgrader_cmd, env, job_timeout):
    """Run nbgrader autograde for one submission in ``folder`` (config written already); its
    kernels use IPC sockets in a fresh private folder (``DTFS_KERNEL_IPC``, read by the
    config that scripts/course.py writes).

    Returns:
        (status, seconds): status "ok", "failed" (nbgrader reported an error) or
        "timeout" (killed after ``job_timeout`` s). nbgrader's output is in folder/log.txt.
    """
    start = time.monotonic()
    ipc = tempfile.mkdtemp(prefix="dtfs-k-", dir="/tmp")   # AF_UNIX paths: 107 bytes at most
    # (also the kernels' temporary folders: what the grading wrote there goes with it)
    env = {**(env or os.environ), "DTFS_KERNEL_IPC": ipc, "DTFS_GRADE_TMP": ipc}
    group = None
    if env.get("DTFS_JOB_MEMORY"):       # one submission's memory in all (course.py, as root)
        from exercise_utils import limits
        group = limits.Cgroup.make("job")
        if group is not None:
            group.set(memory=int(env["DTFS_JOB_MEMORY"]))
    try:
        with open(folder / "log.txt", "w") as log:
            proc = subprocess.Popen([*nbgrader_cmd, "autograde", assignment, "--student", student,
                                     "--force"], cwd=folder, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=group and group.join)
            try:
                code = proc.wait(timeout=job_timeout)
            except subprocess.TimeoutExpired:
                kill_tree(proc.pid)
                proc.wait()
                return "timeout", time.monotonic() - start
        text = (folder / "log.txt").read_text(errors="replace")
        bad = code != 0 or "There was an error processing assignment" in text
        return ("failed" if bad else "ok"), time.monotonic() - start
    finally:
        if group is not None:
            group.close()
        shutil.rmtree(ipc, ignore_errors=True)


def kill_tree(pid):
    """Kill ``pid`` and every descendant (kernels start in sessions of their own)."""
    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def merge(folder, course, assignment, student):
    """Copy one graded submission's scores and files from its job folder into the course."""
    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning
    warnings.simplefilter("ignore", SAWarning)   # nbgrader's own update_or_create_submission warns
    src_url = "sqlite:///" + str(Path(folder) / "gradebook.db")
    dst_url = "sqlite:///" + str(Path(course) / "gradebook.db")
    with Gradebook(src_url) as src, Gradebook(dst_url) as dst:
        sub = src.find_submission(assignment, student)
        dst.update_or_create_student(student)
        extra = {"timestamp": sub.timestamp} if sub.timestamp else {}
        dst.update_or_create_submission(assignment, student, **extra)
        for notebook in sub.notebooks:
            target = dst.find_submission_notebook(notebook.name, assignment, student)
            target.late_submission_penalty = notebook.late_submission_penalty
            for grade in notebook.grades:
                mine = dst.find_grade(grade.name, notebook.name, assignment, student)
                mine.auto_score = grade.auto_score
                mine.needs_manual_grade = grade.needs_manual_grade or mine.manual_score is not None
            for comment in notebook.comments:
                dst.find_comment(comment.name, notebook.name, assignment,
                                 student).auto_comment = comment.auto_comment
        dst.db.commit()
    out = Path(course) / "autograded" / student / assignment
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(Path(folder) / "autograded" / student / assignment), out)


def progress(done, total, failed, width=30):
    filled = int(width * done / total) if total else width
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} graded, {failed} failed"


def grade_all(course, pairs, jobs, write_config, nbgrader_cmd, env, job_timeout, out=print):
    """Grade ``pairs`` [(assignment, student)] ``jobs`` at a time; merge each as it ends.
    ``write_config(folder)`` writes a job folder's nbgrader_config.py.

    Returns:
        {(assignment, student): (status, seconds)}; a failed or timed-out job keeps its
        folder (log.txt); a merged one is removed.
    """
    course = Path(course)
    results, failed = {}, 0
    out(progress(0, len(pairs), 0))
    folders = {pair: prepare_job(course, *pair) for pair in pairs}
    for folder in folders.values():
        write_config(folder)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(run_job, folders[pair], *pair, nbgrader_cmd, env, job_timeout): pair
                   for pair in pairs}
        for future in concurrent.futures.as_completed(futures):
            pair = futures[future]
            status, seconds = future.result()
            if status == "ok":
                try:
                    merge(folders[pair], course, *pair)
                    shutil.rmtree(folders[pair], ignore_errors=True)
                except Exception as err:     # a broken job gradebook costs this submission only
                    status = f"failed (merge: {err})"
            failed += status != "ok"
            results[pair] = (status, seconds)
            note = "" if status == "ok" else f"  {status.upper()}: see {folders[pair] / 'log.txt'}"
            out(f"{progress(len(results), len(pairs), failed)}  {pair[1]}/{pair[0]} "
                f"{seconds:.0f} s{note}")
    if not any((course / JOBS_DIR).iterdir()):
        (course / JOBS_DIR).rmdir()
    return results

