"""Find and stop every process a launch started: the launcher's guarantee that nothing is left.

Every process :mod:`exercise_utils.launch` starts carries a tag in its environment
(``DTFS_LAUNCH_TAG=<launcher pid>:<id>``), inherited by everything it starts in turn, also by
workers that ``mpiexec`` or ``torchrun`` put in new sessions. :func:`cleanup` kills a launch's
process group, every child seen while it ran and every process still carrying its tag;
:func:`tagged_processes` finds them (``tests/conftest.py`` fails a test that leaves one alive).

Used by :mod:`exercise_utils.launch` and :mod:`exercise_utils.launch_many` (every notebook).
"""
import os
import signal
import subprocess
import sys
import time

import psutil

TAG = "DTFS_LAUNCH_TAG"


def tagged_processes(tag):
    """Return every live process whose environment carries ``DTFS_LAUNCH_TAG=tag``.

    ``tag`` may also be a predicate called with each process's tag value.
    """
    match = tag if callable(tag) else tag.__eq__
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            value = proc.environ().get(TAG)
            if (proc.pid != os.getpid() and value and match(value)
                    and proc.status() != psutil.STATUS_ZOMBIE):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def inner_pid(proc):
    """The pid ``proc`` (a psutil process) has in its own pid namespace: the one it sees
    itself (``os.getpid()`` there; a sandbox's ranks have a pid namespace of their own); its
    pid where it has none, or None where it is gone."""
    try:
        with open(f"/proc/{proc.pid}/status") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return proc.pid


def kill_processes(procs, grace=1.0):
    """Terminate, then kill, the given psutil processes and wait for them.

    Returns:
        list[int]: the pids that were still alive and had to be stopped.
    """
    alive = [p for p in procs if _is_alive(p)]
    for p in alive:
        _signal(p, signal.SIGTERM)
    still = _wait_dead(alive, grace)
    for p in still:
        _signal(p, signal.SIGKILL)
    _wait_dead(still, grace)
    return [p.pid for p in alive]


def _wait_dead(procs, timeout):
    """Wait until none of ``procs`` runs or ``timeout`` has passed; return those still running.

    A zombie has stopped: psutil.wait_procs waits on until its parent reaps it, which for a
    sandbox's init (pid 1 of its namespace, a child of the outer bwrap, orphaned when that
    one goes first) took about a second at every sandboxed launch."""
    end = time.monotonic() + timeout
    while True:
        still = [p for p in procs if _is_alive(p)]
        if not still or time.monotonic() >= end:
            for p in procs:
                if p not in still:
                    _reap(p)
            return still
        time.sleep(0.01)


def _reap(p):
    """Collect ``p``'s exit status if it is this process's own child (no zombie left)."""
    try:
        if p.ppid() == os.getpid():
            os.waitpid(p.pid, os.WNOHANG)
    except (psutil.Error, ChildProcessError, OSError):
        pass


def _is_alive(p):
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal(p, sig):
    try:
        p.send_signal(sig)
    except psutil.Error:
        pass


def die_with_parent():
    """In the child: ask Linux for SIGTERM when the launching process dies (even by SIGKILL,
    e.g. a notebook kernel restart), so mpiexec / torchrun stop their workers too."""
    prctl(1, signal.SIGTERM)      # PR_SET_PDEATHSIG


def prctl(option, value):
    """Linux's ``prctl(option, value)`` for this process (elsewhere nothing): used for
    :func:`die_with_parent` and :func:`exercise_utils.sandbox.harden`."""
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def remember_children(seen):
    """Add to ``seen`` (``{pid: psutil.Process}``) every descendant of its processes, from one
    look at the process table: a launcher calls this five times a second, and a scan of
    /proc per remembered process (``Process.children``, each reads every process's parent)
    cost about 0.2 CPU-s per launch with a few hundred processes on the machine."""
    by_parent = {}
    for pid, ppid in _parents().items():
        by_parent.setdefault(ppid, []).append(pid)
    todo = list(seen)
    while todo:
        for pid in by_parent.get(todo.pop(), ()):
            if pid not in seen:
                try:
                    seen[pid] = psutil.Process(pid)
                except psutil.Error:        # (it just ended)
                    continue
                todo.append(pid)


def _parents():
    """``{pid: parent pid}`` of every process: psutil's own map (what ``Process.children``
    reads; psutil is pinned in constraints.txt), else built from ``process_iter``."""
    ppid_map = getattr(psutil, "_ppid_map", None)
    if ppid_map is not None:
        return ppid_map()
    return {p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid"])}


def cleanup(proc, tag, seen):
    """Kill the launched process group, every remembered child and every tagged process."""
    remember_children(seen)
    if proc.poll() is None:      # not reaped: its pid, and so its group's id, is still its own
        try:                     # (once reaped, pid_max 32768 recycles it within minutes)
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    victims = {p.pid: p for p in list(seen.values()) + tagged_processes(tag)}
    killed = kill_processes(list(victims.values()))
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    # A process may have forked while we were killing: one more sweep.
    killed += kill_processes(tagged_processes(tag))
    return sorted(set(killed))
