"""``spawn`` workers of a rank, forked from a template of the rank that imported torch once.

A worker started with ``multiprocessing``'s (or ``torch.multiprocessing``'s) ``spawn`` context
is a fresh interpreter that imports torch again and, at its first optimizer, ``torch._dynamo``:
about 3 s of CPU each on 2 cores, most of what notebook 02's Hogwild check costs (six workers
a file). A probe that asks for it (``spawn_template = True`` on the probe function, see
:func:`wanted`) gets a *template*: a child that :mod:`exercise_utils.rankworker` forks from the
rank before anything else happens in it (no heartbeat, no secret, no salt, no process group,
no student code yet: the rank as the zygote made it). In the rank, every ``spawn`` launch
(``multiprocessing.util.spawnv_passfds`` running ``spawn_main ... --multiprocessing-fork``)
then asks the template for the worker instead of executing Python: it sends what the
exec'd interpreter would have got (the descriptors passed, 0, 1 and 2, the environment, the
working directory); the template forks, the child forks the worker and exits, and the worker,
orphaned, becomes the rank's own child (the rank is a child subreaper), so ``Process.pid``,
``join``, ``exitcode``, ``kill`` and signals are the worker's, as with an exec'd one.

The worker then does what a fresh ``python -c "from multiprocessing.spawn import spawn_main;
spawn_main(...)" --multiprocessing-fork`` does: only the passed descriptors open, Python's
signal handlers back to the defaults, the environment and working directory of the launch,
torch's threads from ``OMP_NUM_THREADS`` or the CPUs it may run on, fresh random states,
new ``sys.stdout``/``sys.stderr``, an empty ``__main__``; ``spawn_main`` then
unpickles the student's process object, importing the student's module afresh (the template
never imported it), and runs it; at the end non-daemon threads are joined and ``atexit``
handlers run, as at an interpreter's exit. What differs from an exec'd worker: modules the
rank had imported (torch, numpy, the checker's) are imported already.

Anything else (``fork``, ``forkserver``, a process of the student's forked from the rank, a
template that is gone, more than :data:`MAX_FDS` descriptors) starts as it always did.

Used by :mod:`exercise_utils.rankworker` for probes that set ``spawn_template`` (notebook
02's :func:`exercise_utils.shared_memory_hogwild.probes.probe_hogwild`).
"""
import atexit
import gc
import io
import json
import os
import re
import signal
import socket
import sys
import threading

from .forking import exit_flushed, freeze_for_fork, fresh_random_state

MAX_FDS = 250            # descriptors one request can carry (Linux's SCM_MAX_FD is 253)
_SPAWN_MAIN = re.compile(r"^from multiprocessing\.spawn import spawn_main; "
                         r"spawn_main\(tracker_fd=(\d+), pipe_handle=(\d+)\)$")
_KEPT = []               # in a worker: the rank's stream objects, never freed (see _worker)
_state = {}              # in the rank: "sock", "owner" (its pid), "real", "lock", "count"


OFF = "DTFS_SPAWN_TEMPLATE"          # "0": exec every spawn worker (to compare, to rule it out)


def wanted(probe):
    """Whether the probe function asks for a template (its ``spawn_template`` attribute),
    unless ``DTFS_SPAWN_TEMPLATE=0``."""
    return bool(getattr(probe, "spawn_template", False)) and os.environ.get(OFF) != "0"


def start():
    """In the rank, before anything else runs in it: fork the template and route this
    process's ``spawn`` launches to it. Returns False (nothing changed) where it cannot."""
    import multiprocessing.util as mp_util
    from .processes import prctl
    if not sys.platform.startswith("linux") or _state:
        return False
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    prctl(36, 1)                 # PR_SET_CHILD_SUBREAPER: orphaned workers become ours
    sys.stdout.flush()
    sys.stderr.flush()
    rank = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            ours.close()
            _serve(theirs, rank)
        except BaseException:  # noqa: BLE001 - the rank's spawns fall back to exec
            code = 1
        finally:
            os._exit(code)
    theirs.close()
    _state.update(sock=ours, owner=os.getpid(), real=mp_util.spawnv_passfds, pid=pid,
                  lock=threading.Lock(), count=0)
    mp_util.spawnv_passfds = _spawnv_passfds
    return True


def spawned():
    """How many workers the template forked for this rank."""
    return _state.get("count", 0)


def stop():
    """Stop routing spawns and let the template go (it exits when its socket closes)."""
    if not _state:
        return
    import multiprocessing.util as mp_util
    if mp_util.spawnv_passfds is _spawnv_passfds:
        mp_util.spawnv_passfds = _state["real"]
    _state["sock"].close()
    try:
        os.waitpid(_state["pid"], 0)
    except ChildProcessError:
        pass
    _state.clear()


# ---------------------------------------------------------------- the rank's side
def _spawnv_passfds(path, args, passfds):
    """``multiprocessing.util.spawnv_passfds``, with a ``spawn_main`` launch from this very
    process answered by the template."""
    found = (_SPAWN_MAIN.match(args[-2]) if len(args) >= 3 and args[-1] == "--multiprocessing-fork"
             and args[-3] == "-c" else None)
    fds = sorted({*(fd for fd in (0, 1, 2) if _is_open(fd)), *map(int, passfds)})
    if (found is None or os.getpid() != _state.get("owner") or os.fsdecode(path) != sys.executable
            or len(fds) > MAX_FDS):
        return _state["real"](path, args, passfds)
    body = json.dumps({"env": dict(os.environ), "cwd": os.getcwd(), "fds": fds,
                       "tracker_fd": int(found[1]), "pipe_handle": int(found[2])}).encode()
    with _state["lock"]:
        sock = _state["sock"]
        try:
            socket.send_fds(sock, [len(body).to_bytes(8, "big")], fds)
            sock.sendall(body)
            answer = _recv_exact(sock, 8)
        except OSError:
            answer = b""
        if len(answer) != 8:             # the template is gone: exec, as without it
            return _state["real"](path, args, passfds)
        _state["count"] += 1
        return int.from_bytes(answer, "big")


def _is_open(fd):
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _recv_exact(sock, size, read=None):
    """``size`` bytes from ``sock`` (or, with ``read``, from ``read(n)``), fewer where it
    ended first."""
    read = read or sock.recv
    data = b""
    while len(data) < size:
        chunk = read(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


# ---------------------------------------------------------------- the template
def _serve(sock, rank):
    """Fork a worker for every request until the rank closes its end (or dies)."""
    from .processes import prctl
    prctl(1, signal.SIGKILL)             # PR_SET_PDEATHSIG: never outlive the rank
    if os.getppid() != rank:             # (it died before that)
        return
    while True:
        head, fds, _, _ = socket.recv_fds(sock, 8, MAX_FDS)
        if len(head) < 8:
            return
        request = json.loads(_recv_exact(sock, int.from_bytes(head, "big")))
        read, write = os.pipe()
        freeze_for_fork()               # (the rank's objects: see forking.freeze_for_fork)
        middle = os.fork()
        if middle == 0:                  # forks the worker and leaves it an orphan
            os.close(read)
            worker = os.fork()
            if worker == 0:
                os.close(write)
                _worker(sock, fds, request)      # never returns
            os.write(write, worker.to_bytes(8, "big"))
            os._exit(0)
        os.close(write)
        for fd in fds:
            os.close(fd)
        got = _recv_exact(None, 8, lambda n: os.read(read, n))
        pid = int.from_bytes(got, "big") if len(got) == 8 else 0
        os.close(read)
        os.waitpid(middle, 0)            # gone: the worker is the rank's child now
        sock.sendall(pid.to_bytes(8, "big"))


def _worker(sock, fds, request):
    """Become what an exec'd ``spawn_main`` interpreter would be, then run it; never
    returns."""
    code = 1
    try:
        sock.close()
        # Python objects of the rank's that own a descriptor close it when they are freed,
        # whatever that number is by then (a descriptor passed to the worker): free the
        # unfrozen garbage now (the frozen is never freed: freeze_for_fork), while the numbers
        # are still theirs, and keep the streams replaced below
        gc.collect()
        _KEPT.extend([sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__,
                      sys.__stderr__])
        _take_fds(fds, request["fds"])
        _default_signals()
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        _fresh_interpreter_state()
        sys.argv = ["-c", "--multiprocessing-fork"]
        from multiprocessing.spawn import spawn_main
        try:
            spawn_main(tracker_fd=request["tracker_fd"], pipe_handle=request["pipe_handle"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        _interpreter_exit()
    except BaseException:  # noqa: BLE001 - as an interpreter would show it
        import traceback
        traceback.print_exc()
    finally:
        exit_flushed(code)


def _take_fds(received, targets):
    """The received descriptors at the numbers they had in the rank; every other closed."""
    import fcntl
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, max(targets) + 1) for fd in received]
    for fd, target in zip(high, targets):
        os.dup2(fd, target)
    keep = set(targets)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _default_signals():
    """Handlers as exec leaves them (caught ones back to the default, ignored ones ignored),
    then Python's own (KeyboardInterrupt on SIGINT)."""
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        try:
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError, TypeError):
            pass
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _fresh_interpreter_state():
    import types
    fresh_random_state()
    torch = sys.modules.get("torch")
    if torch is not None:
        given = os.environ.get("OMP_NUM_THREADS", "")
        threads = int(given) if given.isdigit() and int(given) > 0 else len(
            os.sched_getaffinity(0))
        torch.set_num_threads(threads)
        torch.seed()                     # a fresh interpreter's is seeded from the OS too
    from multiprocessing import process
    process.current_process()._config.pop("tempdir", None)   # made afresh when needed
    # an empty __main__, as ``python -c`` has: spawn_main's prepare() imports the rank's main
    # module again as __mp_main__, as it does in an exec'd worker
    sys.modules["__main__"] = types.ModuleType("__main__")
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))   # (spawn passes no -u)
    streams = []
    for fd in (1, 2):
        raw = io.FileIO(fd, "w", closefd=False)
        tty = raw.isatty()
        streams.append(io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw),
                                        line_buffering=tty or fd == 2,
                                        write_through=unbuffered, errors="backslashreplace"
                                        if fd == 2 else "strict"))
    sys.stdout, sys.stderr = streams
    sys.__stdout__, sys.__stderr__ = streams
    # on descriptor 0 (the rank's sys.stdin may be another number, which spawn_main's
    # bootstrap would close: by then a descriptor passed to the worker)
    sys.stdin = sys.__stdin__ = (io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
                                 if _is_open(0) else None)


def _interpreter_exit():
    """What an interpreter does when its main module returns: join the non-daemon threads,
    run the ``atexit`` handlers."""
    try:
        threading._shutdown()
    except Exception:  # noqa: BLE001
        pass
    atexit._run_exitfuncs()
