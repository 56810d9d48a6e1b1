"""Tell a hang from slowness: ranks beat, the launcher watches for progress.

A rank calls :func:`start` first thing: a daemon thread then writes, twice a second, where the
rank's main thread is (file, line, function of its innermost Python frame, and the innermost
line of the student's file) and how much CPU the rank and its children have used, to
``FOLDER/beat<rank>.json``. The launcher's :class:`Watch` reads those beats and says:

* **progress** while any rank that has not reported moves (a new line of Python) or computes
  (CPU time rising; not counted under MPI, whose blocking calls spin at 100% CPU);
* **starting** while a rank has not beaten yet (importing torch on a busy machine) or its
  process group is still forming: never a hang;
* **done** as soon as every rank has reported its result: a rank that reported is never
  "still waiting", and slow exits are not waited for;
* **hang** only when every rank that has not reported has stood still for ``hang_after``
  seconds, with the place each one is waiting (in which collective, at which line; for a
  blocking point-to-point call, to or from which rank, so a send/send deadlock is named as
  one), or when some stood still that long while the others **spun**: ran only the same few
  lines of the student's own code (:data:`SPIN_LINES`, e.g. ``while not work.is_completed():
  pass``) for as long. A rank that loops with nobody waiting is left to the wall limit.

A slow or heavily loaded machine therefore only makes a check slower, never "hung"; the
launcher's wall-clock limit stays as a backstop against code that runs on for ever.

Used by :mod:`exercise_utils.harness` and :mod:`exercise_utils.rankworker` (every checker,
01_mpi_parallel_sgd onwards) and by notebook 05's torchrun checks.
"""
import fcntl
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path

PERIOD = 0.5             # seconds between beats
IDLE_CPU = 0.03          # CPU-seconds per second below which a rank is not computing
CPU_WINDOW = 4.0         # seconds over which that rate is measured (see Watch._state)
COMM_MODULES = ("torch/distributed/", "mpi4py")   # frames that mean "in communication"
STARTING = ("start", "init")   # phases that are never a hang: imports, forming the group
SPIN_LINES = 3           # a rank that stays on this many lines of its own code at most "spins"
P2P = ("send", "recv", "isend", "irecv", "send_object_list", "recv_object_list")
SENDS = ("send", "isend", "send_object_list")
# Held while the beating thread holds a frame of the main thread: a frame kept keeps its locals
# (tensors) alive after the main thread has left it, so code that measures the memory alive
# (09's probes) takes this lock around its scan; on a loaded machine the beating thread can
# be descheduled for longer than any pause between scans.
FRAMES = threading.Lock()


def start(folder, rank, student=None, period=PERIOD):
    """Start beating into ``folder/beat<rank>.json``; return the :class:`Beat`.

    Args:
        folder: where the launcher's :class:`Watch` looks.
        rank: this process's rank (a string is fine: "1.restart0").
        student: the student's file, to report the innermost line of it.
        period: seconds between beats.
    Returns:
        Beat: call it with a phase name ("init", "import", "probe") to label what the rank
        does now; call its ``stop()`` before the process exits.
    """
    return Beat(folder, rank, student, period)


class Beat:
    """The beating thread of one rank (see :func:`start`)."""

    def __init__(self, folder, rank, student, period):
        import psutil
        self.phase, self.period, self.done = "start", period, threading.Event()
        self.case = None        # the check case the rank runs (``ctx.case``), for hang reports
        self.detail = None      # and which of its runs (settings: "1F1B, m = 2")
        self.main = threading.main_thread().ident
        self.target = Path(folder) / f"beat{rank}.json"
        # held while this process (or a child it forked) lives: the watch tells a live rank
        # from a dead one by it, not by its pid, which inside a sandbox's pid namespace is
        # not the one the launcher sees (a fresh name per process: a restarted rank never
        # waits for its predecessor's)
        self.lock = f"beat{rank}.{uuid.uuid4().hex[:12]}.lock"
        self._lock_fd = os.open(Path(folder) / self.lock, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.me = psutil.Process()
        self.student = os.path.realpath(student) if student else None
        self.thread = threading.Thread(target=self._run, name="dtfs-heartbeat", daemon=True)
        self.thread.start()

    def __call__(self, name):
        self.phase = name

    def stop(self):
        """End the thread and wait for it: a daemon thread still running while the interpreter
        shuts down can abort the process ("terminate called without an active exception")."""
        self.done.set()
        self.thread.join(timeout=5)

    def _run(self):
        while not self.done.is_set():
            with FRAMES:    # (see FRAMES)
                frames = sys._current_frames().get(self.main)
                where = _where(frames, self.student)
                del frames
            info = {"pid": os.getpid(), "lock": self.lock, "t": time.time(),
                    "phase": self.phase, "case": self.case, "detail": self.detail,
                    "cpu": _cpu(self.me, time.thread_time()), **where}
            tmp = self.target.with_suffix(f".{os.getpid()}.tmp")
            try:
                tmp.write_text(json.dumps(info))
                os.replace(tmp, self.target)
            except OSError:
                return          # the folder is gone: the launch is over
            self.done.wait(self.period)


def _cpu(proc, own=0.0):
    """CPU seconds of this process and its live children (Hogwild's workers), less ``own``: the
    beating thread's (``time.thread_time()`` in it). Its few milliseconds per beat, more on a
    loaded machine, would pass for a rank computing, and a blocked rank would never be seen
    standing still (a CI run took 218 s to call a 15 s deadlock a hang)."""
    total = sum(proc.cpu_times()[:2]) - own
    try:
        for child in proc.children(recursive=True):
            try:
                total += sum(child.cpu_times()[:2])
            except Exception:   # noqa: BLE001 - a child that just ended
                pass
    except Exception:   # noqa: BLE001
        pass
    return total


def _where(frame, student):
    """Where the main thread is: innermost frame, innermost student line, communication call
    (and, for a point-to-point one, its peer and tag: :func:`_peer`)."""
    pos, mine, comm, peer, depth = None, None, None, None, 0
    while frame is not None:
        code = frame.f_code
        if pos is None:
            pos = [code.co_filename, frame.f_lineno, code.co_name]
        if mine is None and student and os.path.realpath(code.co_filename) == student:
            mine = [frame.f_lineno, code.co_name]
        if comm is None and any(m in code.co_filename for m in COMM_MODULES):
            comm = code.co_name
            peer = _peer(frame) if comm in P2P else None
        depth += 1
        frame = frame.f_back
    return {"pos": (pos or []) + [depth], "student": mine, "comm": comm, "peer": peer}


def _peer(frame):
    """``[peer, tag]`` of a blocking point-to-point call of torch.distributed (its ``dst`` or
    ``src``, else ``group_dst`` / ``group_src``; None where not given), read from the frame in
    which the rank is blocked; None if the names are not there."""
    try:
        names = frame.f_locals
        peer = next((names[n] for n in ("dst", "src", "group_dst", "group_src")
                     if isinstance(names.get(n), int)), None)
        tag = names.get("tag")
        return [peer, tag if isinstance(tag, int) else None] if peer is not None else None
    except Exception:   # noqa: BLE001 - a diagnosis only: never break the beat
        return None


class Watch:
    """Watch the beats of ``nranks`` ranks; called by :func:`exercise_utils.launch.run`.

    Args:
        folder: where the ranks beat, or a list of one folder per rank (each rank beating in
            a folder of its own: the checks' ranks at grading, :mod:`exercise_utils.hosts`).
        nranks: the ranks expected (beats named ``beat0.json`` ...).
        hang_after: seconds every unreported rank must stand still before it is a hang.
        reported: callable returning the set of ranks that have reported their result (for
            ``done``); None: the launch ends by itself.
        spinning: True under MPI (a blocked call burns CPU, so CPU time is no progress).
    Call it: returns None (go on), ``"done"`` (every rank reported) or ``("hang", report)``
    with ``report`` a list of dicts: rank, phase, seconds still, student line, comm call.
    """

    def __init__(self, folder, nranks, hang_after, reported=None, spinning=False):
        self.folders = ([Path(f) for f in folder] if isinstance(folder, (list, tuple))
                        else [Path(folder)] * nranks)
        self.nranks, self.hang_after = nranks, hang_after
        self.reported, self.spinning = reported, spinning
        self.seen = {}          # rank -> {"pos", "cpu", "moved": time of the last progress}
        self.next = 0.0

    def __call__(self):
        now = time.monotonic()
        if now < self.next:
            return None
        self.next = now + PERIOD
        done = self.reported() if self.reported else set()
        if self.reported and len(done) >= self.nranks:
            return "done"
        waiting = [r for r in range(self.nranks) if r not in done]
        states = [self._state(r, now) for r in waiting]
        if not states or any(s is None for s in states):
            return None
        # (a beat is up to PERIOD old when read: a rank that sleeps exactly hang_after
        # seconds, then goes on, is seen still for at most that long, and is not a hang)
        after = self.hang_after + PERIOD
        still = [now - s["moved"] > after for s in states]
        spins = [s["spin"] is not None and now - s["spin"]["since"] > after for s in states]
        # a hang: every rank stands still, or some spin on a few lines of the student's file
        # while the others stand still (they wait for each other; an endless loop with no rank
        # waiting is left to the wall limit)
        if all(still) or (any(still) and all(a or b for a, b in zip(still, spins))):
            return ("hang", [{**{k: v for k, v in s.items() if k not in ("spin", "hist")},
                              "rank": r,
                              "still": now - s["moved"],
                              "spinning": None if st else sorted(s["spin"]["lines"])}
                             for r, s, st in zip(waiting, states, still)])
        return None

    def summary(self, path=None):
        """Where every rank stood at the last look, for a message when the wall limit hits:
        reported, never started (a busy machine), or its line and what it did there."""
        done = self.reported() if self.reported else set()
        lines = []
        for r in range(self.nranks):
            s = self.seen.get(r)
            if r in done:
                lines.append(f"rank {r}: reported its result")
            elif s is None:
                lines.append(f"rank {r}: never started (still importing on a busy machine?)")
            else:
                lines += describe([dict(s, rank=r, still=s["t"] - s["moved"])], path)
        return lines

    def _state(self, rank, now):
        """This rank's progress record, updated from its beat; None while it is starting."""
        beat = self._read(rank)
        if beat is None:
            return None
        old = self.seen.get(rank)
        # CPU over the last CPU_WINDOW seconds, not since the last look: a blip of a few tens
        # of milliseconds (the interpreter's or gloo's own threads waking once) in a rank that
        # sleeps is not computing, and used to restart its clock (a hang seen at 120 s, not 60)
        hist = [(t, c) for t, c in (old or {}).get("hist", ()) if now - t <= CPU_WINDOW]
        if old is not None and old.get("pid") != beat["pid"]:
            hist = []
        hist.append((now, beat["cpu"]))
        cpu_moved = old is not None and not self.spinning and (
            beat["cpu"] - hist[0][1] > IDLE_CPU * CPU_WINDOW)
        spin = _spin(old, beat, now)
        if (old is None or beat["pos"] != old["pos"] or beat["phase"] != old["phase"]
                or cpu_moved or beat["pid"] != old["pid"] or beat["phase"] in STARTING):
            old = {"moved": now}
        self.seen[rank] = {**beat, "moved": old["moved"], "t": now, "spin": spin, "hist": hist}
        return self.seen[rank]

    def _read(self, rank):
        folder = self.folders[rank]
        try:
            beat = json.loads((folder / f"beat{rank}.json").read_text())
        except (OSError, ValueError):
            return None
        return beat if _alive(folder, beat) else None


def _spin(old, beat, now):
    """``{"lines", "since"}``: since when every beat has found the rank on the same few lines
    (at most :data:`SPIN_LINES`) of the student's own code, innermost (a loop such as ``while
    not work.is_completed(): pass``, which moves and burns CPU but gets nowhere); None when
    the last beat found it elsewhere."""
    mine, pos = beat.get("student"), beat.get("pos") or []
    if not mine or len(pos) < 4 or [pos[1], pos[2]] != list(mine) or beat.get("comm"):
        return None
    line = mine[0]
    spin = (old or {}).get("spin")
    if spin is None or beat["pid"] != old.get("pid"):
        return {"lines": {line}, "since": now}
    if line in spin["lines"]:
        return spin
    if len(spin["lines"]) < SPIN_LINES:
        return {"lines": spin["lines"] | {line}, "since": spin["since"]}
    return {"lines": {line}, "since": now}


def _alive(folder, beat):
    """Whether the process that wrote ``beat`` (or a child it forked) still lives: it holds
    its lock file (:class:`Beat`); one that died released it. (Its pid cannot tell: in a
    sandbox with its own pid namespace, it is not a pid of the launcher's.)"""
    try:
        fd = os.open(Path(folder) / beat["lock"], os.O_RDONLY)
    except (KeyError, TypeError, OSError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def describe(report, path=None):
    """One line per rank for a hang message: where it waited and for how long."""
    lines = []
    for s in report:
        where = f"line {s['student'][0]} ({s['student'][1]}) of {path or 'your file'}" \
            if s.get("student") else f"{Path(s['pos'][0]).name}:{s['pos'][1]} ({s['pos'][2]})"
        call = f" inside {s['comm']}" if s.get("comm") else ""
        if s.get("peer"):
            peer, tag = s["peer"]
            call += f" {toward(s['comm'], peer)}" + (f" (tag {tag})" if tag is not None else "")
        if s.get("spinning"):
            where = (f"line{'s' * (len(s['spinning']) > 1)} "
                     f"{', '.join(map(str, s['spinning']))} ({s['student'][1]}) of "
                     f"{path or 'your file'}")
            lines.append(f"rank {s['rank']}: spinning at {where}: it kept running those lines "
                         "and nothing else, waiting for something that never came"
                         f"{_phase(s)}")
            continue
        state = (f"no progress for {s['still']:.0f} s" if s["still"] >= 2 * PERIOD + 1
                 else "busy")
        lines.append(f"rank {s['rank']}: {state} at {where}{call}{_phase(s)}")
    return lines


PHASES = {"start": "while starting", "init": "while setting up the process group",
          "import": "while importing your file",
          "exit": "after the check's calls returned, waiting for the other ranks to end"}


def _phase(beat):
    """What a rank was doing, where it was not running the check's calls of your code."""
    phase = beat.get("phase")
    return f" ({PHASES.get(phase, phase)})" if phase and phase != "probe" else ""


def toward(call, peer):
    """``"to rank 1"`` for a send, ``"from rank 1"`` for a receive: a point-to-point call's
    peer in a hang report."""
    return f"{'to' if call in SENDS else 'from'} rank {peer}"


def wait_for(report):
    """What a hang report says about point-to-point waits: ``(cycle, waits)``, ``waits`` the
    ``(rank, call, peer)`` of every rank blocked in a point-to-point call whose peer is known,
    ``cycle`` the ranks of a cycle of them (each waits for the next: a deadlock) or None."""
    waits = [(s["rank"], s["comm"], s["peer"][0]) for s in report
             if s.get("comm") in P2P and s.get("peer") and not s.get("spinning")]
    towards = {rank: peer for rank, _, peer in waits}
    for start in towards:
        seen, rank = [], start
        while rank in towards and rank not in seen:
            seen.append(rank)
            rank = towards[rank]
        if rank in seen:
            return seen[seen.index(rank):], waits
    return None, waits
