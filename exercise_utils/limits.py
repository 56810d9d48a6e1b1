"""Limits at grading: what one rank and one submission may use, who enforces each, what a
rank stopped by one is told.

At grading (``make autograde``: a sandbox policy, :mod:`.sandbox`) every rank of every check
runs within the limits below; on students' own machines none applies. The grader sets them
(``scripts/course.py autograde --limit NAME=VALUE``, ``make autograde LIMITS="..."``); they
travel in the policy, so a rank cannot change them, and each is enforced by something a
student process cannot undo:

============  =========  ==================================================================
limit         default    enforced by
============  =========  ==================================================================
memory        2 GiB      per rank: ``RLIMIT_DATA`` (the rank's allocations beyond what it
                         was forked with fail: ``MemoryError``, torch's "can't allocate
                         memory"), and where the judge runs as root with cgroups (v1 or v2),
                         a memory cgroup per host: the kernel stops the rank, the judge reads
                         the cgroup's count of such stops from outside
processes     64         per rank: a pids cgroup per host (root, cgroups); a fork past it
                         fails (``BlockingIOError``)
tmp, shm      256 MiB    per rank: the sizes of its sandbox's own ``/tmp`` and ``/dev/shm``
                         (bubblewrap's ``--size``): a write past it fails (``ENOSPC``)
disk          256 MiB    per rank: bytes in its own folder, read by the judge twice a
                         second (the launch stopped past it); no one file larger
                         (``RLIMIT_FSIZE``)
output        1 MiB      per launch: bytes the ranks print (the launch stopped past it)
check         300 s      per check: wall-clock time of all its launches, below nbgrader's
                         cell timeout (600 s), so the check's own message is always the one
                         a student reads
cpu           900 s      per rank: CPU seconds (``RLIMIT_CPU``; threads count together)
hang          60 s       per launch: how long every unfinished rank may stand still (no
                         line of code changes, no CPU) before the launch is called hung
                         (:mod:`.heartbeat`); a check that asks for less keeps its own. An
                         MPI rank waiting in MPICH spins: a hang burns CPU until it is seen
============  =========  ==================================================================

A rank that hits a limit fails its check with one line naming the limit, its value and
where the rank was (:func:`verdict`). The defaults were sized from the solutions' own needs
(measured by ``tests/test_limits.py``, see docs/instructors.md, "Limits at grading"): a notebook that needs more
raises the one limit (``--limit memory=4G``).

Used by :mod:`.sandbox` (tmpfs sizes), :mod:`.hosts` (cgroups), :mod:`.harness` (the disk
and time limits, the verdicts), :mod:`.launch` (output), :mod:`.rankworker` (rlimits) and
``scripts/course.py``.
"""
import json
import os
import re
import resource
import signal
import uuid
from pathlib import Path

KEY = "limits"        # the policy's entry (:data:`.sandbox.POLICY`) that holds them
GiB, MiB = 1 << 30, 1 << 20
DEFAULTS = {"memory": 2 * GiB, "processes": 64, "tmp": 256 * MiB, "shm": 256 * MiB,
            "disk": 256 * MiB, "output": 1 * MiB, "check": 300, "cpu": 900, "hang": 60}
SECONDS = ("check", "cpu", "hang")
WHAT = {"memory": "memory", "processes": "processes", "tmp": "bytes in /tmp",
        "shm": "bytes in /dev/shm", "disk": "bytes written to its folder",
        "output": "bytes of output", "check": "seconds for the whole check",
        "cpu": "seconds of CPU time",
        "hang": "seconds every unfinished rank may stand still before a launch is hung"}


def parse(text):
    """``"memory=4G,processes=128"`` (or a list of ``NAME=VALUE``) as a dict of numbers
    (bytes, a count, seconds). Sizes take K, M, G (powers of 1024); raises ValueError with
    the names it knows on anything else."""
    items = text if isinstance(text, (list, tuple)) else [t for t in str(text).split(",") if t]
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in DEFAULTS:
            raise ValueError(f"unknown limit {item!r}: give NAME=VALUE with NAME one of "
                             f"{', '.join(DEFAULTS)} (e.g. memory=4G, processes=128, check=400)")
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)(i?B)?\s*", value, flags=re.I)
        if not match or float(match[1]) <= 0:
            raise ValueError(f"limit {name}: {value!r} is not a positive number "
                             "(sizes: 512M, 2G; counts and seconds: 64, 300)")
        scale = {"": 1, "K": 1 << 10, "M": MiB, "G": GiB}[match[2].upper()]
        if name in SECONDS or name == "processes":
            scale = 1
        out[name] = int(float(match[1]) * scale)
    return out


def resolved(overrides=None):
    """The defaults with ``overrides`` (a dict or a :func:`parse` text) on top."""
    if isinstance(overrides, str):
        overrides = parse(overrides)
    return {**DEFAULTS, **(overrides or {})}


def current():
    """The limits in force for this process (the grader's policy, inside a sandbox too), or
    None: no policy (a student's machine), or a policy without limits."""
    text = os.environ.get("DTFS_SANDBOX")
    if not text:
        return None
    try:
        found = json.loads(text).get(KEY)
    except ValueError:
        return None
    return {**DEFAULTS, **found} if found is not None else None


def size(n):
    """``n`` bytes for a message: ``2 GiB``, ``256 MiB``, ``900 KiB``."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value == int(value) or value >= 10 else f"{value:.1f} {unit}"
    return f"{n} bytes"


def shown(name, value):
    """A limit's value as a student reads it."""
    if name in SECONDS:
        return f"{value:g} s"
    if name == "processes":
        return str(value)
    return size(value)


def verdict(rank, name, value, where="", together=1):
    """The one line a rank stopped by a limit gets: which limit, its value, where the rank
    was (``where``: ``"in shard_bounds (line 12 of zero.py)"``). ``together``: the ranks
    (``rank`` None) that shared one bound, ``together`` times the limit per rank."""
    what = {"memory": f"used more than {size(together * value)} of memory",
            "processes": f"started more than {together * value} processes (threads count too)",
            "tmp": f"filled its /tmp ({size(value)})",
            "shm": f"filled its /dev/shm ({size(value)})",
            "disk": f"wrote more than {size(value)} into its folder",
            "file": f"wrote a file larger than {size(value)}",
            "output": f"printed more than {size(value)} of output",
            "cpu": f"used more than {value:g} s of CPU time"}[name]
    who = ("the ranks" if together == 1 else f"the {together} ranks") if rank is None \
        else f"rank {rank}"
    if together > 1:
        what += " together"
    name = "disk" if name == "file" else name
    return (f"{who} {what}{' ' + where if where else ''}: that is a grading limit "
            f"({name}={shown(name, value)}{' per rank' * (together > 1)}), so {'they were' if rank is None else 'it was'} stopped. Correct code needs far less: "
            "look for a loop that allocates, starts processes, writes or prints without end.")


# ---------------------------------------------------------------------- inside a rank
def apply_in_rank(found=None):
    """In a rank, before any student code: the per-process limits the kernel enforces
    (memory beyond what the rank was forked with, one file's size, CPU seconds), none of
    which a process without capabilities can raise again. Does nothing without limits."""
    found = found or current()
    if not found:
        return
    data = _vm_data()
    if data is not None:
        cap = data + int(found["memory"])
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(found["disk"]), int(found["disk"])))
    cpu = int(found["cpu"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # a write past it fails (EFBIG)
    signal.signal(signal.SIGXCPU, _over_cpu)            # past it: CPUTimeExceeded, then killed


class CPUTimeExceeded(BaseException):
    """Raised in a rank's main thread when it used up its CPU seconds (``RLIMIT_CPU``'s
    SIGXCPU): a BaseException, so that ``except Exception`` in the student's code does not
    hide it; 5 s later the kernel kills the rank."""


def _over_cpu(signum, frame):
    raise CPUTimeExceeded("the rank used up its CPU time at grading (RLIMIT_CPU)")


def _vm_data():
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmData:\s+(\d+) kB", text, flags=re.M)
    return int(match[1]) * 1024 if match else None


def from_error(report):
    """The limit a rank's own error shows it hit (its report: ``type``, ``message``), as
    ``(name, detail)``, or None. A student's own failure either way: wording only."""
    kind, text = report.get("type", ""), report.get("message", "")
    if kind == "MemoryError" or "can't allocate memory" in text or "Cannot allocate memory" in text:
        return "memory"
    if "File too large" in text or "[Errno 27]" in text:
        return "file"
    if "No space left on device" in text or "[Errno 28]" in text:
        return "shm" if "/dev/shm" in text + report.get("traceback", "") else "tmp"
    if kind == "BlockingIOError" and ("[Errno 11]" in text or "temporarily unavailable" in text):
        return "processes"
    if kind == "CPUTimeExceeded":
        return "cpu"
    return None


# ---------------------------------------------------------------------- cgroups (judge side)
def _own_paths():
    """``{controller: path of this process's cgroup}`` (v1: per controller; v2: ``""``)."""
    out = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    except OSError:
        pass
    return out


def _v1_dirs(name):
    own = _own_paths()
    dirs = {}
    for ctrl in ("memory", "pids"):
        base = Path("/sys/fs/cgroup") / ctrl
        if ctrl in own and (base / "cgroup.procs").exists():
            dirs[ctrl] = base / own[ctrl].lstrip("/") / name
    return dirs if len(dirs) == 2 else None


def _v2_dir(name):
    root = Path("/sys/fs/cgroup")
    try:
        if "memory" not in (root / "cgroup.controllers").read_text().split():
            return None
        parent = root / "dtfs"
        parent.mkdir(exist_ok=True)
        (root / "cgroup.subtree_control").write_text("+memory +pids")
        (parent / "cgroup.subtree_control").write_text("+memory +pids")
    except OSError:
        return None
    return parent / name


class Cgroup:
    """A memory and pids cgroup (v1 or v2) made by the judge for the processes of one host
    or one launch: what they use together is bounded by the kernel, and what the kernel did
    (processes it stopped for memory, forks it refused) is read here, from outside every
    sandbox. :func:`Cgroup.make` returns None where none can be made (not root, no cgroup
    file system, a container that does not delegate one)."""

    def __init__(self, dirs, v2):
        self.dirs, self.v2 = dirs, v2

    @classmethod
    def make(cls, label):
        name = f"dtfs-{os.getpid()}-{label}-{uuid.uuid4().hex[:8]}"    # (maker's pid first)
        try:
            dirs = _v1_dirs(name)
            v2 = dirs is None
            if v2:
                path = _v2_dir(name)
                if path is None:
                    return None
                dirs = {"memory": path, "pids": path}
            for d in set(dirs.values()):
                d.mkdir()
            return cls(dirs, v2)
        except OSError:
            return None

    def set(self, memory=None, processes=None):
        """Bound what the group's processes use together (bytes; processes and threads)."""
        if memory is not None:
            self._write("memory", "memory.max" if self.v2 else "memory.limit_in_bytes",
                        str(int(memory)))
        if processes is not None:
            self._write("pids", "pids.max", str(int(processes)))

    def usage(self):
        return self._int("memory", "memory.current" if self.v2 else "memory.usage_in_bytes")

    def peak(self):
        return self._int("memory", "memory.peak" if self.v2 else "memory.max_usage_in_bytes")

    def anonymous(self):
        """Bytes of the group's memory that only its processes hold (heap, tmpfs files): what
        its memory limit bounds once the page cache has been reclaimed."""
        stat = dict(line.split() for line in self._read("memory", "memory.stat").splitlines()
                    if len(line.split()) == 2)
        keys = ("anon", "shmem") if self.v2 else ("total_rss", "total_shmem")
        return sum(int(stat.get(k, 0)) for k in keys)

    def events(self):
        """``{"memory": processes the kernel stopped for memory, "processes": forks it
        refused}`` so far."""
        mem = self._read("memory", "memory.events" if self.v2 else "memory.oom_control")
        pids = self._read("pids", "pids.events")
        oom = re.search(r"^oom_kill (\d+)", mem, flags=re.M)
        refused = re.search(r"^max (\d+)", pids, flags=re.M)
        return {"memory": int(oom[1]) if oom else 0,
                "processes": int(refused[1]) if refused else 0}

    def join(self, pid=0):
        """Put ``pid`` (0: the calling process, e.g. in a ``preexec_fn``) in the group."""
        pid = pid or os.getpid()
        for d in set(self.dirs.values()):
            (d / "cgroup.procs").write_text(str(pid))

    def pids(self):
        text = self._read("pids", "cgroup.procs")
        return [int(p) for p in text.split()]

    def tasks(self):
        """The group's processes and threads (what its pids limit counts)."""
        text = self._read("pids", "cgroup.threads" if self.v2 else "tasks")
        return [int(p) for p in text.split()]

    def close(self):
        """Kill what is left in it (and in the groups made inside it: a grading job's hosts)
        and remove it."""
        import time
        for _ in range(50):
            try:
                for top in set(self.dirs.values()):
                    if not top.exists():
                        continue
                    below = sorted((d for d in top.rglob("*") if d.is_dir()),
                                   key=lambda d: -len(d.parts))
                    for d in [*below, top]:
                        for pid in (d / "cgroup.procs").read_text().split():
                            try:
                                os.kill(int(pid), signal.SIGKILL)
                            except OSError:
                                pass
                        d.rmdir()
                return
            except OSError:
                time.sleep(0.05)

    def _write(self, ctrl, name, text):
        (self.dirs[ctrl] / name).write_text(text)

    def _read(self, ctrl, name):
        try:
            return (self.dirs[ctrl] / name).read_text()
        except OSError:
            return ""

    def _int(self, ctrl, name):
        text = self._read(ctrl, name).strip()
        return int(text) if text.isdigit() else None
