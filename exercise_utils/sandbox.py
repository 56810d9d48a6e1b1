"""Run a command whose processes execute student code inside a bubblewrap sandbox.

The sandbox (Debian package ``bubblewrap``, the ``bwrap`` command) sees the machine's file
system read-only; ``/tmp`` and ``/dev/shm`` are private to it (empty, writable, gone when it
ends); the folders named ``writable`` are the only places it can change outside them; the
folders and files named ``hidden`` read as empty (a folder) or as ``/dev/null`` (a file): the
course's ``solutions/``, ``tests/`` and gradebook, other students' submissions. Without
``network`` it has a network namespace of its own, holding only a loopback interface: the
processes of one sandbox (the ranks of one launch) reach each other over ``127.0.0.1`` and
nothing else. Process ids are the machine's (no pid namespace): the launcher's cleanup and the
checks' heartbeats see every process as they do outside.

    cmd = sandbox.command(["python", "-m", "exercise_utils.rankworker", ...],
                          writable=[check_dir], hidden=[repo / "solutions", repo / "tests"])

:func:`unavailable` says why a sandbox cannot run here (no ``bwrap``, or a kernel that refuses
its namespaces: a laptop without user namespaces, a container), or None.

Used by the course's grading (``make autograde``) and ``tests/test_sandbox.py``.
"""
import functools
import os
import shutil
import subprocess
from pathlib import Path

INSTALL = ("install it: sudo apt-get install bubblewrap (Debian, Ubuntu), or your system's "
           "package of the same name")


class SandboxUnavailable(RuntimeError):
    """No sandbox can run on this machine (the message says why and what to do)."""


@functools.lru_cache(maxsize=None)
def unavailable():
    """Why no sandbox can run here, or None when one can (tried once per process)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return f"the bwrap command (bubblewrap) is not installed: {INSTALL}"
    probe = subprocess.run(command(["true"], cwd="/"), capture_output=True, text=True,
                           timeout=60)
    if probe.returncode != 0:
        return (f"bwrap cannot create its namespaces here ({probe.stderr.strip()[:200]}): run "
                "as root, or enable unprivileged user namespaces "
                "(sysctl kernel.unprivileged_userns_clone=1)")
    return None


def require():
    """Raise :class:`SandboxUnavailable` unless a sandbox can run here."""
    reason = unavailable()
    if reason:
        raise SandboxUnavailable(reason)


def command(cmd, writable=(), hidden=(), readable=(), network=False, cwd=None):
    """``cmd`` wrapped in ``bwrap`` (see the module docstring).

    Args:
        cmd: the program and its arguments.
        writable: folders the sandbox may change (bound read-write at the same path; created
            if missing), e.g. the check's report folder.
        hidden: folders and files it must not read (an empty folder, ``/dev/null``); a path
            that does not exist is ignored.
        readable: paths under ``/tmp`` or ``/dev/shm`` it may read (elsewhere everything not
            hidden is readable already), e.g. a student's file in a temporary folder.
        network: keep the machine's network (the course's namespace hosts give each rank an
            address of its own); by default only a private loopback.
        cwd: the working directory inside (default: the current one; under ``/tmp`` it
            must be one of ``readable`` or ``writable``, which the sandbox sees there).
    Returns:
        list: the full command line.
    """
    args = ["bwrap", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev",
            "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/dev/shm"]
    for path in readable:
        path = Path(path).resolve()
        args += ["--ro-bind", str(path), str(path)]
    for path in hidden:
        path = Path(path).resolve()
        if path.is_dir():
            args += ["--tmpfs", str(path)]
        elif path.exists():
            args += ["--dev-bind", "/dev/null", str(path)]    # (reads as empty)
    for path in writable:
        path = Path(path).resolve()
        path.mkdir(parents=True, exist_ok=True)
        args += ["--bind", str(path), str(path)]
    if not network:
        args.append("--unshare-net")
    args += ["--chdir", str(Path(cwd or os.getcwd()).resolve()), "--"]
    return args + [str(c) for c in cmd]
