"""Run several commands at once (the torchrun agents of a multi-node job on one machine), with
the guarantees of :mod:`exercise_utils.launch`: live labelled output, one hard timeout, and no
process left behind (one launch tag covers every command).

Used in 05_ddp_torchrun_fault_tolerance (through its ``multinode`` module).
"""
import os
import selectors
import subprocess
import sys
import time
import uuid

import psutil

from . import progress
from .launch import core_share
from .outcomes import HANG_HINT, LaunchError, LaunchTimeout, RunResult, signal_name, tail
from .ports import free_port
from .processes import TAG, cleanup, die_with_parent, remember_children


def run_many(cmds, timeout=120, labels=None, env=None, envs=None, cwd=None, echo=True,
             what=None, threads_per_process=None, nprocs=1, may_fail=(), transcript=None):
    """Run several commands at the same time (e.g. the torchrun agents of a multi-node job).

    Every line of output is printed live with its command's label (``[node a] ...``). When
    any command fails, or ``timeout`` passes, ALL of them are stopped with every process
    they started (one launch tag covers them all, so tests/conftest.py still sees them).

    Args:
        cmds: list of commands (each a list of program arguments).
        timeout: seconds for all of them together.
        labels: one short name per command (default ``cmd 0``, ``cmd 1``, ...).
        env: extra environment variables for every command (as in :func:`run`; they share
            MASTER_ADDR=127.0.0.1 and one fresh MASTER_PORT unless ``env`` gives them).
        envs: optional list of per-command extra environment variables.
        cwd: working directory.
        echo: print the labelled output lines as they arrive.
        what: short description for error messages (default: the labels).
        threads_per_process: OMP/MKL threads per process; default: CPU cores // (total
            processes), at least 1, unless OMP_NUM_THREADS is already set.
        nprocs: processes EACH command starts (for the default above).
        may_fail: indices of commands whose non-zero exit stops nothing (e.g. an agent a
            fault injection kills): the others go on, and its result keeps the exit code.
        transcript: optional list; receives ``(seconds since the start, labelled line)`` for
            every line, in arrival order (also when the run fails).
    Returns:
        list[RunResult], one per command, when every other command exited with code 0.
    Raises:
        LaunchTimeout: not all finished within ``timeout``; names those still running.
        LaunchError: a command exited with a non-zero code; names the first that did
            (``err.cmd``, ``err.returncode``); all the others were killed.
    Used in 05_ddp_torchrun_fault_tolerance (exercise_utils.ddp_torchrun_fault_tolerance.multinode).
    """
    cmds = [[str(c) for c in cmd] for cmd in cmds]
    labels = list(labels or [f"cmd {i}" for i in range(len(cmds))])
    envs = list(envs or [{}] * len(cmds))
    if not (len(cmds) == len(labels) == len(envs)) or not cmds:
        raise ValueError("run_many needs one label and one env per command, and a command")
    what = what or " + ".join(labels)
    tag = f"{os.getpid()}:{uuid.uuid4().hex}"    # owner pid first: see tests/conftest.py
    base = {**os.environ, "PYTHONUNBUFFERED": "1", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()), **(env or {}), TAG: tag}
    threads = threads_per_process or core_share(nprocs * len(cmds))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if threads_per_process or var not in os.environ:
            base[var] = str(threads)
    progress.top()                  # in Jupyter: a failure's box shows above the lines
    start = time.monotonic()
    procs, seen, sel = [], {}, selectors.DefaultSelector()
    lines = [[] for _ in cmds]       # per command, unlabelled
    merged = _Stamped(start)         # every command, labelled, in arrival order
    status, failed = "interrupted", None
    try:
        for i, cmd in enumerate(cmds):
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    cwd=cwd, env={**base, **envs[i]}, start_new_session=True,
                                    preexec_fn=die_with_parent)
            procs.append(proc)
            seen[proc.pid] = psutil.Process(proc.pid)
            sel.register(proc.stdout, selectors.EVENT_READ, (i, [""]))
        while True:
            codes = [p.poll() for p in procs]
            bad = [i for i, c in enumerate(codes) if c not in (None, 0) and i not in may_fail]
            if bad:
                status, failed = "failed", bad[0]
                break
            if all(c == 0 or (c is not None and i in may_fail) for i, c in enumerate(codes)):
                status = "done"
                break
            if time.monotonic() - start > timeout:
                status = "timeout"
                break
            _pump_many(sel, lines, merged, labels, echo, 0.2)
            remember_children(seen)
    finally:
        killed = []
        for proc in procs:
            killed += cleanup(proc, tag, seen)
        end = time.monotonic() + 1.0       # all are dead now: read what is left in the pipes
        while sel.get_map() and time.monotonic() < end:
            _pump_many(sel, lines, merged, labels, echo, 0.05)
        for key in list(sel.get_map().values()):
            i, partial = key.data
            if partial[0]:
                _emit(i, partial[0], lines, merged, labels, echo)
        for proc in procs:
            proc.stdout.close()
        killed = sorted(set(killed))
        if status == "interrupted":
            print(f"Interrupted: stopped {what} and killed {len(killed)} process(es).",
                  file=sys.stderr, flush=True)
    seconds = time.monotonic() - start
    output = "\n".join(merged)
    if transcript is not None:
        transcript.extend(zip(merged.times, merged))
    if status == "timeout":
        running = [labels[i] for i, c in enumerate(codes) if c is None]
        raise LaunchTimeout(
            f"{what} did not finish within {timeout:g} s ({', '.join(running)} still running), "
            f"so all were stopped and {len(killed)} process(es) killed. {HANG_HINT}\n"
            f"--- last output ---\n{tail(merged)}", cmds, None, output)
    if status == "failed":
        code = procs[failed].returncode
        raise LaunchError(
            f"{labels[failed]} failed with exit code {code} after "
            f"{seconds:.1f} s{signal_name(code)}, so all of {what} were stopped and "
            f"{len(killed)} process(es) killed.\n--- last output of {labels[failed]} ---\n"
            f"{tail(lines[failed])}", cmds[failed], code, output)
    return [RunResult(cmd, p.returncode, "\n".join(out), seconds, killed)
            for cmd, p, out in zip(cmds, procs, lines)]


class _Stamped(list):
    """A list of lines that also keeps when each arrived (seconds since ``start``)."""

    def __init__(self, start):
        super().__init__()
        self.start, self.times = start, []

    def append(self, line):
        self.times.append(time.monotonic() - self.start)
        super().append(line)


def _emit(i, line, lines, merged, labels, echo):
    lines[i].append(line)
    merged.append(f"[{labels[i]}] {line}")
    if echo:
        print(merged[-1], flush=True)


def _pump_many(sel, lines, merged, labels, echo, wait):
    """Read the output that is ready within ``wait`` seconds from any of run_many's pipes."""
    if not sel.get_map():
        time.sleep(wait)
        return
    for key, _ in sel.select(timeout=wait):
        i, partial = key.data
        chunk = os.read(key.fd, 65536)
        if not chunk:
            sel.unregister(key.fileobj)
            if partial[0]:
                _emit(i, partial.pop(), lines, merged, labels, echo)
                partial.append("")
            continue
        *done, rest = (partial.pop() + chunk.decode("utf-8", errors="replace")).split("\n")
        partial.append(rest)
        for line in done:
            _emit(i, line, lines, merged, labels, echo)
