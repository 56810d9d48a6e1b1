"""The checks' hosts: at grading, every rank of a launch runs as a host of its own.

Where the judge must trust nothing the ranks could touch (at grading: a sandbox policy,
:mod:`.sandbox`; in tests: ``DTFS_OBSERVE=1``), and network namespaces can be made (root,
Linux: :func:`.netns.unavailable_reason`), a check's launches run on a :class:`Pool`: the
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

Owns: :func:`wanted`, :class:`Pool` (the hosts, their zygotes, a launch's folders and
commands) and :func:`pool`. Beside it: :mod:`.hostranks` (the launcher a launch runs),
:mod:`.hostsweep` (what is left on the hosts, killed and emptied) and :mod:`.hostlimits` (the
hosts' cgroups). Called by :mod:`.harness` and :mod:`.hostlaunch` (every checker,
01_mpi_parallel_sgd onwards).
"""
import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from . import cluster, hostranks, hostsweep, netns, sandbox
from .hostlimits import HostCgroups
from .processes import TAG, die_with_parent, kill_processes

OBSERVE = "DTFS_OBSERVE"    # "1": launches on hosts outside grading too (tests, as root); "0": never
SIZE = 3                    # hosts of a pool at first: the most ranks most checks launch
PRELOAD = ("numpy", "torch", "torch.distributed", "exercise_utils.rankworker")
PORT = 29500                # host 0's port for a launch's gloo group (a fresh one per launch)


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
        _WORKS.append(netns.unavailable_reason() is None)
    return _WORKS[0]


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
        self.cgroups = HostCgroups()  # each host's limits.Cgroup (at grading, as root)
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
        group = self.cgroups.of(h)

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

    def limit_events(self, size, arm=False):
        """What the kernel stopped on each of the first ``size`` hosts so far
        (:meth:`.hostlimits.HostCgroups.events`, ``arm`` as there)."""
        return self.cgroups.events(size, arm)

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
        hostsweep.stop_zygotes(self.zygotes)
        self.zygotes = {}

    def close(self):
        """Stop every zygote and what is left on the hosts, take the mesh down, remove the
        hosts' folders."""
        try:
            self._stop_zygotes()
            from .processes import tagged_processes
            kill_processes(tagged_processes(self.tag), grace=0.2)
        finally:
            self.cgroups.close()
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
        first failing rank's (:func:`.hostranks.main`)."""
        for r in range(len(ranks)):
            self._zygote(r)
        ctl = self.root / "ctl"
        spec = [(ctl / f"h{r}.sock", args, cwd) for r, (args, cwd) in enumerate(ranks)]
        return hostranks.command(ctl / f"launch{self.launches}.json", spec,
                                 self.net.hosts[0].address, preload)

    def mpi_command(self, world_size, worker_args, preload):
        """``mpiexec`` over the first ``world_size`` hosts, started on host 0: each host's
        hydra proxy runs a stub that hands its rank to the host's zygote (``{host}`` in
        ``worker_args`` reads as the host's name)."""
        for r in range(world_size):
            self._zygote(r)
        stub = [sys.executable, "-P", "-m", "exercise_utils.zygote", "--stub",
                str(self.root / "ctl"), *[a for n in preload for a in ("--preload", n)], "--",
                *worker_args]
        return cluster.mpiexec_on(self.net.hosts[:world_size], stub, self.root / "ctl" / "ssh")

    def port(self):
        """A port for this launch's group on host 0 (none of an earlier launch's sockets can
        still hold it)."""
        return PORT + self.launches % 2000

    def link_bytes(self, world_size=None):
        """Bytes sent so far on every directed link between the first ``world_size`` hosts."""
        n = world_size or self.size
        return {(i, j): b for (i, j), b in self.net.link_bytes().items() if i < n and j < n}

    def strays(self, size):
        """``{host: [psutil processes]}`` left on the first ``size`` hosts outside their
        zygotes' trees (:func:`.hostsweep.strays`)."""
        return hostsweep.strays(self.zygotes, size)

    def sweep(self):
        """Kill whatever is left running on the hosts, sparing each zygote and the processes
        above it (:func:`.hostsweep.sweep`)."""
        hostsweep.sweep(self.zygotes, self.size)

    def reset(self):
        """Between two checks: nothing of the last one is left on the hosts. Every process
        but the zygotes is killed; each host's ``/tmp`` and ``/dev/shm`` (its sandbox's own,
        reached through ``/proc/<zygote>/root``) and the launches' folders are emptied. The
        zygotes stay: the next check's ranks fork from them (no torch to import again)."""
        self.sweep()
        hostsweep.empty_sandboxes(self.zygotes)
        for h in range(self.size):
            for sub in ("w", "in"):
                hostsweep.empty(self.root / f"h{h}" / sub)


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
