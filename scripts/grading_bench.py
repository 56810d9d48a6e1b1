#!/usr/bin/env python3
"""Seconds to autograde one submission of each notebook: graded-only vs the whole notebook.

    DTFS_QUICK=1 python scripts/grading_bench.py 01 02 03 --out results/grading_quick.json
    DTFS_QUICK=1 python scripts/grading_bench.py --sandbox 01 02 --out results/grading_sandbox.json
    python scripts/grading_bench.py --jobs-class 02 --students 4 --out results/grading_jobs.json
    python scripts/grading_bench.py --slurm-class 08 --students 20 --out results/grading_slurm.json

Each measurement is a fresh course folder with the solution notebook submitted by
``--students`` students (default 1), graded with ``scripts/course.py autograde`` (nbgrader
start-up and generate_assignment included: what an instructor waits for). With
``--jobs-class NN`` it grades a class of NN's solution with JOBS=1 then JOBS=2 instead; with
``--slurm-class NN`` through a one-node SLURM it starts and stops (tests/local_slurm.py; root).
With ``--sandbox`` it grades each notebook graded-only twice, in the grading sandbox (the
default of ``make autograde``) and with ``--unsafe`` (none), one after the other.
Results go to JSON and a table; ratios are within one run of this script.
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def grade(stem, students, extra, env=None):
    with tempfile.TemporaryDirectory(prefix="grading-bench-") as tmp:
        course = Path(tmp) / "course"
        for i in range(students):
            folder = course / "submitted" / f"student{i}" / stem
            folder.mkdir(parents=True)
            (folder / f"{stem}.ipynb").write_text((ROOT / "solutions" / f"{stem}.ipynb").read_text())
        env = {**(env or os.environ),
               "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
        start = time.monotonic()
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "course.py"), "autograde",
                               "--course", str(course), *extra], env=env, capture_output=True, text=True)
        seconds = time.monotonic() - start
        grades = course / "grades.csv"
        rows = list(csv.DictReader(grades.open())) if grades.is_file() else []
        full = proc.returncode == 0 and len(rows) == students and all(
            float(r["score"]) == float(r["max_score"]) for r in rows)    # the solution: full marks
        return seconds, full, proc.stdout[-600:] + proc.stderr[-600:]


def stem_of(prefix):
    return next(p.stem for p in sorted((ROOT / "solutions").glob(f"{prefix}*.ipynb")))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="*", help="notebook numbers (default: all)")
    p.add_argument("--jobs-class", help="grade a class of this notebook with JOBS=1 and JOBS=2")
    p.add_argument("--slurm-class", help="grade a class of this notebook on a local SLURM")
    p.add_argument("--sandbox", action="store_true",
                   help="graded-only in the sandbox against --unsafe, per notebook")
    p.add_argument("--per-task", type=int, default=1)
    p.add_argument("--students", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    mode = "quick" if os.environ.get("DTFS_QUICK") == "1" else "full"
    rows = []
    if args.slurm_class:
        sys.path.insert(0, str(ROOT / "tests"))
        import local_slurm
        reason = local_slurm.unavailable()
        if reason:
            sys.exit(f"no local SLURM: {reason}")
        stem = stem_of(args.slurm_class)
        with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp, \
                local_slurm.LocalSlurm(tmp) as cluster:
            seconds, ok, tail = grade(stem, args.students, ["--slurm", "--wait", "--per-task",
                                                            str(args.per_task)], cluster.env)
        rows.append({"notebook": stem, "mode": mode, "slurm": True, "students": args.students,
                     "per_task": args.per_task, "seconds": round(seconds, 1), "ok": ok})
        print(f"{stem} {mode} SLURM, {args.students} students, {args.per_task} per task: "
              f"{seconds:.0f} s ({seconds / args.students:.0f} s per submission)"
              f"{'' if ok else ' FAILED ' + tail}", flush=True)
    elif args.jobs_class:
        stem = stem_of(args.jobs_class)
        for jobs in (1, 2):
            seconds, ok, tail = grade(stem, args.students, ["--jobs", str(jobs)])
            rows.append({"notebook": stem, "mode": mode, "jobs": jobs, "students": args.students,
                         "seconds": round(seconds, 1), "ok": ok})
            print(f"{stem} {mode} JOBS={jobs} {args.students} students: {seconds:.0f} s "
                  f"({seconds / args.students:.0f} s per submission){'' if ok else ' FAILED ' + tail}",
                  flush=True)
    else:
        prefixes = args.notebooks or sorted(p.stem[:2] for p in (ROOT / "solutions").glob("*.ipynb"))
        for prefix in prefixes:
            stem = stem_of(prefix)
            row = {"notebook": stem, "mode": mode, "students": args.students}
            modes = ((("sandboxed", []), ("unsafe", ["--unsafe"])) if args.sandbox else
                     (("graded_only", []), ("whole_notebook", ["--whole-notebook"])))
            for name, extra in modes:
                seconds, ok, tail = grade(stem, args.students, extra)
                row[name] = round(seconds / args.students, 1)
                row[name + "_ok"] = ok
                if not ok:
                    print(f"{stem} {name}: FAILED\n{tail}", flush=True)
            rows.append(row)
            if args.sandbox:
                row["ratio"] = round(row["sandboxed"] / row["unsafe"], 2)
                print(f"{stem} {mode}: sandboxed {row['sandboxed']:.0f} s, unsafe "
                      f"{row['unsafe']:.0f} s per submission: {row['ratio']:.2f}x", flush=True)
                continue
            row["ratio"] = round(row["whole_notebook"] / row["graded_only"], 2)
            print(f"{stem} {mode}: graded-only {row['graded_only']:.0f} s, whole notebook "
                  f"{row['whole_notebook']:.0f} s per submission: {row['ratio']:.1f}x", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
