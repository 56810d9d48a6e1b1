"""The checks' hosts: at grading, every rank of a launch runs as a host of its own.

Where the judge must trust nothing the ranks could touch (at grading: a sandbox policy,
:mod:`.sandbox`; in tests: ``DTFS_OBSERVE=1``), and network namespaces can be made (root,
Linux: :func:`.cluster.unavailable_reason`), a check's launches run on a :class:`Pool`: the
hosts of a mesh (:class:`.cluster.Cluster` with ``mesh=True``: a cable of its own between every
two hosts), each with a *zygote* (:mod:`.zygote`: a process that imported torch once and forks
a rank for each launch) inside a sandbox of its own, in its host's network namespace. Rank r of
every launch runs on host r, so the ranks of one launch

* share no writable place: each has its own folder (its beats, its report, its salt; the
  judge's inputs, the student's file and the probe's arguments, beside it read-only), its own
  ``/tmp`` and ``/dev/shm``, and sees no other rank's;
* share no loopback: each host has its own, and another host only through its cable;
* cannot signal or read each other: a pid namespace per sandbox, no capability;

so every byte between them crosses a link whose counters the judge reads from outside
(:meth:`Pool.link_bytes`), whatever they do to the recorders in their own memory. MPI too:
``mpiexec`` (MPICH's hydra) runs on host 0 and reaches the others through a stand-in for
``ssh`` (:meth:`.cluster.Cluster.mpiexec_command`), its ranks forked by the hosts' zygotes and
talking over TCP (:data:`.cluster.MPI_OVER_LINKS`). Nothing a rank writes is in the judge's
working directory or on any import path of the judge's processes: they only read its report,
as plain data (:mod:`.plaindata`), and its beats.

A zygote listens on a socket the judge bound (at a path no sandbox sees) and handed to it as a
descriptor: no rank can put a socket of its own in its place. After every launch the hosts are
swept: whatever a launch left running there is killed, the zygotes spared. The hosts last as
long as the process (:func:`pool`: a grading kernel grades every check of a submission on
them, importing torch once per host); when a check ends they are reset (:meth:`Pool.reset`:
every process but the zygotes killed, every host's ``/tmp``, ``/dev/shm`` and folders
emptied).

Elsewhere (students' machines) checks run as before: their ranks forked by one zygote, with
one loopback (:mod:`.harness`).

Used by :mod:`.harness` (every checker, 01_mpi_parallel_sgd onwards).
"""
import atexit
import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from . import cluster, limits, sandbox
from .processes import TAG, _is_alive, die_with_parent, kill_processes

OBSERVE = "DTFS_OBSERVE"    # "1": launches on hosts outside grading too (tests, as root); "0": never
SIZE = 3                    # hosts of a pool at first: the most ranks most checks launch
PRELOAD = ("numpy", "torch", "torch.distributed", "exercise_utils.rankworker")
PORT = 29500                # host 0's port for a launch's gloo group (a fresh one per launch)
START_LIMIT = 300           # seconds a host's zygote may take to import what it preloads
ZYGOTE_MEMORY = 1 << 30     # at grading, a host's memory: its rank's limit and this (the zygote)
ZYGOTE_TASKS = 32           # ... its processes and threads: its rank's limit and these


def wanted():
    """Whether launches run on hosts: at grading (a sandbox policy) or with ``DTFS_OBSERVE=1``,
    where network namespaces can be made; never with ``DTFS_OBSERVE=0``."""
    choice = os.environ.get(OBSERVE)
    if choice == "0" or (choice != "1" and sandbox.policy() is None):
        return False
    return namespaces_work()


_WORKS = []


def namespaces_work():
    """Whether network namespaces can be made here (asked once per process)."""
    if not _WORKS:
        _WORKS.append(cluster.unavailable_reason() is None)
    return _WORKS[0]


class ZygoteLost(RuntimeError):
    """A host's zygote is gone (it is started anew at the next launch)."""


class Pool:
    """Hosts for a check's launches (see the module docstring); grown when a launch needs more.

    Args:
        size: hosts to start with.
    """

    def __init__(self, size=SIZE):
        # (not "<pid>:...", the tag of a launch of this process: what outlives every launch
        # is no launch's process left behind, notebooks 03 and 05 count those)
        self.tag = f"hosts-{os.getpid()}:{uuid.uuid4().hex}"
        self.root = Path(tempfile.mkdtemp(prefix="dtfs-hosts-"))
        (self.root / "ctl").mkdir()
        self.net, self.size, self.launches = None, 0, 0
        self.visible = sandbox.own_install()   # under /tmp, yet in the zygotes' sight
        self.zygotes = {}            # host -> {"proc", "listener", "errors"}
        self.cgroups = {}            # host -> its limits.Cgroup (at grading, as root)
        self.peaks = {}              # host -> most tasks above the zygote's, most memory seen
        self._grow(size)

    # ------------------------------------------------------------------ hosts and zygotes
    def _grow(self, size):
        """Hosts for ``size`` ranks: a new mesh when the current one is smaller (its zygotes
        stopped), with every zygote started at once (each imports torch: on 2 cores the
        imports overlap)."""
        if size <= self.size:
            return
        self._stop_zygotes()
        if self.net is not None:
            self.net.down()
        self.net = cluster.Cluster(size, mesh=True).up()
        self.size = size
        for host in self.net.hosts:
            for sub in ("w", "in"):
                (self.root / host.name / sub).mkdir(parents=True, exist_ok=True)
        for h in range(size):
            self._start_zygote(h)

    def _start_zygote(self, h):
        host = self.net.hosts[h]
        path = self.root / "ctl" / f"{host.name}.sock"
        path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(64)
        fd = listener.fileno()
        inner = [sys.executable, "-P", "-m", "exercise_utils.zygote", "--listen-fd", str(fd),
                 *[a for name in PRELOAD for a in ("--preload", name)]]
        home = self.root / host.name
        sandboxed = sandbox.unavailable() is None
        if sandboxed:
            rules = sandbox.policy() or {}
            extra = [os.getcwd()] if sandbox.weakened("kernel-folder") else []
            inner = sandbox.command(inner, writable=[home / "w", *extra], readable=[home],
                                    hidden=rules.get("hidden", ()), network=True,
                                    cwd=home / "w")
        errors = self.root / "ctl" / f"{host.name}.err"
        env = {**os.environ, TAG: self.tag, "PYTHONSAFEPATH": "1", "TMPDIR": "/tmp"}
        group = self._cgroup(h)

        def start():
            die_with_parent()
            if group is not None:
                group.join()
        with open(errors, "ab") as err:
            proc = subprocess.Popen(host.wrap(inner), pass_fds=[fd], env=env,
                                    stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                    start_new_session=True, preexec_fn=start)
        listener.close()     # the zygote's now: once it is gone, a connection is refused
        self.zygotes[h] = {"proc": proc, "errors": errors, "sandboxed": sandboxed}

    def _cgroup(self, h):
        """Host ``h``'s cgroup at grading (:mod:`.limits`: memory and processes bounded by
        the kernel for everything on the host, its zygote included, which holds about
        :data:`ZYGOTE_MEMORY` of its own), or None: no limits, or no cgroups here."""
        found = limits.current()
        if not found:
            return None
        if h not in self.cgroups:
            group = limits.Cgroup.make(f"h{h}")
            if group is None:
                return None
            group.set(memory=int(found["memory"]) + ZYGOTE_MEMORY,
                      processes=int(found["processes"]) + ZYGOTE_TASKS)
            self.cgroups[h] = group
        return self.cgroups[h]

    def limit_events(self, size, arm=False):
        """``[{"memory": n, "processes": n} or None for each of the first size hosts]``: what
        the kernel stopped on each so far (:meth:`.limits.Cgroup.events`). ``arm``: first
        let each host's processes and threads grow by the limit from what runs there now
        (its sandbox and zygote, swept of any launch's)."""
        found = limits.current()
        for h in range(size):
            group = self.cgroups.get(h)
            if group is None:
                continue
            tasks, peak = len(group.tasks()), self.peaks.setdefault(h, {"tasks": 0, "memory": 0})
            if arm and found:
                peak["base"] = tasks
                peak["zygote"] = min(peak.get("zygote", 1 << 62), group.anonymous())
                group.set(processes=tasks + int(found["processes"]))
            elif "base" in peak:    # (what the solutions need: DTFS_LIMITS_LOG, see close)
                peak["tasks"] = max(peak["tasks"], tasks - peak["base"])
                peak["memory"] = max(peak["memory"], group.anonymous())
        return [self.cgroups[h].events() if h in self.cgroups else None for h in range(size)]

    def _zygote(self, h):
        """Host ``h``'s zygote, started anew where the last one is gone."""
        state = self.zygotes.get(h)
        if state is not None and state["proc"].poll() is not None and not state.get("told"):
            print(f"note: {self.lost(h)}; it was started anew.", file=sys.stderr, flush=True)
        if state is None or state["proc"].poll() is not None:
            self._start_zygote(h)
        return self.zygotes[h]

    def lost(self, h):
        """What is known of why host ``h``'s zygote stopped (exit status, its stderr's end);
        the next launch starts a new one."""
        state = self.zygotes.get(h)
        if state is None:
            return "never started"
        code = state["proc"].poll()
        state["told"] = code is not None    # (said once: the restart does not say it again)
        tail = " | ".join(state["errors"].read_text(errors="replace").strip().splitlines()[-6:])
        return (f"host h{h}'s zygote: {'exit status ' + str(code) if code is not None else 'running'}"
                f"; its stderr: {tail or '(empty)'}")

    def _stop_zygotes(self):
        for state in self.zygotes.values():
            proc = state["proc"]
            try:
                import psutil
                inside = psutil.Process(proc.pid).children(recursive=True)
            except Exception:     # noqa: BLE001 - already gone
                inside = []
            proc.kill()
            proc.wait()
            kill_processes(inside, grace=0.2)
        self.zygotes = {}

    def close(self):
        """Stop every zygote and what is left on the hosts, take the mesh down, remove the
        hosts' folders."""
        try:
            self._stop_zygotes()
            from .processes import tagged_processes
            kill_processes(tagged_processes(self.tag), grace=0.2)
        finally:
            log = os.environ.get("DTFS_LIMITS_LOG")
            if log and self.peaks:        # measuring the solutions' needs (tests/test_limits.py)
                with open(log, "a") as f:
                    f.write(json.dumps({"cwd": os.getcwd(), "peaks": self.peaks}) + "\n")
            for group in self.cgroups.values():
                group.close()
            self.cgroups = {}
            if self.net is not None:
                self.net.down()
                self.net = None
            shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ launches
    def prepare(self, world_size, student, kwargs):
        """Folders of one launch: for rank r on host r, its own writable folder (returned) and,
        read-only beside it, the probe's arguments (``kwargs``, bytes) and, at grading, a copy
        of the student's file (the submission's folder is in no sandbox's sight; elsewhere
        the file is read where it is, unless it lies in ``/tmp``, which a sandbox has of its
        own). Returns ``(folders, students, kwargs files)``, one per rank."""
        self._grow(world_size)
        self.launches += 1
        k, name = self.launches, Path(student).name
        where = Path(student).resolve()
        private = (any(where.is_relative_to(p) for p in ("/tmp", "/dev/shm"))
                   and not any(where.is_relative_to(p) for p in self.visible))
        copy = sandbox.policy() is not None or private    # (a sandbox's /tmp is its own)
        data = Path(student).read_bytes() if copy else None
        folders, students, kwfiles = [], [], []
        for r in range(world_size):
            home = self.root / f"h{r}"
            inputs = home / "in" / f"L{k}"
            inputs.mkdir()
            if data is not None:
                (inputs / name).write_bytes(data)
            (inputs / "kwargs.pkl").write_bytes(kwargs)
            own = home / "w" / f"L{k}"
            own.mkdir()
            folders.append(own)
            students.append(inputs / name if data is not None else Path(student).resolve())
            kwfiles.append(inputs / "kwargs.pkl")
        return folders, students, kwfiles

    def command(self, ranks, preload):
        """The judge's launcher of one gloo (or lone-process) launch: ``ranks`` is a list of
        ``(worker arguments, working directory)``, rank r on host r. Its exit status is the
        first failing rank's (:func:`_launch_ranks`)."""
        for r in range(len(ranks)):
            self._zygote(r)
        master = self.net.hosts[0].address
        spec = {"ranks": [{"socket": str(self.root / "ctl" / f"h{r}.sock"), "args": args,
                           "cwd": str(cwd)} for r, (args, cwd) in enumerate(ranks)],
                "master": master, "preload": list(preload)}
        path = self.root / "ctl" / f"launch{self.launches}.json"
        path.write_text(json.dumps(spec))
        return [sys.executable, "-P", "-m", "exercise_utils.hosts", "ranks", str(path)]

    def mpi_command(self, world_size, worker_args, preload):
        """``mpiexec`` over the first ``world_size`` hosts, started on host 0: each host's
        hydra proxy runs a stub that hands its rank to the host's zygote (``{host}`` in
        ``worker_args`` reads as the host's name)."""
        for r in range(world_size):
            self._zygote(r)
        from .launch import find_executable
        hosts = self.net.hosts[:world_size]
        launcher = self.root / "ctl" / "ssh"
        cases = "".join(f'  {h.name}) exec ip netns exec {h.netns} nsenter --uts={h.uts} '
                        f'bash -c "$*";;\n' for h in hosts)
        launcher.write_text('#!/bin/bash\n[ "$1" = "-x" ] && shift\nhost="$1"; shift\n'
                            f'case "$host" in\n{cases}esac\nexit 127\n')
        launcher.chmod(0o700)
        stub = [sys.executable, "-P", "-m", "exercise_utils.zygote", "--stub",
                str(self.root / "ctl"), *[a for n in preload for a in ("--preload", n)], "--",
                *worker_args]
        return hosts[0].wrap([find_executable("mpiexec"), "-launcher", "ssh",
                              "-launcher-exec", str(launcher), "-hosts",
                              ",".join(h.name for h in hosts), "-n", str(world_size),
                              "-ppn", "1", *stub])

    def port(self):
        """A port for this launch's group on host 0 (none of an earlier launch's sockets can
        still hold it)."""
        return PORT + self.launches % 2000

    def link_bytes(self, world_size=None):
        """Bytes sent so far on every directed link between the first ``world_size`` hosts."""
        n = world_size or self.size
        return {(i, j): b for (i, j), b in self.net.link_bytes().items() if i < n and j < n}

    def _zygote_processes(self):
        """``{host: the zygote's psutil process}`` for every host whose zygote runs."""
        import psutil
        found = {}
        for h, state in self.zygotes.items():
            try:
                below = psutil.Process(state["proc"].pid).children(recursive=True)
            except psutil.Error:
                continue
            zygote = next((p for p in below if _is_zygote(p) and not _is_zygote(_parent(p))),
                          None)
            if zygote is not None:
                found[h] = zygote
        return found

    def strays(self, size):
        """``{host: [psutil processes]}`` left on each of the first ``size`` hosts outside its
        zygote's tree: what a rank started and cut loose (a daemon: a new session, its parent
        gone), which outlives its launch; empty hosts left out. Only kills say more."""
        import psutil
        zygotes, found = self._zygote_processes(), {}
        for h in range(size):
            state, zygote = self.zygotes.get(h), zygotes.get(h)
            if state is None or zygote is None:
                continue
            try:
                below = psutil.Process(state["proc"].pid).children(recursive=True)
                keep = {zygote.pid} | {p.pid for p in zygote.children(recursive=True)}
                keep |= {p.pid for p in zygote.parents()}
            except psutil.Error:
                continue
            left = [p for p in below if p.pid not in keep and _is_alive(p)]
            if left:
                found[h] = left
        return found

    def sweep(self):
        """Kill whatever is left running on the hosts (a rank's children, a daemon it
        started), sparing each zygote and the processes above it."""
        import psutil
        victims = []
        for zygote in self._zygote_processes().values():
            try:
                victims += zygote.children(recursive=True)
            except psutil.Error:
                pass
        for left in self.strays(self.size).values():
            victims += left
        kill_processes(victims, grace=0.2)

    def reset(self):
        """Between two checks: nothing of the last one is left on the hosts. Every process
        but the zygotes is killed; each host's ``/tmp`` and ``/dev/shm`` (its sandbox's own,
        reached through ``/proc/<zygote>/root``) and the launches' folders are emptied. The
        zygotes stay: the next check's ranks fork from them (no torch to import again)."""
        self.sweep()
        for h, zygote in self._zygote_processes().items():
            # (bare, without bwrap, a zygote's /tmp is the machine's: never emptied)
            if self.zygotes[h]["sandboxed"] and _sandboxed(zygote.pid):
                for inside in ("/tmp", "/dev/shm"):
                    _empty_inside(zygote.pid, inside)
        for h in range(self.size):
            for sub in ("w", "in"):
                _empty(self.root / f"h{h}" / sub)


def _empty(folder):
    """Remove everything inside ``folder`` (which stays)."""
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink()
        except OSError:
            pass


def _empty_inside(pid, folder):
    """Remove everything inside ``folder`` as process ``pid`` (in a sandbox) sees it, but the
    mount points there and the folders that lead to them (the sandbox's binds: its host's
    folders, the course's checkout; removing one from outside would detach it)."""
    try:
        with open(f"/proc/{pid}/mountinfo") as info:
            mounts = {line.split()[4] for line in info}
    except OSError:
        return
    top = f"/proc/{pid}/root"

    def clean(inside):
        try:
            names = os.listdir(top + inside)
        except OSError:
            return
        for name in names:
            path = f"{inside.rstrip('/')}/{name}"
            if path in mounts:
                continue
            if any(m.startswith(path + "/") for m in mounts):
                clean(path)
                continue
            full = Path(top + path)
            try:
                if full.is_dir() and not full.is_symlink():
                    shutil.rmtree(full, ignore_errors=True)
                else:
                    full.unlink()
            except OSError:
                pass
    clean(folder)


_POOL = []          # this process's hosts: started at the first launch on hosts


def pool(size=SIZE):
    """This process's :class:`Pool`, started now if need be and grown to ``size`` hosts. It
    lasts as long as the process (a grading kernel: every check of a submission; a test
    worker): between two checks :meth:`Pool.reset` leaves nothing of the last one behind."""
    if not _POOL:
        _POOL.append(Pool(max(SIZE, size)))
    _POOL[0]._grow(size)
    return _POOL[0]


def live_tags():
    """The tags of this process's hosts' processes (the zygotes: they outlive every check)."""
    return {p.tag for p in _POOL}


@atexit.register
def close_pool():
    """Stop this process's hosts (at exit)."""
    while _POOL:
        _POOL.pop().close()


def _parent(proc):
    try:
        return proc.parent()
    except Exception:     # noqa: BLE001
        return None


def _is_zygote(proc):
    """Whether ``proc`` is a zygote's Python (or a rank it forked: the same command line),
    not one of the processes that started it (``bwrap``'s hold the command line too)."""
    try:
        return proc is not None and proc.cmdline()[1:4] == ["-P", "-m", "exercise_utils.zygote"]
    except Exception:     # noqa: BLE001
        return False


def _sandboxed(pid):
    """Whether process ``pid`` sees a ``/tmp`` and a ``/dev/shm`` of its own (a sandbox's:
    never the machine's, which ``ip netns exec`` alone, a mount namespace of its own, still
    shows: emptying that one would empty the machine's)."""
    try:
        for folder in ("/tmp", "/dev/shm"):
            inside, here = os.stat(f"/proc/{pid}/root{folder}"), os.stat(folder)
            if (inside.st_dev, inside.st_ino) == (here.st_dev, here.st_ino):
                return False
        return True
    except OSError:
        return False


def _launch_ranks(spec_path):
    """The launcher: ask each host's zygote for its rank (with this process's output
    descriptors and environment, RANK, WORLD_SIZE, MASTER_ADDR), wait for their exit
    statuses, and exit with the first non-zero one, closing the other connections (their
    zygotes kill those ranks) as soon as one fails. A zygote that cannot be reached, or that
    closed a connection without a status, makes it exit with :data:`.zygote.LOST`."""
    from .zygote import LOST, request
    spec = json.loads(Path(spec_path).read_text())
    n = len(spec["ranks"])
    base = dict(os.environ)
    conns = {}
    try:
        for r, rank in enumerate(spec["ranks"]):
            env = {**base, "RANK": str(r), "LOCAL_RANK": "0", "WORLD_SIZE": str(n),
                   "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": spec["master"], "TMPDIR": "/tmp"}
            try:
                conns[r] = request(rank["socket"], rank["args"], env, preload=spec["preload"],
                                   cwd=rank["cwd"])
            except OSError as exc:
                print(f"hosts: rank {r}'s zygote could not be reached ({exc})", file=sys.stderr,
                      flush=True)
                sys.exit(LOST)
    except BaseException:
        for conn in conns.values():
            conn.close()
        raise
    sel = selectors.DefaultSelector()
    for r, conn in conns.items():
        sel.register(conn, selectors.EVENT_READ, r)
    statuses, code = {}, 0
    while len(statuses) < n and not code:
        for key, _ in sel.select(timeout=1.0):
            data = b""
            try:
                while chunk := key.fileobj.recv(64):  # (the zygote closes after the status)
                    data += chunk
            except OSError:                           # (a zygote gone before it accepted)
                data = b""
            sel.unregister(key.fileobj)
            statuses[key.data] = int(data) if data.strip() else LOST
            code = code or statuses[key.data]
    for conn in conns.values():
        conn.close()
    sys.exit(abs(code))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "ranks":
        _launch_ranks(sys.argv[2])
    else:
        sys.exit("python -m exercise_utils.hosts ranks SPEC")
