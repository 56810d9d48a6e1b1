"""MPI ranks forked from one process that imported torch once.

Every rank of an ``mpiexec`` launch is a fresh Python that imports torch: ~2 s of CPU each, most
of what an MPI check costs on 2 cores. Here ``mpiexec`` starts a *stub* per rank instead (a
bare Python, no torch), and each stub hands its identity to the *zygote*, a process that
imported torch, numpy, mpi4py (not initialised) and the probe's module before any rank
existed: the stub sends its environment (MPI's PMI variables), working directory, arguments
and its file descriptors (stdout, stderr, MPI's PMI socket) over a Unix socket; the zygote
forks a child that takes them over, initialises MPI and runs the rank; its exit status goes
back to the stub, which exits with it. For ``mpiexec`` the stub *is* the rank: its output is
the rank's, its exit code too; MPI_Abort in a rank kills every stub, and the zygote kills the
child of every stub that is gone.

One launch is one tree: the zygote starts ``mpiexec`` as its own child, so the launcher's
cleanup (by process tag, :mod:`exercise_utils.processes`) reaches the zygote, ``mpiexec``, the
stubs and the forked ranks alike. Usage (the harness does this)::

    python -m exercise_utils.zygote --socket S [--preload MODULE ...] -- \\
        mpiexec -n 2 python -m exercise_utils.zygote --stub S -- ARGS...

where ``ARGS`` are :mod:`exercise_utils.rankworker`'s.

Used by :mod:`exercise_utils.harness` (the MPI checks of 01_mpi_parallel_sgd and
06_build_your_own_ddp).
"""
import argparse
import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
from pathlib import Path

from .forking import exit_flushed, freeze_for_fork, fresh_random_state, whole_lines

FDS = 8                 # at most this many descriptors travel with a request
KEEP = ("DTFS_SANDBOXED",)  # the zygote's own environment a rank keeps (the sandbox's mark)
SOCKET_ENV = "DTFS_ZYGOTE_SOCKET"   # where ``--socket auto`` listens, for ``--stub auto``
                                    # (``@name``: Linux's abstract socket namespace)
LOST = 75               # a stub's exit status when the zygote closed its connection without
                        # the rank's (it died): the launcher may run the launch again without it


# ---------------------------------------------------------------- the stub (one per MPI rank)
def stub(path, args, preload=(), mpi=True, module=None, script=None):
    """Hand this process's rank (or, without ``mpi``, its ``rankworker --spawn`` launch) to
    the zygote at ``path``, which imports ``preload`` first if it has not yet; exit with the
    child's status; with ``module``, the child runs that module's ``main()`` with ``args`` as
    its command line (e.g. notebook 05's torchrun agent) instead of a rank. ``path`` may be a
    folder of host sockets (the checks' hosts, :mod:`exercise_utils.hosts`): then the zygote
    is the one of this host, ``<path>/<hostname>.sock``, and ``{host}`` in ``args`` reads as
    the hostname."""
    if path == "auto":          # the zygote that started this job's command named it
        path = os.environ[SOCKET_ENV]
        if path.startswith("@"):                # the abstract namespace
            path = f"\0{path[1:]}"
    fds = [0, 1, 2]
    pmi = os.environ.get("PMI_FD")
    if pmi is not None:
        fds.append(int(pmi))
    cwd = None
    if os.path.isdir(path):
        host = socket.gethostname()
        path = os.path.join(path, f"{host}.sock")
        args = [a.replace("{host}", host) for a in args]
        cwd = args[args.index("--out") + 1] if "--out" in args else "/"
    try:
        conn = request(path, args, dict(os.environ), fds, preload, mpi, cwd, module, script)
    except OSError as exc:
        os.write(2, f"zygote stub {os.getpid()}: the zygote at {path} cannot be reached "
                    f"({exc})\n".encode())
        os._exit(LOST)
    status = b""
    while True:
        chunk = conn.recv(64)
        if not chunk:
            break
        status += chunk
    if not status:          # say so: an exit status with no output cannot be diagnosed
        os.write(2, f"zygote stub {os.getpid()}: the zygote at {path} closed the connection "
                    f"without the rank's exit status (it exited, or took this stub for "
                    f"gone)\n".encode())
    code = int(status) if status else LOST
    if code < 0:                # (a --no-hold zygote's child killed by a signal): die of it too
        try:
            signal.signal(-code, signal.SIG_DFL)
        except (OSError, ValueError):       # SIGKILL and SIGSTOP: always their default
            pass
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


def request(path, args, env, fds=(0, 1, 2), preload=(), mpi=False, cwd=None, module=None,
            script=None):
    """Ask the zygote at ``path`` for a rank: ``args`` (:mod:`exercise_utils.rankworker`'s),
    its environment ``env``, these descriptors of this process as its own (0, 1, 2 and MPI's
    PMI socket), its working directory ``cwd`` (default: this process's). Returns the
    connection: it carries the rank's exit status when it ends, and closing it kills the
    rank."""
    body = json.dumps({"env": env, "cwd": cwd or os.getcwd(), "args": list(args),
                       "fds": list(fds), "preload": list(preload), "mpi": mpi,
                       "module": module, "script": script}).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    socket.send_fds(conn, [len(body).to_bytes(8, "big")], list(fds))
    conn.sendall(body)
    return conn


# ---------------------------------------------------------------- the zygote
def serve(path, command, preload, listen_fd=None, hold=True):
    """Import ``preload``, listen at ``path``, run ``command`` (mpiexec) and fork a rank for
    every stub that connects; return mpiexec's exit status once it and every rank are done.
    Without a ``command``, serve until killed or until the process that started it is gone
    (a check's session: :func:`exercise_utils.harness.session`). With ``listen_fd`` (a host's
    zygote, :mod:`exercise_utils.hosts`) the listening socket is that inherited descriptor,
    bound by the judge at a path no sandbox sees: no rank can take its place. Without
    ``hold`` (a torchrun job, :func:`exercise_utils.launch.torchrun`) each child's status goes
    to its stub as soon as it ends, a signal as a negative number the stub dies of."""
    if command or listen_fd is not None:
        try:
            import mpi4py
            mpi4py.rc.initialize = False    # each forked rank initialises MPI itself
            mpi4py.rc.finalize = False
        except ImportError:                 # (a torchrun job needs no MPI)
            pass
    for name in preload:
        importlib.import_module(name)
    if path == "auto":          # a name in the abstract namespace of this network namespace
        import secrets          # (a job's, a host's): nothing on disk that a SIGKILL at the
        name = f"dtfs-zygote-{os.getpid()}-{secrets.token_hex(8)}"   # end could leave behind
        os.environ[SOCKET_ENV] = f"@{name}"     # (an environment holds no NUL: @ stands for it)
        path = f"\0{name}"
    if listen_fd is not None:
        listener = socket.socket(fileno=listen_fd)
    else:
        if not command:                      # a session: who to spare when it reaps ranks
            Path(f"{path}.pid").write_text(str(os.getpid()))
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    children = {}                            # stub connection -> forked rank's pid
    held = {}                                # stub connection -> its rank's exit status
    mpiexec = subprocess.Popen(command) if command else None
    owner = os.getppid()
    log = _log if mpiexec is None else (lambda text: None)   # (mpiexec's output: the ranks')
    try:
        while (mpiexec.poll() is None or children) if mpiexec else os.getppid() == owner:
            for key, _ in sel.select(timeout=0.05):
                if key.fileobj is listener:
                    conn, _ = listener.accept()
                    children[conn] = _fork_rank(conn, listener, children)
                    sel.register(conn, selectors.EVENT_READ)
                else:                        # a stub spoke or went away: it was killed
                    reaped = held.pop(key.fileobj, None) is not None
                    pid = children.pop(key.fileobj, None)
                    if not reaped:           # (a reaped rank's pid may be another's by now)
                        log(f"the stub of rank process {pid} went away: killing it")
                        _kill(pid)
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
            for conn, pid in list(children.items()):
                if conn not in held:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        code = os.waitstatus_to_exitcode(status)
                        held[conn] = code if code >= 0 or not hold else 128 - code
            # A failed rank's status goes out at once (mpiexec then stops the job); under
            # mpiexec the others wait until every rank is done: a stub that exits first
            # makes mpiexec kill the other stubs, and with them ranks still reporting.
            ready = [c for c, code in held.items()
                     if code or not mpiexec or not hold or len(held) == len(children)]
            for conn in ready:
                try:
                    conn.sendall(str(held.pop(conn)).encode())
                except OSError:
                    pass
                del children[conn]
                sel.unregister(conn)
                conn.close()
        if not mpiexec:
            log(f"the process that started it ({owner}) is gone: stopping")
    except BaseException as exc:
        log(f"stopping on {type(exc).__name__}: {exc}")
        raise
    finally:
        for conn, pid in children.items():
            if conn not in held:             # not reaped yet: the pid is still this rank's
                _kill(pid)
        if mpiexec and mpiexec.poll() is None:
            mpiexec.kill()
        listener.close()
    return mpiexec.wait() if mpiexec else 0


def _fork_rank(conn, listener, children):
    size_msg, fds, _, _ = socket.recv_fds(conn, 8, FDS)
    size = int.from_bytes(size_msg, "big")
    raw = b""
    while len(raw) < size:
        raw += conn.recv(size - len(raw))
    request = json.loads(raw)
    for name in request["preload"]:          # once, here: every later child has it
        try:
            importlib.import_module(name)
        except Exception:    # noqa: BLE001 - the rank imports it again and reports the error
            pass
    freeze_for_fork()
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        return pid
    code = 1
    try:                                     # the rank: take over the stub's identity
        os.setsid()
        listener.close()
        for other in children:
            other.close()
        conn.close()
        import fcntl
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]   # out of the targets' way
        for fd in fds:
            os.close(fd)
        for fd, target in zip(high, request["fds"]):
            os.dup2(fd, target)
            os.close(fd)
        kept = {k: os.environ[k] for k in KEEP if k in os.environ}
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ.update(kept)              # (a sandbox's own marks: not the stub's to set)
        # what a fresh interpreter would put first on sys.path from this environment (a
        # zygote that outlives launches may have started under another PYTHONPATH)
        sys.path[0:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                         if p and p not in sys.path]
        os.chdir(request["cwd"])
        fresh_random_state()
        if request.get("script"):            # as python -u, but each line goes out whole
            sys.stdout, sys.stderr = (whole_lines(fd) for fd in (1, 2))
            code = _run_script(request["script"], request["args"])
        else:
            sys.stdout = os.fdopen(1, "w", buffering=1)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            code = (_run_module(request["module"], request["args"]) if request.get("module")
                    else _run_rank(request["args"], request["mpi"]))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - print it and abort the job
        import traceback
        traceback.print_exc()
        if request.get("mpi"):
            _abort()
    finally:
        exit_flushed(code)


def _run_module(name, args):
    """What ``python -m name args`` does for a judge's module with a ``main()`` (e.g.
    notebook 05's agent), in this forked child that has its imports already: its status."""
    sys.argv = [name, *args]
    try:
        code = importlib.import_module(name).main()
    except SystemExit as exc:
        code = exc.code
    return code if isinstance(code, int) else (0 if code is None else 1)


def _run_script(kind, args):
    """What ``python -u SCRIPT ARGS`` (``kind`` "path") or ``python -u -m MODULE ARGS``
    (``kind`` "module") does, in this forked child that has torch imported already: the
    script's folder (the working directory for a module) first on ``sys.path`` unless
    ``PYTHONSAFEPATH`` says not to, torch's threads from ``OMP_NUM_THREADS`` as a fresh
    interpreter reads it, ``atexit`` handlers run at the end. Returns the exit status."""
    import atexit
    import runpy
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    target, rest = args[0], list(args[1:])
    safe = bool(os.environ.get("PYTHONSAFEPATH"))
    code = 0
    try:
        if kind == "module":
            if not safe:
                sys.path.insert(0, os.getcwd())
            sys.argv = [target, *rest]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            if not safe:
                sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            sys.argv = [target, *rest]
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except BaseException as exc:  # noqa: BLE001 - shown as python shows it: sys.excepthook
        tb = exc.__traceback__      # (torch.distributed's prefixes "[rankN]:"), from the
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__):
            tb = tb.tb_next         # script's own frame on, not this module's or runpy's
        sys.excepthook(type(exc), exc, tb)
        code = 1
    finally:
        atexit._run_exitfuncs()
    return code


def _run_rank(args, mpi):
    from . import rankworker
    sys.argv = ["exercise_utils.rankworker", *args]
    if not mpi:
        try:
            rankworker.main()
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else 1
        return 0
    if "mpi4py.MPI" not in sys.modules:     # (a session's zygote: it never imports it)
        import mpi4py
        mpi4py.rc.initialize = mpi4py.rc.finalize = False
    from mpi4py import MPI
    MPI.Init()
    try:
        rankworker.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        if code:
            _abort(code)
        if not MPI.Is_finalized():
            MPI.Finalize()
        return code
    return 0


def _log(text):
    """One line on the zygote's stderr (the harness keeps a session zygote's, to say why it
    stopped if a launch lost it)."""
    try:
        os.write(2, f"zygote {os.getpid()}: {text}\n".encode())
    except OSError:
        pass


def _abort(code=1):
    from mpi4py import MPI
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.COMM_WORLD.Abort(code)


def _kill(pid):
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main():
    from .sandbox import harden
    harden()        # at grading: the ranks it forks stay unreadable to other sandboxes
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", help="serve stubs at this Unix socket")
    parser.add_argument("--stub", help="be a rank: hand over to the zygote at this socket")
    parser.add_argument("--preload", action="append", default=[])
    parser.add_argument("--spawn", action="store_true",
                        help="with --stub: a rankworker --spawn launch, not an MPI rank")
    parser.add_argument("--module", help="with --stub: run this module's main() with the "
                        "arguments after --, not a rank")
    parser.add_argument("--script", choices=("path", "module"),
                        help="with --stub: run the script (or module) after -- as python -u "
                        "does, not a rank (a torchrun worker)")
    parser.add_argument("--no-hold", action="store_true",
                        help="send each child's status at once (a torchrun job, not mpiexec)")
    parser.add_argument("--listen-fd", type=int,
                        help="serve stubs on this inherited listening socket (a host's zygote)")
    opts = parser.parse_args(argv[:cut])
    rest = argv[cut + 1:]
    if opts.stub:
        stub(opts.stub, rest, opts.preload, mpi=not (opts.spawn or opts.module or opts.script),
             module=opts.module, script=opts.script)
    sys.exit(serve(opts.socket, rest, opts.preload, opts.listen_fd, hold=not opts.no_hold))


if __name__ == "__main__":
    main()
