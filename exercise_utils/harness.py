"""Checker harness: run checker code against a student file in fresh processes.

A checker never imports student code into the notebook kernel. It calls
:func:`run_ranks`, which starts ``world_size`` fresh processes (MPI through
``mpiexec``, or gloo through :mod:`exercise_utils.rankworker`), imports the
student file in each, calls a *probe* (a function of a topic's ``probes`` module, e.g.
:func:`exercise_utils.mpi_parallel_sgd.probes.probe_sgd`) with the student module, and
collects one result per rank.
Every failure becomes a :class:`~exercise_utils.contract.CheckFailure` (an ``AssertionError``,
charged to a case of the exercise's contract) a student can act on: "not implemented
yet", "rank 1 raised ...", "hung: ranks issued different collectives?" (only when every
unfinished rank stopped making progress: :mod:`.heartbeat`), "the check's integrity was
violated" (:mod:`.integrity`), or, via :func:`assert_close`, "rank 2 differs by 3e-02 in
fc1.weight".

Used by every checker (01_mpi_parallel_sgd onwards).
"""
import contextlib
import functools
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from . import cluster, heartbeat, hosts, integrity, launch, limits, plaindata, sandbox
from . import zygote
from . import processes
from .processes import TAG, kill_processes, tagged_processes
from .contract import CheckFailure
from .notebook_files import no_file, unimplemented, unwritten


TORCH_IMPORT = re.compile(r"^\s*(import|from)\s+torch\b", flags=re.M)
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
    with session() if hosts.wanted() else contextlib.nullcontext():
        return _run_ranks(path, probe, world_size, backend, kwargs, timeout, what, limit,
                          warm_up, case, links, salts)


def _run_ranks(path, probe, world_size, backend, kwargs, timeout, what, limit, warm_up, case,
               links, salts):
    path = Path(path)
    if callable(probe):
        probe = f"{probe.__module__}:{probe.__qualname__}"
    what = what or probe.split(":")[-1]
    for launches in _CHECKS:
        launches.append((what, world_size, backend))
    if not path.is_file():
        raise CheckFailure(no_file(path))
    found = _grading_limits()
    timeout = hang_time(timeout)
    limit, cut = launch_limit(limit, what, case)
    pool = _pool(world_size) if hosts.wanted() else None
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
        watch = _with_progress(heartbeat.Watch(folders, world_size, timeout,
                                               spinning=backend == "mpi",
                                               reported=lambda: _written(folders)),
                               what, world_size, backend)
        before = None
        if found:
            places = ([pool.root / f"h{r}" / "w" for r in range(world_size)] if pool is not None
                      else [Path(tmp)] * world_size)
            before = pool.limit_events(world_size, arm=True) if pool is not None else None
            watch = _within_limits(watch, places, found, path, before and (
                lambda: pool.limit_events(world_size)))
        try:
            try:
                if pool is not None:
                    seen = _launch_on_hosts(pool, world_size, backend, copies, kwfiles, folders,
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
                    hit = _disk_hit(places, found, watch, path) or (
                        before is not None and _kernel_hits(
                            before, pool.limit_events(world_size), found, watch, path, pool))
                    if hit:
                        raise CheckFailure(hit, case)
        except launch.LaunchLimit as err:
            raise CheckFailure(f"{what}: {err.line}", case) from None
        except launch.LaunchHang as err:
            reports = _reports(folders, keys, copies, path)
            _raise_student_errors(reports, path, case)
            running = [s.get("case") for s in err.report if s.get("case")]
            raise CheckFailure(_hang_message(what, backend, world_size, reports, err.report,
                                             path), running[0] if running else case) from None
        except launch.LaunchTimeout:
            _raise_student_errors(_reports(folders, keys, copies, path), path, case)
            lines = watch.summary(path)
            why = ("an endless loop?" if not any("no progress for" in ln for ln in lines) else
                   "an endless loop, or ranks waiting for each other while another kept "
                   "computing (a rank below made no progress: it waits for a message or a "
                   "collective that never comes)?")
            seen = "\n  ".join(lines)
            if cut:
                raise CheckFailure(f"{_out_of_time(what, found)} {why}\n  {seen}", case) from None
            raise CheckFailure(
                f"{what} was still running after {limit} s with {world_size} {backend} "
                f"processes and kept making progress, so all were stopped: {why}"
                f"\n  {seen}", case) from None
        except launch.LaunchError as err:
            # Every rank reported, then the job ended badly (mpiexec cleaning up after the
            # first rank to exit): the reports are the verdict, not the exit status.
            if len(_written(folders)) < world_size:
                _raise_student_errors(_reports(folders, keys, copies, path), path, case)
                raise CheckFailure(f"{what}: the worker processes failed before reporting "
                                   f"a result.\n{_shown(err, copies, path)}", case) from None
        reports = _reports(folders, keys, copies, path)
        _raise_student_errors(reports, path, case)
        missing = [r for r in range(world_size) if r not in reports]
        if missing:
            raise CheckFailure(f"rank {missing[0]} finished without reporting a result "
                               f"(did your code call sys.exit or MPI Finalize?)", case)
        return [reports[r]["value"] for r in range(world_size)]


def launch_limit(limit, what, case=None):
    """Seconds a launch of the check running now may take: ``limit``, or at grading less
    where the check's time (:mod:`.limits`) ends sooner. Raises CheckFailure when that time
    is up already. Returns ``(seconds, cut)``: ``cut`` says the check's time set them."""
    if _DEADLINE[0] is None:
        return limit, False
    left = _DEADLINE[0] - time.monotonic()
    found = limits.current() or limits.DEFAULTS
    if left < 1:
        raise CheckFailure(_out_of_time(what, found), case)
    return min(limit, max(1, int(left))), left < limit


def _grading_limits():
    """The limits the judge applies to this check's launches (:mod:`.limits`): at grading
    (a sandbox policy, on the judge's side of it), else None."""
    return limits.current() if sandbox.policy() is not None else None


def hang_time(timeout):
    """Seconds every unfinished rank of a check's launch may stand still before it is hung:
    ``timeout`` (the check's), or the grader's ``hang`` limit where that is less."""
    found = _grading_limits()
    return min(timeout, float(found["hang"])) if found else timeout


def _output_limit():
    """Bytes of output a check's launch may print at grading (:mod:`.limits`), else None."""
    found = _grading_limits()
    return found["output"] if found else None


def _out_of_time(what, found):
    """The verdict of a check that used up its time at grading (:mod:`.limits`)."""
    return (f"{what} was still running when this check's time ran out: a grading limit "
            f"(check={found['check']:g} s for the whole check, below the notebook's cell "
            "timeout), so every rank was stopped. Correct code needs a small part of it:")


def _where(seen, rank, path):
    """``"in shard_bounds (line 12 of zero.py)"``: where ``rank`` was at the watch's last
    look (its beat), or ""."""
    s = (seen or {}).get(rank) or {}
    if s.get("student"):
        line, func = s["student"]
        return f"in {func} (line {line} of {Path(path).name})"
    return ""


def _within_limits(watch, places, found, path, events=None):
    """``watch`` that also stops the launch, looking once a second, once a rank's folder
    (``places[r]``, on the judge's side of the sandbox) holds more than the disk limit, or
    the kernel stopped something on a rank's host (``events``: a callable returning
    :meth:`.hosts.Pool.limit_events`, whose first answer is the launch's start)."""
    state = {"next": 0.0, "start": events() if events else None}

    def watching():
        now = time.monotonic()
        if now >= state["next"]:
            state["next"] = now + 1.0
            hit = _disk_hit(places, found, watch, path)
            if hit:
                return ("limit", hit)
            if events is not None:
                hit = _kernel_hits(state["start"], events(), found, watch, path)
                if hit:
                    return ("limit", hit)
        return watch()
    watching.seen, watching.summary, watching.close = watch.seen, watch.summary, watch.close
    return watching


def _disk_hit(places, found, watch, path):
    """The verdict for the first rank whose folder holds more than the disk limit (and the
    MiB the judge's own files there may take: beats, reports), or None."""
    for r, place in enumerate(places):
        if _bytes_in(place, found["disk"] + (1 << 20)) > found["disk"] + (1 << 20):
            return limits.verdict(r, "disk", found["disk"], _where(watch.seen, r, path))
    return None


def _bytes_in(folder, stop):
    """Bytes of the files under ``folder`` (their sizes; counting stops past ``stop``)."""
    total, todo = 0, [str(folder)]
    while todo and total <= stop:
        try:
            with os.scandir(todo.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            todo.append(entry.path)
                        else:
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        pass
        except OSError:
            pass
    return total


def _strays(pool, size):
    """``{host: count}`` of processes a launch's ranks left running outside their zygote's
    tree (:meth:`.hosts.Pool.strays`) a second after it ended (slow exits are let end)."""
    end = time.monotonic() + 1.0
    left = pool.strays(size)
    while left and time.monotonic() < end:
        time.sleep(0.1)
        left = pool.strays(size)
    return {h: len(procs) for h, procs in left.items()}


def _kernel_hits(before, after, found, watch, path, pool=None):
    """The verdict for the first rank the kernel stopped on its host during a launch (its
    cgroup: memory, processes), read from outside every sandbox, or that left a process
    running after it (a daemon); or None."""
    left = getattr(pool, "left", None) or {}
    if pool is not None:
        pool.left = {}
    for r, (old, new) in enumerate(zip(before, after)):
        if old is None or new is None:
            continue
        for name in ("memory", "processes"):
            if new[name] > old[name]:
                return limits.verdict(r, name, found[name], _where(watch.seen, r, path))
    for r in sorted(left):
        return (f"rank {r} left {left[r]} process(es) running after its launch ended (a daemon: "
                "started in a new session, or cut loose from the rank by a double fork): that "
                "is a grading limit (daemons=0: every process a rank starts ends with it), so "
                "it was killed and the check fails. Join or terminate what you start.")
    return None


def _hang_message(what, backend, world_size, reports, report, path):
    """What the watch saw when every unfinished rank stopped making progress: first the
    launch, the case (and run) the ranks were in and the pattern (``hung: ...``), then a line
    per rank, then who finished."""
    seen = "\n  ".join(heartbeat.describe(report, path))
    return (f"{what}{_hang_case(report)}: {_hang_cause(backend, report)}\n  {seen}\n"
            f"No progress with {world_size} {backend} process(es) (ranks finished: "
            f"{sorted(reports) or 'none'}; ranks still waiting: {[s['rank'] for s in report]});"
            f" all were killed.")


def _hang_case(report):
    """``", case pp-values (1F1B, m = 2, ...)"``: the case (and run) of the first waiting rank
    that said one (``ctx.case``), else ``""``."""
    said = next((s for s in report if s.get("case")), None)
    if said is None:
        return ""
    return f", case {said['case']}" + (f" ({said['detail']})" if said.get("detail") else "")


def _hang_cause(backend, report):
    """The pattern of a hang, in a sentence that starts with ``hung: ``."""
    cycle, waits = heartbeat.wait_for(report)
    spinning = [s["rank"] for s in report if s.get("spinning")]
    # collectives in the student's code (the probe's own end, a barrier, is not one)
    collective = [s for s in report if s.get("comm") and s["comm"] not in heartbeat.P2P
                  and s.get("phase") != "exit"]
    if cycle:
        calls = {rank: (call, peer) for rank, call, peer in waits}
        return ("hung: a point-to-point deadlock: "
                + ", ".join(f"rank {r} waits in {calls[r][0]} {heartbeat.toward(*calls[r])}"
                            for r in cycle)
                + ": each waits for the next (a blocking send waits until the other side "
                "has posted its receive). Post the receives with irecv before waiting on "
                "anything, or order the sends and receives so that one side receives first.")
    if spinning:
        return (f"hung: rank{'s' * (len(spinning) > 1)} {', '.join(map(str, spinning))} "
                "kept looping on the same few lines (polling, e.g. `while not "
                "work.is_completed()`) while the others waited: what the loop waits for "
                "never came (a message never sent, a tag that does not match, a rank waiting "
                "for this one?).")
    if waits and not collective:
        return ("hung: " + ", ".join(
            f"rank {r} waits in {call} {heartbeat.toward(call, peer)}" for r, call, peer in waits)
            + ", and nothing will come: every send needs its receive posted on the other "
            "side, with the same tag.")
    if (collective and backend != "none") or backend == "mpi":     # (mpi4py's calls: unseen)
        return ("hung: ranks issued different collectives? Every rank must call the same "
                "collectives, in the same order, with matching sizes.")
    if any(s.get("comm") for s in report):
        return ("hung: no rank is inside a collective of your code: a message that never "
                "comes (a receive or a wait whose send never happened, a tag or a peer that "
                "does not match) or a rank that returned early while the others wait for it.")
    return ("hung: the code stopped making progress (waiting for something that never "
            "happens: a lock, a queue, a process that was never started or has died?)")


def _with_progress(watch, what, world_size, backend):
    """``watch`` that also keeps the check's progress line up to date (:mod:`.display`)."""
    from . import display
    if _CHECKS and _LINE[0] is None:
        _LINE[0] = display.Progress()        # one line per check, emptied when it ends
    line, start = (_LINE[0] if _CHECKS else display.Progress()), time.monotonic()

    def watching():
        verdict = watch()
        now = time.monotonic()
        line.update(display.progress_line(what, world_size, backend, now - start, watch.seen,
                                          now))
        return verdict

    def close():
        if not _CHECKS:
            line.close()
    watching.seen, watching.summary, watching.close = watch.seen, watch.summary, close
    return watching


def _launch(worker_args, world_size, backend, limit, what, watch):
    """One launch whose ranks share one sandbox (at grading, only where no network namespaces
    can be made) or none (students' machines): forked by the session's zygote, or by a fresh
    ``rankworker --spawn``, or MPI ranks forked by a zygote of their own."""
    folder = str(Path(_options(worker_args)["--out"]).parent)
    writable = [_SESSION[0]["tmp"]] if _SESSION and backend != "mpi" else [folder]
    if sandbox.weakened("kernel-folder"):
        writable.append(os.getcwd())
    quiet = dict(timeout=limit, echo=False, what=what, watch=watch, writable=writable,
                 cwd=folder if sandbox.policy() is not None else None,
                 output_limit=_output_limit())
    if backend == "mpi":
        cmd = _zygote_command(worker_args, world_size)
    elif _SESSION:
        try:
            cmd = _session_command(worker_args, world_size)
        except ZygoteFailed as failed:
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
        if backend != "mpi":
            cmd = _plain_command(worker_args, world_size)
            quiet["writable"] = [folder]
        launch.run(cmd, nprocs=world_size, **quiet)


def _never_started(err, worker_args, world_size):
    """Why the launch that failed with ``err`` started no rank, when none did (every secret
    still there, no beat, no report) for a reason of the checker's own, or None: the
    session's zygote died (it is started anew for the next launch), or bubblewrap failed to
    set up the sandbox (its message, ``bwrap: ...``, and exit status 1)."""
    out = _options(worker_args)["--out"]
    if not _untouched([rankworker_folder(out, r) for r in range(world_size)]):
        return None
    if err.returncode == zygote.LOST and _SESSION:
        return _zygote_lost()
    failed = [line for line in (err.output or "").splitlines() if line.startswith("bwrap: ")]
    if err.returncode == 1 and failed:
        return f"the sandbox failed to start ({failed[-1].strip()})"
    return None


def _options(worker_args):
    """``{"--student": ..., "--out": ..., ...}``: a launch's worker arguments by name (a flag
    without a value, ``--warm-up``, comes last and is left out)."""
    return dict(zip(worker_args[::2], worker_args[1::2]))


def _plain_command(worker_args, world_size):
    return [sys.executable, "-P", "-m", "exercise_utils.rankworker", "--spawn",
            str(world_size), *worker_args]


def rankworker_folder(out, rank):
    """Rank ``rank``'s folder of a launch whose ``--out`` is ``out`` (``{rank}`` read as the
    rank: :func:`.rankworker.own_folder`)."""
    return Path(str(out).replace("{rank}", str(rank)))


def _untouched(folders):
    """Whether no rank of the launch whose rank folders are ``folders`` started: every secret
    is still there, no rank beat or reported."""
    return (all((Path(f) / "secret").exists() for f in folders)
            and not any(list(Path(f).glob("beat*")) for f in folders)
            and not _written(folders))


def _zygote_lost():
    """Stop this session's zygote, which closed a launch's connection without its exit status;
    the next launch starts a new one. Returns what is known of why (its exit status, the end
    of its stderr)."""
    state = _SESSION[0]
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
    where = _SESSION[0]["tmp"] if _SESSION and pool is None else None
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


def _pool(world_size):
    """The hosts (:func:`.hosts.pool`: this process's, started at its first launch on hosts),
    reset when the session ends (:meth:`.hosts.Pool.reset`)."""
    _SESSION[0]["pool"] = hosts.pool(world_size)
    return _SESSION[0]["pool"]


def _launch_on_hosts(pool, size, backend, copies, kwfiles, folders, common, limit, what, watch):
    """One launch on the session's hosts, rank r on host r (:mod:`.hosts`); returns the bytes
    sent on each link between them, as the kernel counted them. A host's zygote that was gone
    before any rank started is started anew and the launch runs again, once."""
    opts = _options(common)
    module, probe = opts["--probe"].split(":")
    preload = [module, *_optimizer(Path(copies[0]), module, "--warm-up" in common)]
    if backend == "mpi":
        preload = ["mpi4py.MPI", *preload]
        home = pool.root / "{host}"
        k = Path(folders[0]).name
        copy = copies[0] if Path(pool.root) not in Path(copies[0]).parents else (
            home / "in" / k / Path(copies[0]).name)
        args = ["--student", str(copy), "--kwargs",
                str(home / "in" / k / "kwargs.pkl"), "--out", str(home / "w" / k), *common]
        env = {**cluster.MPI_OVER_LINKS, "MASTER_ADDR": pool.net.hosts[0].address}
    else:
        env = {}
    for attempt in (0, 1):
        cmd = (pool.mpi_command(size, args, preload) if backend == "mpi" else
               pool.command([(["--student", str(copies[r]), "--kwargs", str(kwfiles[r]),
                               "--out", str(folders[r]), *common], folders[r])
                             for r in range(size)], preload))
        env["MASTER_PORT"] = str(pool.port())
        before = pool.link_bytes(size)
        try:
            launch.run(cmd, nprocs=size, timeout=limit, echo=False, what=what, watch=watch,
                       sandboxed=True, env=env, output_limit=_output_limit())
        except launch.LaunchTimeout:
            raise
        except launch.LaunchError as err:
            if attempt or err.returncode != zygote.LOST or not _untouched(folders):
                raise
            lost = "; ".join(pool.lost(h) for h in range(size))
            print(f"note: {what}: a host's zygote was lost ({lost}); the launch ran again.",
                  file=sys.stderr, flush=True)
            continue
        finally:
            if sandbox.policy() is not None and not sandbox.weakened("strays"):
                # at grading: what outlived the launch
                pool.left = _strays(pool, size)
            pool.sweep()
        after = pool.link_bytes(size)
        return {link: after[link] - before[link] for link in after}


_SESSION = []       # the check that runs now (see session): [{"tmp", "sock", "proc", "tag"}]


@contextlib.contextmanager
def session(start=False):
    """Inside the block, every gloo and lone-process launch forks its ranks from one zygote
    (:mod:`.zygote`) that imports torch and the probes' modules once, instead of a new
    interpreter per launch importing them again (a check makes two to four launches). The
    zygote starts at the block's first such launch (a check without one costs nothing), or at
    once with ``start``, and is stopped when the block ends; nested blocks share it (the test
    suite runs every check of a test module in one).
    """
    if _SESSION:
        try:
            yield
        finally:
            _reap(_SESSION[0])
        return
    with tempfile.TemporaryDirectory(prefix="dtfs-zygote-") as tmp:
        state = {"tmp": tmp, "sock": None, "proc": None, "pool": None,
                 "tag": f"{os.getpid()}:{uuid.uuid4().hex}"}
        _SESSION.append(state)
        try:
            if start:
                _session_socket()
            yield
        finally:
            _SESSION.clear()
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


def _session_socket():
    """The socket of this session's zygote, started now if it is not running yet."""
    state = _SESSION[0]
    if state["sock"] is None:
        n = state.get("lost", 0)            # a zygote lost (:func:`_zygote_lost`) is replaced
        sock = Path(state["tmp"]) / f"zygote{n or ''}.sock"
        env = {**os.environ, TAG: state["tag"]}
        errors = Path(state["tmp"]) / f"zygote{n or ''}.err"     # why it died, if it does
        state["errors"] = str(errors)
        with open(errors, "wb") as err:
            state["proc"] = proc = subprocess.Popen(
                sandbox.wrap([sys.executable, *launch.ZYGOTE, "--socket",
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


_CHECKS = []        # the launches of each check running now, outermost first
_DEADLINE = [None]  # at grading: when the check running now must end (limits: "check")
_LINE = [None]      # the progress line of the check running now (:class:`.display.Progress`)


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
        _CHECKS.append(launches)
        found = _grading_limits()
        if found and len(_CHECKS) == 1:
            _DEADLINE[0] = start + float(found["check"])
        try:
            with session():
                value = func(*args, **kwargs)
        except CheckFailure as err:
            err.check, err.seconds = func.__name__, display.seconds_since(start)
            raise
        finally:
            _CHECKS.pop()
            if not _CHECKS:
                _DEADLINE[0] = None
            if not _CHECKS and _LINE[0] is not None:
                _LINE[0].close()
                _LINE[0] = None
        if not _CHECKS:     # the cell shows that line and nothing more (no ``True`` after it)
            print(display.summary(func.__name__, launches, display.seconds_since(start)),
                  flush=True)
            return None
        return value
    wrapper.__dtfs_check__ = True
    return wrapper


def _session_command(worker_args, world_size):
    """A ``rankworker --spawn`` launch handed to the session's zygote by a bare stub."""
    opts = _options(worker_args)
    module, probe = opts["--probe"].split(":")
    preload = ["numpy", "exercise_utils.rankworker", module]
    if opts["--backend"] == "gloo" or _needs_torch(Path(opts["--student"]), module, probe):
        preload = ["torch", "torch.distributed",
                   *_optimizer(Path(opts["--student"]), module, "--warm-up" in worker_args),
                   *preload]
    return [sys.executable, *launch.ZYGOTE, "--stub", _session_socket(), "--spawn",
            *[a for name in preload for a in ("--preload", name)], "--", "--spawn",
            str(world_size), *worker_args]


def module_command(module, args, preload=()):
    """A command that runs ``module.main()`` with the command line ``args``, forked from the
    session's zygote after it imported ``preload`` once for every later launch (notebook 05's
    torchrun agent: about 4 s of CPU per job saved), or None where it must be a process of its
    own: no session, or at grading (each such job runs in a sandbox of its own)."""
    if not _SESSION or sandbox.policy() is not None:
        return None
    try:
        sock = _session_socket()
    except ZygoteFailed:
        return None
    return [sys.executable, *launch.ZYGOTE, "--stub", sock, "--module",
            module, *[a for name in preload for a in ("--preload", name)], "--", *args]


def _zygote_command(worker_args, world_size):
    """``mpiexec`` whose ranks are forked from one process that imported torch once
    (:mod:`.zygote`): the probe's module always, torch when the rank will need it."""
    opts = _options(worker_args)
    probe_module, probe = opts["--probe"].split(":")
    preload = ["numpy", "mpi4py.MPI", "exercise_utils.rankworker", probe_module]
    if _needs_torch(Path(opts["--student"]), probe_module, probe):
        preload = ["torch", "torch.distributed", *preload]
    socket = str(Path(opts["--out"]).parent / "zygote.sock")
    return [sys.executable, *launch.ZYGOTE, "--socket", socket,
            *[a for name in preload for a in ("--preload", name)], "--",
            launch.find_executable("mpiexec"), "-n", str(world_size), sys.executable, "-P",
            "-m", "exercise_utils.zygote", "--stub", socket, "--", *worker_args]


def _optimizer(student, module, warm_up=False):
    """``[launch.OPTIMIZER]`` where the ranks will build a torch optimizer (``warm_up``) or
    likely will (the student's file or the probe's package's probes mention one): the zygote
    imports ``torch._dynamo`` once instead of every such rank; else ``[]``."""
    if warm_up:
        return [launch.OPTIMIZER]
    import importlib.util
    spec = importlib.util.find_spec(module)
    folder = Path(spec.origin).parent if spec and spec.origin else None
    probes = [spec.origin, *folder.glob("probes*.py")] if folder else []
    return [launch.OPTIMIZER] if launch.builds_optimizer(student, *probes) else []


def _needs_torch(student, module, probe):
    """Whether a rank will import torch: the student file imports it, or the probe function or
    a function of its module that the probe calls does (a rank that never needs torch, e.g.
    01's convergence check, is spared its import)."""
    import ast
    import importlib.util
    if TORCH_IMPORT.search(student.read_text(errors="replace")):
        return True
    spec = importlib.util.find_spec(module)
    tree = ast.parse(Path(spec.origin).read_text())
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    called = {probe} | {n.func.id for n in ast.walk(funcs[probe]) if isinstance(n, ast.Call)
                        and isinstance(n.func, ast.Name) and n.func.id in funcs}
    return any(TORCH_IMPORT.search(ast.unparse(funcs[name])) for name in called)


def _written(folders):
    """The ranks whose report file exists (checked for its signature by :func:`_reports`)."""
    return {r for r, folder in enumerate(folders) if (Path(folder) / f"rank{r}.report").exists()}


def _reports(folders, keys, copies=(), path=None):
    """Read the reports the ranks wrote: {rank: report} for the ranks that wrote one; the
    paths of the copies of the student's file the ranks ran (``copies``) read as ``path``.

    Raises:
        AssertionError: a report not signed with the rank's secret (the student's file wrote
            it), or one that says the student's file changed the checker's code.
    """
    found = {}
    for r, folder in enumerate(folders):
        try:
            data = (Path(folder) / f"rank{r}.report").read_bytes()
        except FileNotFoundError:
            continue
        payload = integrity.verify(keys[r], data)
        if payload is None:
            raise CheckFailure(f"{integrity.VIOLATION}: rank {r}'s result was not written by "
                                 f"the checker (its signature is wrong): your file must not "
                                 f"write the check's results itself.")
        try:
            found[r] = plaindata.loads(payload)
        except (plaindata.PlainDataError, ValueError) as exc:
            raise CheckFailure(f"{integrity.VIOLATION}: rank {r}'s result is not plain data "
                               f"({exc})") from None
        if found[r].get("tampered"):
            raise CheckFailure(f"{integrity.VIOLATION}: on rank {r} your file changed the "
                                 f"checker's code: {', '.join(found[r]['tampered'][:5])}. "
                                 f"Exercise files must not patch the checks.")
        if path is not None and not found[r].get("ok", True):
            for key in ("message", "traceback"):
                found[r][key] = _as_given(found[r].get(key), copies, path)
    return found


def _as_given(text, copies, path):
    """``text`` with the paths of the copies of the student's file read as ``path`` (the one
    the check was given, e.g. ``work/01_shards.py``)."""
    if not isinstance(text, str):
        return text
    for copy in {str(c) for c in copies}:
        if copy != str(path):
            text = text.replace(copy, str(path))
    return text


def _shown(err, copies, path):
    """A launch's error as the student should read it (:func:`_as_given`)."""
    return _as_given(str(err), copies, path)


def _raise_student_errors(reports, path, case=None):
    """Turn the first error a rank reported into a :class:`CheckFailure` for the student,
    charged to the case the rank was running (else ``case``)."""
    # The first rank to fail is the cause; later errors are usually its consequence
    # (e.g. gloo's "Connection closed by peer" on the ranks that were waiting for it).
    errors = sorted(((r, rep) for r, rep in reports.items() if not rep["ok"]),
                    key=lambda e: e[1]["time"])
    if not errors:
        return
    todo = list(dict.fromkeys(rep["where"] for _, rep in errors
                              if rep["type"] == "NotImplementedError"))
    if todo:
        later = [name for name in unimplemented(path) if name not in todo
                 and not any(w.endswith(f".{name}") or w == name.split(".")[-1] for w in todo)]
        raise CheckFailure("not implemented yet: " + unwritten(
            todo, path, later if len(later) <= 3 else ()))     # (not a file's every stage)
    rank, rep = errors[0]
    running = rep.get("case") or case
    during = f" in check case '{running}'" if running else ""
    found = _grading_limits()
    name = limits.from_error(rep) if found else None
    if name:
        where = f"in {rep['where']}" if rep.get("where") else ""
        value = found["disk" if name == "file" else name]
        raise CheckFailure(f"{limits.verdict(rank, name, value, where)}\n"
                           f"rank {rank} raised {rep['type']}{during}: {rep['message']}\n"
                           f"{rep['traceback']}", running)
    raise CheckFailure(f"rank {rank} raised {rep['type']}{during}: {rep['message']}\n"
                       f"{rep['traceback']}", running)


def _replayed(actual, expected, mistakes, atol, rtol):
    """" Likely cause: <mistake>." for the first replayed mistake ``actual`` matches, or ""."""
    for mistake, replay in (mistakes or {}).items():
        values = replay()
        if all(np.allclose(np.asarray(actual[n], dtype=np.float64),
                           np.asarray(values[n], dtype=np.float64), atol=atol, rtol=rtol)
               for n in expected if n in values):
            return f" Likely cause: {mistake}"
    return ""


def whose(actual, candidates, atol=0.0, rtol=0.0):
    """The key of the first of ``candidates`` (key -> dict name -> array, or an array) that
    ``actual`` (the same) equals within the tolerance, shapes included; None if none does.
    Tells "a rank holding another rank's values" and "one step behind" from other mistakes."""
    def arrays(value):
        return value if isinstance(value, dict) else {"value": value}
    got = arrays(actual)
    for key, values in candidates.items():
        want = arrays(values)
        if want and all(name in got and np.shape(got[name]) == np.shape(want[name]) and
                        np.allclose(np.asarray(got[name], dtype=np.float64),
                                    np.asarray(want[name], dtype=np.float64),
                                    atol=atol, rtol=rtol)
                        for name in want):
            return key
    return None


def likely_cause(actual, expected, start=None, size=None):
    """What a mismatch most likely comes from, as a sentence for the message, or "".

    ``actual``/``expected``: dicts name -> array; ``start``: the same arrays before the
    update (then the update ``actual - start`` is compared with ``expected - start``);
    ``size``: the number of ranks. Recognised: a NaN (where it first appeared), a result that
    never moved, about ``size`` or ``1/size`` times the expected update (a sum instead of an
    average, or divided twice), the opposite sign.
    """
    names = list(expected)
    for name in names:
        bad = np.flatnonzero(~np.isfinite(np.asarray(actual[name], dtype=np.float64)))
        if bad.size:
            return (f" Likely cause: a NaN or infinity, first in {name} (flat index {bad[0]}, "
                    f"{bad.size} element{'s' * (bad.size != 1)}): look for a division by zero "
                    f"(a count or a world size of 0?) or an uninitialised buffer (torch.empty).")
    base = {n: np.asarray(start[n], dtype=np.float64) if start is not None else 0.0
            for n in names}
    got = np.concatenate([(np.asarray(actual[n], dtype=np.float64) - base[n]).ravel()
                          for n in names] or [np.zeros(0)])
    want = np.concatenate([(np.asarray(expected[n], dtype=np.float64) - base[n]).ravel()
                           for n in names] or [np.zeros(0)])
    norm = float(want @ want)
    if norm == 0.0:
        return ""
    what = "update" if start is not None else "value"
    if float(got @ got) <= 1e-6 * norm:
        return (f" Likely cause: nothing moved (the {what}s are zero): was the result computed "
                f"but never written back (into p.grad, or into the tensor in place)?")
    k = float(got @ want) / norm
    if float((got - k * want) @ (got - k * want)) > 0.05 ** 2 * norm:
        return ""
    if size and size > 1 and abs(k - size) < 0.15 * size:
        return (f" Likely cause: about {k:.2f} times the expected {what} with {size} ranks: "
                f"summed instead of averaged? Divide the sum by the world size.")
    if size and size > 1 and abs(k - 1 / size) < 0.15 / size:
        return (f" Likely cause: about 1/{size} of the expected {what} with {size} ranks: "
                f"divided by the world size twice, or averaged what was already an average?")
    if abs(k + 1) < 0.15:
        return f" Likely cause: the {what} has the opposite sign."
    return ""


def assert_close(actual, expected, what, rank=None, atol=1e-5, rtol=1e-4, case=None,
                 dtype=False, start=None, size=None, mistakes=None, others=None):
    """Compare named arrays; raise a CheckFailure naming the rank, the tensor and the error,
    and, where one is recognised, the likely cause (:func:`likely_cause`).

    Args:
        actual, expected: dicts name -> array-like (or a single array-like).
        what: what the values are ("parameters after 4 steps").
        rank: the rank the actual values come from (for the message).
        atol, rtol: tolerances as in ``numpy.allclose``.
        case: the check case that compares them (:mod:`.contract`).
        dtype: also require each actual array to have the expected one's dtype.
        start: the values before the update (same names), for the likely cause.
        size: the number of ranks, for the likely cause.
        mistakes: ``{what the mistake is: a function returning the values it gives}``
            (replays of known mistakes, called only on a mismatch): the first the actual
            values match (to 10 times the tolerance) is named as the likely cause.
        others: ``{rank: its expected values}`` for the other ranks: actual values that are
            another rank's (within the tolerance) are named as the likely cause.
    """
    if not isinstance(expected, dict):
        actual, expected = {"value": actual}, {"value": expected}
    where = f"rank {rank}" if rank is not None else "your result"
    missing = sorted(set(expected) - set(actual))
    if missing:
        raise CheckFailure(f"{where}: {what} lacks {missing}", case)
    for name, exp in expected.items():
        if dtype and np.asarray(actual[name]).dtype != np.asarray(exp).dtype:
            raise CheckFailure(f"{where}: {name} is {np.asarray(actual[name]).dtype}, expected "
                               f"{np.asarray(exp).dtype} ({what}): keep the dtype you were "
                               f"given", case)
        a, e = np.asarray(actual[name], dtype=np.float64), np.asarray(exp, dtype=np.float64)
        if a.shape != e.shape:
            raise CheckFailure(f"{where}: {name} has shape {a.shape}, expected {e.shape} "
                               f"({what})", case)
        if not np.allclose(a, e, atol=atol, rtol=rtol):
            diff = float(np.max(np.abs(a - e)))
            if start is not None and not isinstance(start, dict):
                start = {"value": start}
            cause = (_replayed(actual, expected, mistakes, 10 * atol, 10 * rtol) or
                     held_by(actual, others, rank, atol, rtol) or
                     likely_cause({n: actual[n] for n in expected}, expected, start, size))
            raise CheckFailure(f"{where} differs by {diff:.1e} in {name} ({what}; max abs "
                               f"difference, tolerance {atol:g} + {rtol:g}*|expected|).{cause}",
                               case)


def held_by(actual, others, rank, atol=0.0, rtol=0.0):
    """" Likely cause: ..." when ``actual`` equals what another rank should hold (``others``:
    rank -> its expected values), else ""."""
    def empty(values):      # an empty share says nothing about whose it is
        return all(np.size(v) == 0 for v in (values.values() if isinstance(values, dict)
                                             else [values]))
    other = whose(actual, {q: v for q, v in (others or {}).items() if q != rank and not empty(v)},
                  atol, rtol)
    if other is None:
        return ""
    holder = f"rank {rank}" if rank is not None else "this rank"
    return (f" Likely cause: {holder} holds what rank {other} should hold: a rank index is off "
            f"(the pieces sent in the wrong order, counted from the root instead of from rank "
            f"0, or the wrong source / destination).")


def state_arrays(model):
    """Return ``{name: numpy copy}`` of a model's parameters and buffers (for results)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}

