"""Checker harness: run checker code against a student file in fresh processes.

A checker never imports student code into the notebook kernel. It calls
:func:`run_ranks`, which starts ``world_size`` fresh processes (MPI through
``mpiexec``, or gloo through :mod:`exercise_utils.rankworker`), imports the
student file in each, calls a *probe* (a function of a topic's ``probes`` module, e.g.
:func:`exercise_utils.mpi_parallel_sgd.probes.probe_sgd`) with the student module, and
collects one result per rank.
Every failure becomes a :class:`~exercise_utils.contract.CheckFailure` (an ``AssertionError``,
charged to a case of the exercise's contract) a student can act on: "not implemented
yet", "rank 1 raised ..." (:mod:`.reports`), "hung: ranks issued different collectives?"
(only when every unfinished rank stopped making progress: :mod:`.heartbeat`, :mod:`.stops`),
"the check's integrity was violated" (:mod:`.integrity`), or, via
:func:`.compare.assert_close`, "rank 2 differs by 3e-02 in fc1.weight".

Owns: :func:`run_ranks` (where a launch's ranks run: a session's zygote, hosts of their own
through :mod:`.hostlaunch`, or ``mpiexec``), whether launches are observed on the wire
(:func:`observing`, :func:`wire_outside`) and salted (:func:`salting`). The checkers' API also
takes :func:`check`, :func:`session` and :func:`module_command` from here (their home is
:mod:`.sessions`). Used by every checker (01_mpi_parallel_sgd onwards).
"""
import contextlib
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

from . import heartbeat, hostlaunch, hosts, integrity, launch, reports, sandbox, sessions
from . import stops, zygote
from .contract import CheckFailure
from .notebook_files import no_file
from .sessions import check, module_command, session  # noqa: F401  (the checkers' API)


HANG_AFTER = 60    # seconds every unfinished rank may stand still before a check calls it a hang


LIMIT = 600        # seconds a check's launch may run while making progress (an endless loop?)


def run_ranks(path, probe, world_size=1, backend="none", kwargs=None, timeout=HANG_AFTER,
              what=None, limit=LIMIT, warm_up=False, case=None, links=None, salts=None):
    """Run ``probe(student_module, ctx, **kwargs)`` on every rank; return per-rank results.

    Args:
        path: the student file (e.g. ``work/01_shards.py``).
        probe: the probe function (defined at module level, importable in a fresh process)
            or its name ``"package.module:function"``; it receives the imported student
            module and a context with ``rank``, ``size``, ``backend`` and ``comm`` (MPI).
        world_size: number of processes.
        backend: ``"mpi"`` (mpiexec + mpi4py), ``"gloo"`` (torch.distributed) or ``"none"``
            (independent processes, for pure functions).
        kwargs: picklable keyword arguments for the probe.
        timeout: seconds every rank that has not reported may make no progress (no new line
            of Python, no CPU time; :mod:`.heartbeat`) before it is a hang. A slow or busy
            machine only makes the check slower: start-up, slow progress and slow exits
            never count.
        what: what is being checked, for messages (default: the probe's name).
        limit: seconds of wall time after which ranks that are still making progress are
            stopped (an endless loop); also the gloo group's timeout.
        warm_up: build a ``torch.optim`` optimizer before the student's code (it imports
            ``torch._dynamo``: seconds of CPU). Only for probes whose student code runs its own
            process group with a short timeout (notebook 04): elsewhere a rank that imports
            between two collectives is making progress, and the others wait for it. (Ranks
            forked from a session's or a host's zygote have it imported already where they
            will likely build an optimizer: the zygote imports it once, not every rank.)
        case: the check case this launch runs (:mod:`.contract`): a crash, hang or endless
            loop of the student's code is charged to it, unless the probe named the case it
            was running (``ctx.case(name)``).
        links: a dict to receive the bytes every rank sent to every other, as the kernel
            counted them on the wire (``{(i, j): bytes}``), where the ranks run on hosts
            (:func:`observing`: at grading): then every rank runs as a host of a mesh, in a
            sandbox of its own (:mod:`.hosts`), and the judge reads the interfaces' counters
            from outside (nothing a rank does can change them). With ``backend="none"`` the
            probe sets up its gloo group itself (``env://``: ``MASTER_ADDR`` is host 0's
            address there). Left empty elsewhere.
        salts: a dict to receive the number each rank alone was given (``{rank: int}``,
            ``ctx.salt`` in its probe), so that inputs the probe derives from it cannot be
            rebuilt by another rank (only received through its collectives). Given at
            grading (:func:`salting`) to launches of 2 or more ranks: each rank finds it in
            its own folder, which on hosts no other rank's sandbox shows; where the ranks
            share a sandbox, each takes it and deletes it, and no rank's student code starts
            before every rank has (the sandboxed ranks cannot read each other's memory:
            :func:`.sandbox.harden`). Left empty elsewhere, where every ``ctx.salt`` is 0.
    Returns:
        list: the probe's return value on rank 0, 1, ...
    Raises:
        CheckFailure: (an ``AssertionError``) with a message for the student on any failure;
            one that says "the check's integrity was violated" when the student's file forged
            a result or changed the checker's code (:mod:`.integrity`).
    """
    # (on hosts, a launch outside a check runs in a session of its own: its hosts' lifetime)
    with sessions.session() if hosts.wanted() else contextlib.nullcontext():
        return _run_ranks(path, probe, world_size, backend, kwargs, timeout, what, limit,
                          warm_up, case, links, salts)


def _run_ranks(path, probe, world_size, backend, kwargs, timeout, what, limit, warm_up, case,
               links, salts):
    path = Path(path)
    if callable(probe):
        probe = f"{probe.__module__}:{probe.__qualname__}"
    what = what or probe.split(":")[-1]
    for launches in sessions.CHECKS:
        launches.append((what, world_size, backend))
    if not path.is_file():
        raise CheckFailure(no_file(path))
    found = stops.grading_limits()
    timeout = stops.hang_time(timeout)
    limit, cut = stops.launch_limit(limit, what, case)
    pool = hostlaunch.session_pool(world_size) if hosts.wanted() else None
    with _launch_folder(pool) as tmp:
        blob = pickle.dumps(kwargs or {})                    # judge -> rank only (plaindata: back)
        if pool is not None:
            folders, copies, kwfiles = pool.prepare(world_size, path, blob)
        else:
            folders = [Path(tmp) / f"r{r}" for r in range(world_size)]
            for folder in folders:
                folder.mkdir()
            (Path(tmp) / "kwargs.pkl").write_bytes(blob)
            copy = path.resolve()
            if sandbox.policy() is not None:      # (the submission's folder: not in sight)
                copy = Path(tmp) / "in" / path.name
                copy.parent.mkdir()
                copy.write_bytes(path.read_bytes())
            copies = [copy] * world_size
            kwfiles = [Path(tmp) / "kwargs.pkl"] * world_size
        keys = integrity.make_secrets(folders)
        if salts is not None and world_size > 1 and (salting() or (
                pool is not None and os.environ.get(SALT) != "0")):
            salts.update(_give_salts(folders))
        common = ["--probe", probe, "--backend", backend, "--timeout", str(limit),
                  *(["--warm-up"] if warm_up else [])]
        watch = sessions.with_progress(heartbeat.Watch(folders, world_size, timeout,
                                               spinning=backend == "mpi",
                                               reported=lambda: reports.written(folders)),
                               what, world_size, backend)
        before = None
        if found:
            places = ([pool.root / f"h{r}" / "w" for r in range(world_size)] if pool is not None
                      else [Path(tmp)] * world_size)
            before = pool.limit_events(world_size, arm=True) if pool is not None else None
            watch = stops.within_limits(watch, places, found, path, before and (
                lambda: pool.limit_events(world_size)))
        try:
            try:
                if pool is not None:
                    seen = hostlaunch.launch_on_hosts(pool, world_size, backend, copies, kwfiles, folders,
                                            common, limit, what, watch)
                    if links is not None:
                        links.update(seen)
                else:
                    worker_args = ["--student", str(copies[0]), "--kwargs", str(kwfiles[0]),
                                   "--out", str(Path(tmp) / "r{rank}"), *common]
                    _launch(worker_args, world_size, backend, limit, what, watch)
            finally:
                watch.close()           # the progress line: gone, however the launch ended
                if found and not isinstance(sys.exc_info()[1], launch.LaunchLimit):
                    # what the ranks left in their folders; what the kernel stopped (cgroups)
                    hit = stops.disk_hit(places, found, watch, path) or (
                        before is not None and stops.kernel_hits(
                            before, pool.limit_events(world_size), found, watch, path, pool))
                    if hit:
                        raise CheckFailure(hit, case)
        except launch.LaunchLimit as err:
            raise CheckFailure(f"{what}: {err.line}", case) from None
        except launch.LaunchHang as err:
            told = reports.read_reports(folders, keys, copies, path)
            reports.raise_student_errors(told, path, case)
            running = [s.get("case") for s in err.report if s.get("case")]
            raise CheckFailure(stops.hang_message(what, backend, world_size, told, err.report,
                                             path), running[0] if running else case) from None
        except launch.LaunchTimeout:
            reports.raise_student_errors(reports.read_reports(folders, keys, copies, path), path, case)
            lines = watch.summary(path)
            why = ("an endless loop?" if not any("no progress for" in ln for ln in lines) else
                   "an endless loop, or ranks waiting for each other while another kept "
                   "computing (a rank below made no progress: it waits for a message or a "
                   "collective that never comes)?")
            seen = "\n  ".join(lines)
            if cut:
                raise CheckFailure(f"{stops.out_of_time(what, found)} {why}\n  {seen}", case) from None
            raise CheckFailure(
                f"{what} was still running after {limit} s with {world_size} {backend} "
                f"processes and kept making progress, so all were stopped: {why}"
                f"\n  {seen}", case) from None
        except launch.LaunchError as err:
            # Every rank reported, then the job ended badly (mpiexec cleaning up after the
            # first rank to exit): the reports are the verdict, not the exit status.
            if len(reports.written(folders)) < world_size:
                reports.raise_student_errors(reports.read_reports(folders, keys, copies, path), path, case)
                raise CheckFailure(f"{what}: the worker processes failed before reporting "
                                   f"a result.\n{reports.shown(err, copies, path)}", case) from None
        told = reports.read_reports(folders, keys, copies, path)
        reports.raise_student_errors(told, path, case)
        missing = [r for r in range(world_size) if r not in told]
        if missing:
            raise CheckFailure(f"rank {missing[0]} finished without reporting a result "
                               f"(did your code call sys.exit or MPI Finalize?)", case)
        return [told[r]["value"] for r in range(world_size)]


def _launch(worker_args, world_size, backend, limit, what, watch):
    """One launch whose ranks share one sandbox (at grading, only where no network namespaces
    can be made) or none (students' machines): forked by the session's zygote, or by a fresh
    ``rankworker --spawn``; MPI ranks by the session's zygote too (outside a session, by a
    zygote of their own)."""
    folder = str(Path(sessions.options(worker_args)["--out"]).parent)
    writable = [sessions.SESSION[0]["tmp"]] if sessions.SESSION else [folder]
    if sandbox.weakened("kernel-folder"):
        writable.append(os.getcwd())
    quiet = dict(timeout=limit, echo=False, what=what, watch=watch, writable=writable,
                 cwd=folder if sandbox.policy() is not None else None,
                 output_limit=stops.output_limit())
    if backend == "mpi" and sessions.SESSION:
        try:
            cmd = sessions.mpi_session_command(worker_args, world_size)
        except sessions.ZygoteFailed as failed:
            print(f"note: {what}: {failed}; the launch ran without it.", file=sys.stderr,
                  flush=True)
            cmd = sessions.zygote_command(worker_args, world_size)
            quiet["writable"] = [folder]
    elif backend == "mpi":
        cmd = sessions.zygote_command(worker_args, world_size)
    elif sessions.SESSION:
        try:
            cmd = sessions.session_command(worker_args, world_size)
        except sessions.ZygoteFailed as failed:
            print(f"note: {what}: {failed}; the launch ran without it.", file=sys.stderr,
                  flush=True)
            cmd = _plain_command(worker_args, world_size)
    else:
        cmd = _plain_command(worker_args, world_size)
    try:
        launch.run(cmd, nprocs=world_size, **quiet)
    except launch.LaunchTimeout:
        raise
    except launch.LaunchError as err:
        why = _never_started(err, worker_args, world_size)
        if why is None:
            raise
        # Nothing of the student's ran: the launch runs again, once, and why it had to is
        # said (on stderr, not in the verdict).
        print(f"note: {what}: {why}; the launch ran again.", file=sys.stderr, flush=True)
        cmd = (sessions.zygote_command(worker_args, world_size) if backend == "mpi" else
               _plain_command(worker_args, world_size))
        quiet["writable"] = [folder]
        launch.run(cmd, nprocs=world_size, **quiet)


def _never_started(err, worker_args, world_size):
    """Why the launch that failed with ``err`` started no rank, when none did (every secret
    still there, no beat, no report) for a reason of the checker's own, or None: the
    session's zygote died (it is started anew for the next launch), or bubblewrap failed to
    set up the sandbox (its message, ``bwrap: ...``, and exit status 1)."""
    out = sessions.options(worker_args)["--out"]
    if not reports.untouched([reports.rankworker_folder(out, r) for r in range(world_size)]):
        return None
    if err.returncode == zygote.LOST and sessions.SESSION:
        return sessions.zygote_lost()
    failed = [line for line in (err.output or "").splitlines() if line.startswith("bwrap: ")]
    if err.returncode == 1 and failed:
        return f"the sandbox failed to start ({failed[-1].strip()})"
    return None


def _plain_command(worker_args, world_size):
    return [sys.executable, "-P", "-m", "exercise_utils.rankworker", "--spawn",
            str(world_size), *worker_args]


OBSERVE = hosts.OBSERVE     # "1": launches on hosts outside grading too (tests); "0": never


def observing():
    """Whether launches run on the hosts of a mesh, each rank in a sandbox of its own, and the
    bytes on its links are counted (:mod:`.hosts`): at grading (a sandbox policy,
    :mod:`.sandbox`) or with ``DTFS_OBSERVE=1``, where network namespaces can be made (root,
    Linux; see :func:`.cluster.unavailable_reason`). Elsewhere (a laptop, Colab without root)
    the in-process recorders alone judge the structure."""
    return hosts.wanted()


def wire_outside(links, envelope):
    """``(bytes all ``links`` carried together, least, most)`` where that total lies outside
    ``envelope`` (``(least, most)``); None where it lies inside, or where the links were not
    observed (``links`` empty or None: :func:`run_ranks`'s ``links``)."""
    if not links:
        return None
    sent, (least, most) = sum(links.values()), envelope
    return None if least <= sent <= most else (sent, least, most)


SALT = "DTFS_SALT"          # "1": salts outside grading too (tests); "0": never


def salting():
    """Whether launches that ask for salts (``salts=``) get them: at grading (a sandbox
    policy) or with ``DTFS_SALT=1``, not with ``DTFS_SALT=0``; on hosts unless
    ``DTFS_SALT=0``."""
    wanted = os.environ.get(SALT)
    return wanted == "1" or (wanted != "0" and sandbox.policy() is not None)


def _give_salts(folders):
    """A fresh random number (never 0: 0 means unsalted) in each rank's folder (``salt``:
    only its owner may read it; the rank deletes it before any student code runs,
    :func:`.rankworker._salt`); returns ``{rank: number}``."""
    import secrets
    salts = {r: secrets.randbits(48) + 1 for r in range(len(folders))}
    for r, folder in enumerate(folders):
        path = Path(folder) / "salt"
        path.write_text(str(salts[r]))
        path.chmod(0o600)
    return salts


@contextlib.contextmanager
def _launch_folder(pool=None):
    """A fresh folder for one launch, removed after it: the ranks' folders (beats, reports,
    salts) where they share a sandbox (inside the session's folder, which its zygote's
    sandbox sees), else the judge's own. A rank killed as its launch ends can still write its
    heartbeat there for a moment (on a mesh its sandbox's processes die after the sandbox's
    init: seen once in CI, "Directory not empty" from test_wire), so the removal tries again
    before it gives up silently."""
    import shutil
    where = sessions.SESSION[0]["tmp"] if sessions.SESSION and pool is None else None
    tmp = tempfile.mkdtemp(prefix="dtfs-check-", dir=where)
    try:
        yield tmp
    finally:
        for _ in range(50):
            try:
                shutil.rmtree(tmp)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
