"""Run a command whose processes execute student code inside a bubblewrap sandbox.

The sandbox (Debian package ``bubblewrap``, the ``bwrap`` command) sees the machine's file
system read-only; ``/tmp`` and ``/dev/shm`` are private to it (empty, writable, gone when it
ends); the folders named ``writable`` are the only places it can change outside them; the
folders and files named ``hidden`` read as empty (a folder) or as ``/dev/null`` (a file): the
course's ``solutions/``, ``tests/`` and gradebook, other students' submissions. Without
``network`` it has a network namespace of its own, holding only a loopback interface: the
processes of one sandbox (the ranks of one launch) reach each other over ``127.0.0.1`` and
nothing else. It has a pid namespace of its own: it sees and can signal only its own processes
(without it, root inside could stop or kill the judge's kernel or another submission's ranks,
same uid as they are). The launcher still sees every process inside, under its own pids: its
cleanup finds them by their tag (:mod:`.processes`), the checks' watch tells a live rank by
the lock its beat holds (:mod:`.heartbeat`), and the checks' session finds its zygote by the
pid the zygote has inside (:func:`.processes.inner_pid`).

    cmd = sandbox.command(["python", "-m", "exercise_utils.rankworker", ...],
                          writable=[check_dir], hidden=[repo / "solutions", repo / "tests"])

:func:`unavailable` says why a sandbox cannot run here (no ``bwrap``, or a kernel that refuses
its namespaces: a laptop without user namespaces, a container), or None.

At grading, ``scripts/course.py`` puts a policy in the environment of nbgrader and so of
every grading kernel (:data:`POLICY`, see :func:`grading_policy`); then every command
:mod:`.launch` runs and the checks' zygote (:mod:`.harness`) run through :func:`wrap`, i.e. in a
sandbox, with the kernel's working directory (the submission's folder) and the kernel's own
private temporary folder (:func:`private_tmpdir`, made when ``exercise_utils`` is imported)
writable, and the policy's folders hidden. Inside, all capabilities are dropped: root there
cannot remount what is hidden, nor read the memory, environment or ``/proc/PID/root`` of any
process outside (the judge's kernel, nbgrader). Without a policy, :func:`wrap` changes nothing
(students' own machines).

Used by the course's grading (``make autograde``) and ``tests/test_sandbox.py``.
"""
import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

POLICY = "DTFS_SANDBOX"          # the grader's policy (JSON): run launches in a sandbox
WEAKEN = "DTFS_TEST_WEAKEN"      # tests only: defences switched off, to prove each one matters
INSIDE = "DTFS_SANDBOXED"         # set inside a sandbox: launches there are not wrapped again
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
    for _ in range(3):      # (a set-up that failed once may be a passing race: a mount gone)
        probe = subprocess.run(command(["true"], cwd="/"), capture_output=True, text=True,
                               timeout=60)
        if probe.returncode == 0:
            break
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


def own_install():
    """The course's checkout, this interpreter's environment and the folders of ``PYTHONPATH``
    (the grader's: a student's process cannot set it) where they lie under ``/tmp`` or
    ``/dev/shm`` (a clone there, its ``.venv``, a test's helper modules), which the sandbox's
    own empty folders would otherwise hide: ``bwrap: execvp .../python: No such file or
    directory``."""
    places = {Path(__file__).resolve().parents[1], Path(sys.prefix).resolve(),
              Path(sys.base_prefix).resolve(), Path(sys.executable).resolve().parent}
    places |= {Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
               if p and os.path.isdir(p)}
    private = (Path("/tmp"), Path("/dev/shm"))
    return sorted(p for p in places if any(p != q and q in p.parents for q in private))


SKIPPED = ("proc", "dev", "tmp")       # the sandbox's own (see :func:`command`)
NAMESPACES = ("netns", "dtfs-uts")    # under /run: other launches' network and UTS namespaces


def _machine():
    """bwrap's arguments that show the machine's file system read-only: each entry of ``/``
    bound on its own, and ``/run`` entry by entry but for :data:`NAMESPACES`. Binding ``/``
    whole binds every mount under it, among them ``/run/netns/*`` and ``/run/dtfs-uts/*``,
    which clusters of other launches running beside this one mount and unmount at any moment:
    bwrap then fails to set up (CI: ``bwrap: Can't bind mount /oldroot/ on /newroot/: Unable to
    apply mount flags: remount "/newroot/run/dtfs-uts/dtfs-...-h0": Invalid argument``). The
    ranks never need them: a cluster's ranks enter their host's namespaces before bwrap
    starts."""
    args = []
    for top, skipped in (("/", SKIPPED), ("/run", NAMESPACES)):
        if not os.path.isdir(top):
            continue
        for name in sorted(os.listdir(top)):
            path = os.path.join(top, name)
            if name in skipped or (top == "/" and name == "run"):
                continue
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.lexists(path):
                args += ["--ro-bind-try", path, path]
    return args


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
    from .limits import current
    found = current() or {}           # at grading: the sizes of its /tmp and /dev/shm

    def sized(name):
        return ["--size", str(int(found[name]))] if name in found else []
    args = ["bwrap", "--die-with-parent", "--cap-drop", "ALL", "--unshare-pid",
            "--setenv", INSIDE, "1", *_machine(), "--dev", "/dev", "--proc", "/proc",
            *sized("tmp"), "--tmpfs", "/tmp",
            *sized("shm"), "--tmpfs", "/dev/shm"]
    for path in [*own_install(), *readable]:
        path = Path(path).resolve()
        args += ["--ro-bind", str(path), str(path)]
    for path in hidden:
        path = Path(path).resolve()
        if path.is_dir():
            args += ["--size", "4096", "--tmpfs", str(path)]
        elif path.exists():
            args += ["--dev-bind", "/dev/null", str(path)]    # (reads as empty)
    for path in writable:
        path = Path(path).resolve()
        path.mkdir(parents=True, exist_ok=True)
        args += ["--bind", str(path), str(path)]
    args += ["--remount-ro", "/"]             # bwrap's own root, which holds the binds
    if not network:
        args.append("--unshare-net")
    args += ["--chdir", str(Path(cwd or os.getcwd()).resolve()), "--"]
    return args + [str(c) for c in cmd]


def grading_hidden(course, solutions=None):
    """What a sandbox hides at grading: the repository's ``solutions/``, ``tests/`` and
    ``.git``, the given ``solutions`` folder, the course folder (gradebook, sources, every
    submission: the kernel binds its own submission folder back), Jupyter's runtime folder
    (kernel connection files) and the judge's modules (:func:`.sides.judge_files`)."""
    from jupyter_core.paths import jupyter_runtime_dir
    from .sides import judge_files
    repo = Path(__file__).resolve().parents[1]
    extra = [Path(solutions)] if solutions else []
    return [repo / "solutions", repo / "tests", repo / ".git", *extra, Path(course),
            Path(jupyter_runtime_dir()), *judge_files()]


def grading_policy(hidden, limits=None):
    """The environment variable that makes :func:`wrap` sandbox every launch (JSON: the
    folders and files to hide, and the limits every rank runs within: :mod:`.limits`, its
    defaults unless ``limits`` gives others), as ``{POLICY: text}``."""
    from . import limits as lim
    return {POLICY: json.dumps({"hidden": [str(Path(p).resolve()) for p in hidden],
                                lim.KEY: lim.resolved(limits)})}


def policy():
    """The grader's policy (a dict) in force for this process's launches, or None: none was
    set, or this process runs inside a sandbox already."""
    text = os.environ.get(POLICY)
    if not text or os.environ.get(INSIDE):
        return None
    return json.loads(text)


def private_tmpdir():
    """Under a policy, make this process's temporary folder a fresh one of its own (removed
    at exit), once: the sandboxes of its launches get it writable (check folders, sockets,
    reports) and nothing else of the machine's ``/tmp``. Returns the folder, or None."""
    if policy() is None:
        return None
    import tempfile
    if os.environ.get("DTFS_SANDBOX_TMP") == tempfile.gettempdir():
        return tempfile.gettempdir()
    # (in the grading job's own folder where it has one: removed when the job ends, even
    # if this process is killed before its exit)
    where = os.environ.get("DTFS_GRADE_TMP")
    folder = tempfile.mkdtemp(prefix="dtfs-grade-", dir=where if where and os.path.isdir(where)
                              else "/tmp")
    os.environ["TMPDIR"] = os.environ["DTFS_SANDBOX_TMP"] = tempfile.tempdir = folder
    atexit.register(shutil.rmtree, folder, True)
    return folder


def wrap(cmd, cwd=None, network=False, writable=None):
    """``cmd`` as it must run here: in a sandbox under the grader's policy (hidden: the
    policy's paths), else unchanged. Raises :class:`SandboxUnavailable` if a policy is set
    and no sandbox can run.

    Args:
        cwd: the working directory inside (default: the first ``writable`` folder).
        network: keep the network ``cmd`` starts in (a host of the course's cluster).
        writable: the folders it may change. The checks always name theirs (a launch's own
            folder: never the grading kernel's working directory nor its temporary folder,
            where the judge's code and files are). None: a launch of a notebook's own cell
            (a demo, run at grading only with ``--whole-notebook``, which runs every cell in
            the kernel anyway): the current folder and the private temporary folder.
    """
    rules = policy()
    if rules is None:
        return [str(c) for c in cmd]
    require()
    if writable is None:
        here = os.getcwd()
        writable, cwd = [here, private_tmpdir()], cwd or here
    else:
        writable = [str(w) for w in writable]
        cwd = cwd or (writable[0] if writable else "/")
    return command(cmd, writable=writable, hidden=rules["hidden"], cwd=cwd, network=network)


def weakened(defence):
    """Whether the tests switched ``defence`` off (``DTFS_TEST_WEAKEN``, comma-separated): a
    cheat must then pass where, with the defence on, it fails. ``kernel-folder``: the checks'
    ranks may write the grading kernel's working directory (the submission's folder);
    ``safe-path``: the grading kernels import from it (``scripts/course.py``); ``strays``:
    a process a rank leaves running after its launch (a daemon) is killed, not reported."""
    return defence in os.environ.get(WEAKEN, "").split(",")


def harden():
    """Inside a sandbox, make this process and what it forks non-dumpable: with no
    capability, no other sandboxed process (another submission's ranks, graded at the same
    time with ``JOBS``) can then read its memory, environment or ``/proc`` entries. Called by
    the ranks' zygote and worker; elsewhere it does nothing."""
    if os.environ.get(INSIDE):
        from .processes import prctl
        prctl(4, 0)       # PR_SET_DUMPABLE, 0
