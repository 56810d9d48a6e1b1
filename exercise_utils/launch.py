"""Run distributed programs from a notebook or a test, and never leave a process behind.

Every launch gets live output, a hard timeout and a fresh free port. Every process
it starts carries a tag in its environment (``DTFS_LAUNCH_TAG=<launcher pid>:<id>``); when the launch
ends (success, failure, timeout or Ctrl-C) every process still carrying the tag is
killed, including workers that ``mpiexec`` or ``torchrun`` started in new sessions
(:mod:`exercise_utils.processes`).

Owns: :func:`run` (one command: live output, a hard timeout, every process it started killed
at its end), :func:`python`, :func:`mpiexec`, :func:`torchrun`, :class:`AgentReport`. Its
callers also take from here what its homes define: the errors and :class:`RunResult`
(:mod:`.outcomes`), :func:`free_port` (:mod:`.ports`), :func:`find_executable`,
:func:`agent_command` and the zygote's commands (:mod:`.commands`).

Used in every notebook (01_mpi_parallel_sgd onwards) and by the checker harness; several
commands at once (a multi-node job's agents): :mod:`exercise_utils.launch_many`.
"""
import os
import re
import selectors
import shlex
import subprocess
import sys
import time
import uuid

import psutil

from . import display, progress, sandbox
from .commands import FRESH_STORE_ENV, agent_command, find_executable, forked  # noqa: F401
from .outcomes import (HANG_HINT, LaunchError, LaunchHang, LaunchLimit,  # noqa: F401
                       LaunchOutput, LaunchTimeout, RunResult, signal_name, tail)
from .ports import free_port  # (re-exported, as are agent_command and the errors: launch's API)
from .processes import TAG, cleanup, die_with_parent, remember_children


KEEP_LINES = 20000     # lines of a launch's output kept (its first and last ones): memory bound


def _describe(cmd):
    return " ".join(shlex.quote(str(c)) for c in cmd)


class AgentReport:
    """An echo filter that hides torchrun's failure report from the live output: the agent's
    log lines once a worker failed, its own traceback and the ChildFailedError summary
    (35 or more lines that repeat, less clearly, what the ranks' ``[rankN]:`` tracebacks
    above them said). The ranks' lines always show; every line stays in the output
    (``err.output``); :attr:`hidden` counts the lines not shown."""
    START = re.compile(r"^[WEI]\d{4} [\d:.]+ +\d+ .*torch/distributed/elastic/.*"
                       r"(failed \(exitcode|closing signal)")

    def __init__(self):
        self.hiding, self.hidden = False, 0

    def __call__(self, line):
        if re.match(r"^\[(rank\d+\]:|\d+\] )", line):
            return True
        self.hiding = self.hiding or bool(self.START.match(line))
        self.hidden += self.hiding
        return not self.hiding

    def note(self):
        """What was left out, said once at the end of the launch (or None)."""
        return (f"(torchrun's failure report, {self.hidden} lines, not shown: the ranks' errors "
                "are above; all of it is in the error's .output)" if self.hidden else None)


def _pump(proc, sel, lines, echo, partial, wait, bars=None, counted=None):
    """Read whatever output is ready within ``wait`` seconds (up to a few MiB: a rank that
    prints fast is never left blocked on a full pipe, which would look like a hang); return
    False at EOF. ``echo``: print each line, or a callable that says which lines to print
    (e.g. :class:`AgentReport`). A rank's progress mark (:class:`.progress.Marks`) goes to
    ``bars`` (a :class:`.progress.Bars`), never to the output. ``counted``: a one-item list,
    the bytes read so far. Only the first and last :data:`KEEP_LINES` lines are kept."""
    for key, _ in sel.select(timeout=wait):
        chunk = os.read(key.fd, 1 << 20)
        if not chunk:
            sel.unregister(key.fileobj)
            return False
        if counted is not None:
            counted[0] += len(chunk)
        if len(lines) > 2 * KEEP_LINES:
            lines[KEEP_LINES // 2:-KEEP_LINES // 2] = ["[... lines left out ...]"]
        text = partial.pop() + chunk.decode("utf-8", errors="replace")
        *done, rest = text.split("\n")
        if len(rest) > 65536:        # a line without end: kept in pieces (bounded work)
            done, rest = done + [rest], ""
        partial.append(rest)
        for line in done:
            if progress.MARK in line:
                if bars is not None:
                    bars.feed(line)
                continue
            lines.append(line)
            if echo and (echo is True or echo(line)):
                print(line, flush=True)
    return True


def core_share(processes):
    """Each of ``processes`` processes' share of this machine's cores (at least 1): the torch
    threads a launched rank gets, and a forked rank or a test worker takes."""
    return max(1, (os.cpu_count() or 1) // max(1, processes))


def run(cmd, timeout=120, env=None, cwd=None, echo=True, what=None, threads_per_process=None,
        nprocs=1, watch=None, sandboxed=False, writable=None, output_limit=None):
    """Run ``cmd`` with live output and a hard timeout; kill every process it started.

    Args:
        cmd: list of program arguments.
        timeout: seconds before the whole process tree is killed and LaunchTimeout raised.
        env: extra environment variables (added to os.environ). MASTER_ADDR=127.0.0.1 and a
            fresh free MASTER_PORT are set unless ``env`` gives them.
        cwd: working directory.
        echo: print output lines as they arrive (they are always collected); or a callable
            that says which lines to print (:class:`AgentReport`, which :func:`torchrun` uses).
        what: short description used in error messages (default: the command line).
        threads_per_process: OMP/MKL threads per process; default: CPU cores // nprocs
            (at least 1), unless OMP_NUM_THREADS is already set.
        nprocs: how many processes the command will start (for the default above).
        watch: optional callable polled while the command runs (e.g. a
            :class:`exercise_utils.heartbeat.Watch`): ``"done"`` stops the command as finished
            (its results are in; slow exits are not waited for), ``("hang", report)`` stops it
            as hung, ``("limit", line)`` stops it as over a limit (LaunchLimit). With a
            watch, ``timeout`` is only a backstop for code that keeps running.
        sandboxed: ``cmd`` puts what it starts in sandboxes itself (a judge's launcher that
            must stay outside one: the checks' ranks on the hosts of a mesh); otherwise, at
            grading, ``cmd`` runs in one (:func:`exercise_utils.sandbox.wrap`).
        writable: at grading, the folders the sandbox may change (a check's launch names its
            own folder; None: the current folder and the private temporary folder, for a
            notebook's own launches: :func:`exercise_utils.sandbox.wrap`).
        output_limit: bytes of output after which the launch is stopped (LaunchOutput);
            None: no limit (the checks' launches at grading pass the grader's: :mod:`.limits`).
    Returns:
        RunResult on exit code 0 (or when ``watch`` said "done": ``returncode`` 0).
    Raises:
        LaunchHang: ``watch`` saw no progress; all processes killed.
        LaunchTimeout: it ran longer than ``timeout``; all processes killed.
        LaunchOutput: it printed more than ``output_limit`` bytes; all processes killed.
        LaunchError: non-zero exit code; all remaining processes killed.
        KeyboardInterrupt: after killing every process, when interrupted.
    """
    cmd = [str(c) for c in cmd]
    what = what or f"`{_describe(cmd)}`"
    tag = f"{os.getpid()}:{uuid.uuid4().hex}"    # owner pid first: see tests/conftest.py
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()), **(env or {}), TAG: tag}
    threads = threads_per_process or core_share(nprocs)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if threads_per_process or var not in os.environ:
            full_env[var] = str(threads)
    if echo and progress.live() == "kernel":      # in Jupyter: the box says what failed,
        echo = display.Tracebacks(None if echo is True else echo)
        progress.top()                            # above the launch's lines
    bars = progress.Bars() if echo and progress.Bars.wanted() else None
    if bars is not None:
        full_env["DTFS_MARKS"] = "1"                  # the ranks' progress for the bar
    lines, partial, counted = [], [""], [0]
    start = time.monotonic()
    group = _launch_cgroup(nprocs) if writable is not None and not sandboxed else None

    def start_child():
        die_with_parent()
        if group is not None:
            group.join()
    try:
        proc = subprocess.Popen(cmd if sandboxed else sandbox.wrap(cmd, cwd, writable=writable),
                                stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, cwd=cwd, env=full_env,
                                start_new_session=True, preexec_fn=start_child)
    except BaseException:
        if group is not None:
            group.close()
        raise
    seen = {proc.pid: psutil.Process(proc.pid)}
    status = "interrupted"
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        open_ = True
        while proc.poll() is None:
            if time.monotonic() - start > timeout:
                status = "timeout"
                break
            verdict = watch() if watch else None
            if verdict is not None:
                status = "early" if verdict == "done" else verdict
                break
            open_ = (_pump(proc, sel, lines, echo, partial, 0.2, bars, counted) if open_
                     else (time.sleep(0.2) or False))
            if output_limit and counted[0] > output_limit:
                status = "output"
                break
            remember_children(seen)
        else:
            end = time.monotonic() + 1.0
            while open_ and time.monotonic() < end:
                open_ = _pump(proc, sel, lines, echo, partial, 0.1, bars)
            status = "done"
    finally:
        if bars is not None:
            bars.close()
        killed = cleanup(proc, tag, seen)
        if group is not None:
            stopped = group.events()
            group.close()
            name = next((n for n in ("memory", "processes") if stopped[n]), None)
            if name is not None and status != "interrupted":
                from . import limits
                found = limits.current()
                status = ("limit", limits.verdict(None, name, found[name], together=nprocs))
        if partial[0]:
            lines.append(partial[0])
            if echo and (echo is True or echo(partial[0])):
                print(partial[0], flush=True)
        proc.stdout.close()
        if status == "interrupted":
            print(f"Interrupted: stopped {what} and killed {len(killed)} process(es).",
                  file=sys.stderr, flush=True)
    seconds = time.monotonic() - start
    output = "\n".join(lines)
    note = getattr(echo, "note", lambda: None)()
    if note:
        print(note, flush=True)
    if status == "timeout":
        why = (" although it kept making progress (an endless loop?)" if watch else
               f". {HANG_HINT}")
        raise LaunchTimeout(
            f"{what} did not finish within {timeout:g} s, so it was stopped and its "
            f"{len(killed)} process(es) were killed{why}\n--- last output ---\n"
            f"{tail(lines)}", cmd, None, output)
    if status == "output":
        from .limits import size, verdict
        raise LaunchOutput(
            f"{what} printed more than {size(output_limit)} of output, so it was stopped and "
            f"its {len(killed)} process(es) were killed.\n--- last output ---\n"
            f"{tail(lines)[-2000:]}", cmd, output, output_limit,
            verdict(None, "output", output_limit))
    if isinstance(status, tuple) and status[0] == "limit":
        raise LaunchLimit(f"{what}: {status[1]}", cmd, output, status[1])
    if isinstance(status, tuple):
        raise LaunchHang(f"{what} stopped making progress after {seconds:.0f} s, so it was "
                         f"stopped and its {len(killed)} process(es) were killed.\n"
                         f"--- last output ---\n{tail(lines)}", cmd, output, status[1])
    if status == "early":
        return RunResult(cmd, 0, output, seconds, killed)
    if proc.returncode != 0:
        raise LaunchError(
            f"{what} failed with exit code {proc.returncode} after {seconds:.1f} s"
            f"{signal_name(proc.returncode)}; its remaining processes were killed.\n"
            f"--- last output ---\n{tail(lines)}", cmd, proc.returncode, output)
    return RunResult(cmd, proc.returncode, output, seconds, killed)


def _launch_cgroup(nprocs):
    """At grading, as root: a cgroup for one check's launch that the ranks share (notebook
    05's torchrun jobs; the checks' launches where no hosts can be made), bounding their
    memory and processes together at ``nprocs`` times the limits per rank, and 1 GiB and
    64 more for what the launch itself runs (:mod:`.limits`); else None."""
    if sandbox.policy() is None:
        return None
    from . import limits
    found = limits.current()
    group = limits.Cgroup.make("launch") if found else None
    if group is not None:
        group.set(memory=nprocs * int(found["memory"]) + (1 << 30),
                  processes=nprocs * int(found["processes"]) + 64)
    return group


def python(script, args=(), **kwargs):
    """Run ``python script args...`` with this interpreter. See :func:`run` for kwargs."""
    return run([sys.executable, script, *args], **kwargs)


def mpiexec(script, n, args=(), module=False, label=True, **kwargs):
    """Run ``mpiexec -n N python script args...`` (or ``python -m module``).

    Args:
        script: path of the Python file (or module name when ``module=True``).
        n: number of MPI processes.
        args: extra arguments for the script.
        label: prefix every output line with its rank, e.g. ``[1] loss 0.3``.
        kwargs: passed to :func:`run` (timeout, env, echo, ...).
    Returns:
        RunResult.
    """
    if int(n) < 1:
        raise ValueError(f"mpiexec needs at least 1 process, got n={n}")
    cmd = [find_executable("mpiexec"), "-n", str(n)]
    if label:
        cmd.append("-l")
    cmd += [sys.executable, "-m", "exercise_utils.linebuf", *(["-m"] if module else []), script,
            *args]
    kwargs.setdefault("what", f"`mpiexec -n {n} python {'-m ' if module else ''}{script}`")
    kwargs["env"] = {"PYTHONUNBUFFERED": "", **(kwargs.get("env") or {})}
    return run(cmd, nprocs=int(n), **kwargs)


def torchrun(script, nproc, args=(), nnodes=1, port=None, extra=(), fork=True, **kwargs):
    """Run ``torchrun --nproc-per-node N script args...`` on a fresh free port.

    On one node the agent and its workers are forked from one process that imported torch
    once (:mod:`exercise_utils.zygote`, started for this job, inside its sandbox at grading):
    each worker runs ``script`` as ``python -u`` would (but that each line of its output goes
    out whole: :func:`.forking.whole_lines`), with the environment torchrun gives it, and its
    exit status (a signal too) reaches the agent as a fresh worker's would.
    Importing torch in the agent and in every worker cost ~2 s of CPU each, most of a short
    job's time on 2 cores.

    Args:
        script: the training script (a module with ``extra=["-m"]``).
        nproc: workers on this node.
        nnodes: number of nodes (agents); for more than one, start each agent yourself.
        port: rendezvous port (default: a free one).
        extra: more torchrun options, e.g. ``["--max-restarts", "2"]``.
        fork: False: the agent and every worker a fresh interpreter of their own (what a
            job whose workers measure their own memory needs).
        kwargs: passed to :func:`run`.
    Returns:
        RunResult.
    """
    port = port or free_port()
    kwargs["env"] = {**FRESH_STORE_ENV, **(kwargs.get("env") or {})}
    options = [f"--nproc-per-node={nproc}", f"--nnodes={nnodes}", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{port}"]
    extra = [str(e) for e in extra]
    if fork and nnodes == 1 and "--no-python" not in extra:
        module = "-m" in extra or "--module" in extra
        cmd = forked([*options, *(e for e in extra if e not in ("-m", "--module"))], module,
                     script, args)
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", *options, *extra, str(script),
               *map(str, args)]
    kwargs.setdefault("what", f"`torchrun --nproc-per-node {nproc} {script}`")
    if kwargs.get("echo", True) is True:
        kwargs["echo"] = AgentReport()
    return run(cmd, nprocs=int(nproc), **kwargs)
