"""A check's session: every gloo and lone-process launch of a check forks its ranks from one
zygote (:mod:`.zygote`) that imported torch and the probes' modules once; the ``@check``
decorator (one line when a check passes, its name and time on a failure; the check's deadline
at grading); the commands that hand a launch to a zygote; the check's progress line.

Owns: :func:`session`, :func:`check`, :func:`module_command` (re-exported by :mod:`.harness`,
the checkers' API), :data:`SESSION` and :data:`CHECKS` (the session and the checks running
now), :func:`zygote_socket`, :func:`zygote_lost`, :func:`session_command`,
:func:`zygote_command`, :func:`mpi_session_command`, :func:`options`, :func:`optimizer`, :func:`needs_torch`,
:func:`with_progress`. Called by :mod:`.harness` and :mod:`.hostlaunch`.
"""
import ast
import contextlib
import functools
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from . import commands, processes, sandbox, stops
from .contract import CheckFailure
from .processes import TAG, kill_processes, tagged_processes


TORCH_IMPORT = re.compile(r"^\s*(import|from)\s+torch\b", flags=re.M)


SESSION = []       # the check that runs now (see session): [{"tmp", "sock", "proc", "tag"}]


@contextlib.contextmanager
def session(start=False):
    """Inside the block, every gloo and lone-process launch forks its ranks from one zygote
    (:mod:`.zygote`) that imports torch and the probes' modules once, instead of a new
    interpreter per launch importing them again (a check makes two to four launches). The
    zygote starts at the block's first such launch (a check without one costs nothing), or at
    once with ``start``, and is stopped when the block ends; nested blocks share it (the test
    suite runs every check of a test module in one).
    """
    if SESSION:
        try:
            yield
        finally:
            _reap(SESSION[0])
        return
    with tempfile.TemporaryDirectory(prefix="dtfs-zygote-") as tmp:
        state = {"tmp": tmp, "sock": None, "proc": None, "pool": None,
                 "tag": f"{os.getpid()}:{uuid.uuid4().hex}"}
        SESSION.append(state)
        try:
            if start:
                zygote_socket()
            yield
        finally:
            SESSION.clear()
            if state["proc"] is not None:
                state["proc"].kill()
                state["proc"].wait()
                kill_processes(tagged_processes(state["tag"]))
            if state["pool"] is not None:
                state["pool"].reset()


def _reap(state):
    """Kill what the zygote forked and is still alive (a rank whose launch was judged by its
    report may still be exiting; the zygote kills it soon, but not before the check returns),
    not the zygote: a nested block ends with no rank of its checks left behind."""
    if state["proc"] is not None and state["sock"]:
        # the process started (at grading: bwrap) and the zygote, which wrote its own pid
        spare = _zygote_line(state["proc"].pid, int(Path(f"{state['sock']}.pid").read_text()))
        kill_processes([p for p in tagged_processes(state["tag"]) if p.pid not in spare])


def _zygote_line(top, zygote):
    """The pids of ``top`` (the process the session started) and of its descendants down to
    the zygote, which wrote its own pid ``zygote``: at grading its pid in the sandbox's pid
    namespace, under bwrap's (``processes.inner_pid``). Empty of the zygote where it is
    gone."""
    import psutil
    try:
        root = psutil.Process(top)
        below = root.children(recursive=True)
    except psutil.Error:
        return {top}
    for proc in below:
        if processes.inner_pid(proc) == zygote:
            line, cur = {top}, proc
            while cur is not None and cur.pid != top:
                line.add(cur.pid)
                try:
                    cur = cur.parent()
                except psutil.Error:
                    break
            return line
    return {top}


class ZygoteFailed(RuntimeError):
    """The session's zygote exited before it was ready (the launch runs without it)."""


def zygote_socket():
    """The socket of this session's zygote, started now if it is not running yet."""
    state = SESSION[0]
    if state["sock"] is None:
        n = state.get("lost", 0)            # a zygote lost (:func:`zygote_lost`) is replaced
        sock = Path(state["tmp"]) / f"zygote{n or ''}.sock"
        env = {**os.environ, TAG: state["tag"]}
        errors = Path(state["tmp"]) / f"zygote{n or ''}.err"     # why it died, if it does
        state["errors"] = str(errors)
        with open(errors, "wb") as err:
            state["proc"] = proc = subprocess.Popen(
                sandbox.wrap([sys.executable, *commands.ZYGOTE, "--socket",
                              str(sock)], writable=[state["tmp"]], cwd=state["tmp"]),
                env=env, stdin=subprocess.DEVNULL, stderr=err, start_new_session=True)
        while not sock.exists():
            if proc.poll() is not None:
                state["proc"], state["lost"] = None, n + 1
                tail = " | ".join(errors.read_text(errors="replace").strip().splitlines()[-6:])
                raise ZygoteFailed(f"the check's zygote exited with status {proc.returncode} "
                                   f"before it was ready; its stderr: {tail or '(empty)'}")
            time.sleep(0.01)
        state["sock"] = str(sock)
    return state["sock"]


CHECKS = []        # the launches of each check running now, outermost first


LINE = [None]      # the progress line of the check running now (:class:`.progress.Progress`)


def check(func):
    """Decorator of every ``check_*`` function: the check runs in one :func:`session`; when
    it passes it prints one line (what ran, how long: :func:`.display.summary`), when it
    fails its CheckFailure carries the check's name and time (``check``, ``seconds``) for
    the box a notebook shows (:mod:`.display`). A check called by another prints nothing and
    returns what the check returned; the outermost returns None (a cell shows one line)."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from . import display
        start, launches = time.monotonic(), []
        CHECKS.append(launches)
        found = stops.grading_limits()
        if found and len(CHECKS) == 1:
            stops.DEADLINE[0] = start + float(found["check"])
        try:
            with session():
                value = func(*args, **kwargs)
        except CheckFailure as err:
            err.check, err.seconds = func.__name__, display.seconds_since(start)
            raise
        finally:
            CHECKS.pop()
            if not CHECKS:
                stops.DEADLINE[0] = None
            if not CHECKS and LINE[0] is not None:
                LINE[0].close()
                LINE[0] = None
        if not CHECKS:     # the cell shows that line and nothing more (no ``True`` after it)
            print(display.summary(func.__name__, launches, display.seconds_since(start)),
                  flush=True)
            return None
        return value
    wrapper.__dtfs_check__ = True
    return wrapper


def options(worker_args):
    """``{"--student": ..., "--out": ..., ...}``: a launch's worker arguments by name (a flag
    without a value, ``--warm-up``, comes last and is left out)."""
    return dict(zip(worker_args[::2], worker_args[1::2]))


def session_command(worker_args, world_size):
    """A ``rankworker --spawn`` launch handed to the session's zygote by a bare stub."""
    opts = options(worker_args)
    module, probe = opts["--probe"].split(":")
    preload = ["numpy", "exercise_utils.rankworker", module]
    if opts["--backend"] == "gloo" or needs_torch(Path(opts["--student"]), module, probe):
        preload = ["torch", "torch.distributed",
                   *optimizer(Path(opts["--student"]), module, "--warm-up" in worker_args),
                   *preload]
    return [sys.executable, *commands.ZYGOTE, "--stub", zygote_socket(), "--spawn",
            *[a for name in preload for a in ("--preload", name)], "--", "--spawn",
            str(world_size), *worker_args]


def module_command(module, args, preload=()):
    """A command that runs ``module.main()`` with the command line ``args``, forked from the
    session's zygote after it imported ``preload`` once for every later launch (notebook 05's
    torchrun agent: about 4 s of CPU per job saved), or None where it must be a process of its
    own: no session, or at grading (each such job runs in a sandbox of its own)."""
    if not SESSION or sandbox.policy() is not None:
        return None
    try:
        sock = zygote_socket()
    except ZygoteFailed:
        return None
    return [sys.executable, *commands.ZYGOTE, "--stub", sock, "--module",
            module, *[a for name in preload for a in ("--preload", name)], "--", *args]


def _mpi_preload(worker_args):
    """What an MPI launch's ranks import before the student's file: the probe's module
    always, torch when a rank will need it."""
    opts = options(worker_args)
    probe_module, probe = opts["--probe"].split(":")
    preload = ["numpy", "exercise_utils.rankworker", probe_module]
    if needs_torch(Path(opts["--student"]), probe_module, probe):
        preload = ["torch", "torch.distributed", *preload]
    return preload


def zygote_command(worker_args, world_size):
    """``mpiexec`` whose ranks are forked from one process, started for this launch, that
    imported torch once (:mod:`.zygote`): an MPI launch outside a session."""
    socket = str(Path(options(worker_args)["--out"]).parent / "zygote.sock")
    return [sys.executable, *commands.ZYGOTE, "--socket", socket,
            *[a for name in ["mpi4py.MPI", *_mpi_preload(worker_args)]
              for a in ("--preload", name)], "--",
            commands.find_executable("mpiexec"), "-n", str(world_size), sys.executable, "-P",
            "-m", "exercise_utils.zygote", "--stub", socket, "--", *worker_args]


def mpi_session_command(worker_args, world_size):
    """``mpiexec`` whose ranks the session's zygote forks, as the hosts' zygotes fork them at
    grading: each rank's stub hands its MPI connection (``PMI_FD``) to the zygote, which
    imported torch once for every launch of the check (a zygote of its own per launch imported
    it again: about 2 s of CPU, most of a small MPI launch's cost). The zygote never imports
    ``mpi4py.MPI`` itself: each rank initialises MPI (:func:`.zygote._run_rank`)."""
    return [commands.find_executable("mpiexec"), "-n", str(world_size), sys.executable, "-P",
            "-m", "exercise_utils.zygote", "--stub", zygote_socket(),
            *[a for name in _mpi_preload(worker_args) for a in ("--preload", name)], "--",
            *worker_args]


def optimizer(student, module, warm_up=False):
    """``[commands.OPTIMIZER]`` where the ranks will build a torch optimizer (``warm_up``) or
    likely will (the student's file or the probe's package's probes mention one): the zygote
    imports ``torch._dynamo`` once instead of every such rank; else ``[]``."""
    if warm_up:
        return [commands.OPTIMIZER]
    import importlib.util
    spec = importlib.util.find_spec(module)
    folder = Path(spec.origin).parent if spec and spec.origin else None
    probes = [spec.origin, *folder.glob("probes*.py")] if folder else []
    return [commands.OPTIMIZER] if commands.builds_optimizer(student, *probes) else []


def needs_torch(student, module, probe):
    """Whether a rank will import torch: the student file imports it, or the probe function
    or a function or class it calls, in its module or imported by name from another module of
    the course (e.g. 01's ``scatter_data``), however deep, does (a rank that never needs torch,
    e.g. 01's convergence check, is spared its import; each rank of an MPI launch that
    imported it after the fork cost ~2 s of CPU, the most of 01's scatter check)."""
    if TORCH_IMPORT.search(student.read_text(errors="replace")):
        return True
    seen, todo = set(), [(module, probe)]
    while todo:
        where = todo.pop()
        if where in seen:
            continue
        seen.add(where)
        defs, imported = _definitions(where[0])
        node = defs.get(where[1])
        if node is None:
            continue
        if TORCH_IMPORT.search(ast.unparse(node)):
            return True
        called = {n.func.id for n in ast.walk(node)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        todo += [(where[0], name) for name in called if name in defs]
        todo += [imported[name] for name in called if name in imported]
    return False


@functools.lru_cache(maxsize=None)
def _definitions(module):
    """Module ``module``'s top-level functions and classes (``{name: node}``) and the names it
    imports from the course's modules (``{name: (module, name there)}``)."""
    import importlib.util
    spec = importlib.util.find_spec(module)
    tree = ast.parse(Path(spec.origin).read_text())
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    package = module if spec.submodule_search_locations else module.rpartition(".")[0]
    imported = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(
                __package__ + ".")):
            source = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            imported.update({a.asname or a.name: (source, a.name) for a in node.names})
    return defs, imported


def zygote_lost():
    """Stop this session's zygote, which closed a launch's connection without its exit status;
    the next launch starts a new one. Returns what is known of why (its exit status, the end
    of its stderr)."""
    state = SESSION[0]
    proc, errors = state["proc"], Path(state["errors"])
    try:
        code = proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        code = None
        proc.kill()
        proc.wait()
    kill_processes(tagged_processes(state["tag"]))     # what it forked (none started)
    tail = " | ".join(errors.read_text(errors="replace").strip().splitlines()[-6:])
    state["sock"] = state["proc"] = None
    state["lost"] = state.get("lost", 0) + 1
    status = "still running (stopped now)" if code is None else f"exit status {code}"
    return f"the check's zygote (pid {proc.pid}) was lost: {status}; its stderr: {tail or '(empty)'}"


def with_progress(watch, what, world_size, backend):
    """``watch`` that also keeps the check's progress line up to date (:mod:`.progress`)."""
    from . import progress
    if CHECKS and LINE[0] is None:
        LINE[0] = progress.Progress()        # one line per check, emptied when it ends
    line, start = (LINE[0] if CHECKS else progress.Progress()), time.monotonic()

    def watching():
        verdict = watch()
        now = time.monotonic()
        line.update(progress.progress_line(what, world_size, backend, now - start, watch.seen,
                                          now))
        return verdict

    def close():
        if not CHECKS:
            line.close()
    watching.seen, watching.summary, watching.close = watch.seen, watch.summary, close
    return watching
