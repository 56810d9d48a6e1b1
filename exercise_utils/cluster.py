"""A cluster on one machine: hosts with their own network stack, joined by shaped links.

Each *host* is a Linux network namespace with one interface, ``eth0``, and its own address
(10.42.0.1, 10.42.0.2, ...). The hosts' cables (veth pairs) meet at a switch (a bridge in one
more namespace), so the machine's own network is never touched and runs never collide. Each
host's link can be shaped to a rate in both directions (``100mbit``, ``1gbit``, ...; ``None``
leaves it unshaped): a token bucket that limits bandwidth only, no delay (:mod:`.links`: the
rates, the shaping, the counters, a measured rate).

Each host also has its own hostname, ``h0``, ``h1``, ... (a UTS namespace), which every host
resolves to that host's address (a per-namespace ``/etc/hosts``, which ``ip netns exec``
mounts): torchrun's c10d rendezvous (its workers' MASTER_ADDR is the first agent's hostname)
and gloo find their addresses exactly as on a real cluster, without extra settings. Commands
run on a host through :mod:`exercise_utils.launch` (live output, a hard timeout, every process
killed at the end).

Needs Linux, root (``sudo``; Colab runs as root) and ``ip``/``tc`` (Debian: ``iproute2``).
Otherwise :class:`ClusterUnavailable` says why and what to do (:func:`unavailable_reason`), and
the notebooks fall back to their loopback version. Namespaces are named ``dtfs-<pid>-<id>-...``
(:mod:`.netns`: the namespaces themselves, and the removal of what a dead owner left):
:meth:`Cluster.down` removes them (also on errors and Ctrl-C, and at interpreter exit), and
every new cluster first removes those whose creating process is dead (``python -m
exercise_utils.cluster cleanup`` does it by hand)::

    with cluster.Cluster(2, rate="100mbit") as c:
        c.run(c.hosts[0], ["python", "-c", "import socket; print(socket.gethostname())"])
        print(c.measure(c.hosts[0], c.hosts[1]), "Mbit/s")

Called by :mod:`.hosts` (a mesh for the checks' ranks) and the network sections of the
notebooks. Used in 03_torch_distributed_collectives, 05_ddp_torchrun_fault_tolerance,
06_build_your_own_ddp, 08_bonus_powersgd and 10_bonus_model_parallel.
"""
import atexit
import json
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from . import links
from .commands import FRESH_STORE_ENV, agent_command, find_executable
from .netns import NETNS_ETC, PREFIX, UTS_DIR, ip, remove, remove_stale, tool
from .netns import unavailable_reason  # noqa: F401 - home: netns (the notebooks ask cluster)

SUBNET = "10.42.0"            # host i has SUBNET.(i + 1)/24; namespaces keep runs apart
MESH_MAX = 8                  # hosts of a mesh: n * (n - 1) / 2 cables
MPI_OVER_LINKS = {"UCX_TLS": "tcp,self"}   # MPICH's data over TCP (:meth:`Cluster.mpiexec_command`)
_LIVE = set()                 # clusters up in this process, torn down at exit


class ClusterUnavailable(RuntimeError):
    """This machine cannot make network namespaces (not root, not Linux, no iproute2)."""


def require():
    """Raise :class:`ClusterUnavailable` with the reason and the fix unless clusters work."""
    reason = unavailable_reason()
    if reason:
        raise ClusterUnavailable(f"cannot start a cluster on this machine: {reason}. The "
                                 "notebooks then run the loopback version (one network stack).")


@dataclass
class Host:
    """One host: its namespace ``netns``, its address, and its name ``h<index>``."""
    index: int
    netns: str
    address: str

    @property
    def name(self):
        return f"h{self.index}"

    @property
    def uts(self):
        return UTS_DIR / self.netns

    def wrap(self, cmd):
        """``cmd`` (a list) run on this host: its network (and /etc/hosts), its hostname."""
        return ["ip", "netns", "exec", self.netns, "nsenter", f"--uts={self.uts}",
                *map(str, cmd)]


class Cluster:
    """``hosts`` hosts on a switch, each link shaped to ``rate`` (see the module docstring).

    Args:
        hosts: number of hosts (2 to 200).
        rate: each host's link rate in both directions (``"100mbit"``, ``"1gbit"``, ...;
            None: unshaped). Change it later with :meth:`shape`.
        mesh: instead of a switch, a cable of its own between every two hosts (2 to 8
            hosts): host i reaches host j only through its interface ``p<j>``, so the
            kernel's counters of that interface are the bytes of the directed link i -> j
            (:meth:`link_bytes`).
    Raises:
        ClusterUnavailable: not root, not Linux or no iproute2 (the message says what to do).
    """

    def __init__(self, hosts=2, rate=None, mesh=False):
        if not 2 <= int(hosts) <= (MESH_MAX if mesh else 200):
            raise ValueError(f"a {'mesh ' * mesh}cluster needs 2 to "
                             f"{MESH_MAX if mesh else 200} hosts, got {hosts}")
        links.rate_bits(rate)
        self.rate, self.mesh = rate, bool(mesh)
        run_id = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.switch = None if mesh else f"{run_id}-sw"
        self.hosts = [Host(i, f"{run_id}-h{i}", f"{SUBNET}.{i + 1}") for i in range(int(hosts))]
        self._up = False

    # ------------------------------------------------------------------ up and down
    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()

    def up(self):
        """Create the switch, the hosts and their links; return self."""
        require()
        remove_stale()
        _LIVE.add(self)
        self._up = True
        try:
            if not self.mesh:
                ip("netns", "add", self.switch)
                ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
                ip("-n", self.switch, "link", "set", "br0", "up")
            for host in self.hosts:
                self._add(host)
            if self.mesh:
                for a in self.hosts:
                    for b in self.hosts[a.index + 1:]:
                        self._cable(a, b)
            self.shape(self.rate)
        except BaseException:
            self.down()
            raise
        return self

    def _add(self, host):
        ip("netns", "add", host.netns)
        if not self.mesh:
            port = f"p{host.index}"
            ip("link", "add", "eth0", "netns", host.netns, "type", "veth",
               "peer", "name", port, "netns", self.switch)
            ip("-n", self.switch, "link", "set", port, "master", "br0")
            ip("-n", self.switch, "link", "set", port, "up")
            ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            ip("-n", host.netns, "link", "set", "eth0", "up")
        ip("-n", host.netns, "link", "set", "lo", "up")
        etc = NETNS_ETC / host.netns
        etc.mkdir(parents=True, exist_ok=True)
        # the v4-mapped IPv6 form too: c10d reverse-resolves its peers from IPv6 sockets
        names = ["127.0.0.1 localhost"] + [f"{a}{h.address} {h.name}" for h in self.hosts
                                           for a in ("", "::ffff:")]
        (etc / "hosts").write_text("\n".join(names) + "\n")
        UTS_DIR.mkdir(parents=True, exist_ok=True)
        host.uts.touch()
        tool(["unshare", f"--uts={host.uts}", sys.executable, "-c",
             f"import socket; socket.sethostname({host.name!r})"])

    def down(self):
        """Kill every process on the hosts, delete every namespace and its files. Idempotent.

        Raises:
            RuntimeError: a namespace could not be deleted (named, with the error).
        """
        if not self._up:
            return
        self._up = False
        _LIVE.discard(self)
        problems = [p for ns in [h.netns for h in self.hosts] + [self.switch]
                    if ns for p in [remove(ns)] if p]
        if problems:
            raise RuntimeError("cluster teardown left: " + "; ".join(problems))

    def _cable(self, a, b):
        """A mesh's cable between hosts ``a`` and ``b``: ``a``'s ``p<b>`` to ``b``'s ``p<a>``;
        each host keeps its one address on all its interfaces, with a route per peer."""
        ip("link", "add", f"p{b.index}", "netns", a.netns, "type", "veth",
           "peer", "name", f"p{a.index}", "netns", b.netns)
        for me, peer in ((a, b), (b, a)):
            dev = f"p{peer.index}"
            ip("-n", me.netns, "addr", "add", f"{me.address}/32", "dev", dev)
            ip("-n", me.netns, "link", "set", dev, "up")
            ip("-n", me.netns, "route", "add", f"{peer.address}/32", "dev", dev,
               "src", me.address)

    # ------------------------------------------------------------------ links
    def _devices(self):
        """``(netns, interface)`` of every sending end: both ends of every cable."""
        if self.mesh:
            return [(h.netns, f"p{p.index}") for h in self.hosts for p in self.hosts if p is not h]
        return [(ns, dev) for h in self.hosts
                for ns, dev in ((h.netns, "eth0"), (self.switch, f"p{h.index}"))]

    def link_bytes(self):
        """Bytes sent so far on every directed link of a mesh: ``{(i, j): bytes}`` for host i
        to host j, as the kernel counts them on i's interface ``p<j>`` (every byte on the
        wire: TCP/IP headers, the connections' set-up and acknowledgements included).

        Raises:
            ValueError: the cluster is not a mesh (a switch's links are shared by all peers).
        """
        if not self.mesh:
            raise ValueError("link_bytes needs Cluster(..., mesh=True): on a switch a host's "
                             "one link carries its traffic to every peer")
        out = {}
        for host in self.hosts:
            sent = links.sent_bytes(host.netns)
            for peer in self.hosts:
                if peer is not host:
                    out[host.index, peer.index] = sent[f"p{peer.index}"]
        return out

    def shape(self, rate):
        """Shape every host's link to ``rate`` in both directions (None: unshaped)."""
        links.rate_bits(rate)          # (a bad rate changes nothing)
        self.rate = rate
        links.shape(self._devices(), rate)

    # ------------------------------------------------------------------ running commands
    def run(self, host, cmd, **kwargs):
        """Run ``cmd`` on ``host`` with :func:`exercise_utils.launch.run` (same kwargs)."""
        from . import launch
        kwargs.setdefault("what", f"`{' '.join(map(str, cmd))}` on {host.name}")
        kwargs["env"] = {**self.env(), **(kwargs.get("env") or {})}
        return launch.run(host.wrap(cmd), **kwargs)

    def run_many(self, jobs, **kwargs):
        """Run ``[(host, cmd), ...]`` at the same time, labelled with the hosts' names, with
        :func:`exercise_utils.launch_many.run_many` (same kwargs)."""
        from . import launch_many
        kwargs.setdefault("labels", [host.name for host, _ in jobs])
        kwargs["env"] = {**self.env(), **(kwargs.get("env") or {})}
        return launch_many.run_many([host.wrap(cmd) for host, cmd in jobs], **kwargs)

    def torchrun_command(self, script, nproc_per_node=1, args=(), module=False, extra=(),
                         rdzv_id="dtfs-job", port=29400, fork=False):
        """The torchrun agent command every host runs for one job over all the hosts, with
        the c10d rendezvous on ``h0:<port>`` (arguments:
        :func:`exercise_utils.commands.agent_command`; ``fork``: what :meth:`torchrun` runs, an
        agent and workers forked on each host)."""
        return agent_command(script, len(self.hosts), nproc_per_node,
                             f"{self.hosts[0].name}:{port}", rdzv_id, args, module, extra=extra,
                             fork=fork)

    def torchrun(self, script, nproc_per_node=1, args=(), module=False, extra=(),
                 rdzv_id="dtfs-job", **kwargs):
        """Run one torchrun job with an agent on every host (:meth:`torchrun_command`);
        ``kwargs`` as :meth:`run_many`. Returns the hosts' results."""
        cmd = self.torchrun_command(script, nproc_per_node, args, module, extra, rdzv_id,
                                    fork=True)
        kwargs.setdefault("nprocs", nproc_per_node)
        kwargs["env"] = {**FRESH_STORE_ENV, **(kwargs.get("env") or {})}
        return self.run_many([(host, cmd) for host in self.hosts], **kwargs)

    def mpiexec_command(self, cmd, launcher):
        """``mpiexec`` (MPICH's hydra) running ``cmd`` once on every host, started on host 0:
        hydra reaches the other hosts through ``launcher``, an executable file this writes (a
        stand-in for ``ssh`` that enters the host's namespaces), and the ranks find each other
        at the hosts' addresses. MPICH's UCX moves data between processes of one machine
        through shared memory whatever their network: :data:`MPI_OVER_LINKS` (in the command's
        environment) makes it use TCP, so that the data crosses the links."""
        return mpiexec_on(self.hosts, cmd, launcher)

    def env(self):
        """Environment for commands on the hosts: MASTER_ADDR is host 0's address."""
        return {"MASTER_ADDR": self.hosts[0].address}

    def measure(self, src, dst, mbytes=20, timeout=60):
        """Send ``mbytes`` MB over TCP from ``src`` to ``dst``; return the rate in Mbit/s."""
        port = "5201"
        server = [sys.executable, "-m", links.__name__, "serve", port]
        client = [sys.executable, "-m", links.__name__, "send", dst.address, port, str(mbytes)]
        results = self.run_many([(dst, server), (src, client)], timeout=timeout, echo=False,
                                what=f"the {mbytes} MB transfer {src.name} -> {dst.name}")
        return json.loads(results[1].output.strip().splitlines()[-1])["mbit_per_s"]


def each_rate(module, args, rates, out, what, hosts=2, timeout=180):
    """Run the torchrun script ``module`` (one worker per host, one thread each) once per link
    rate on a fresh :class:`Cluster`; it gets ``args`` and ``--out <file>`` and writes
    ``{"rows": [...]}`` there. Yields ``(rate name, bit/s, rows)`` per rate, the unshaped
    link's rate measured (:meth:`Cluster.measure`). Used by the network sections of 06, 08 and
    10."""
    with Cluster(hosts) as net:
        for rate in rates:
            net.shape(rate)
            name = rate or "unshaped"
            bits = (links.rate_bits(rate)
                    or 1e6 * net.measure(net.hosts[0], net.hosts[1], mbytes=200))
            path = Path(f"{out}.{name}.json")
            path.unlink(missing_ok=True)
            print(f"links at {name}: {what} on {', '.join(h.name for h in net.hosts)} ...",
                  flush=True)
            net.torchrun(module, 1, [*map(str, args), "--out", str(path)], module=True,
                         timeout=timeout, echo=False, threads_per_process=1,
                         what=f"{what} at {name}")
            rows = json.loads(path.read_text())["rows"]
            path.unlink()
            yield name, bits, rows


def mpiexec_on(hosts, cmd, launcher):
    """``mpiexec`` running ``cmd`` once on each of ``hosts`` (:class:`Host`), started on the
    first, through ``launcher`` (written here): see :meth:`Cluster.mpiexec_command`. Also
    called by :meth:`.hosts.Pool.mpi_command`."""
    launcher = Path(launcher)
    cases = "".join(f'  {h.name}) exec ip netns exec {h.netns} nsenter --uts={h.uts} '
                    f'bash -c "$*";;\n' for h in hosts)
    launcher.write_text('#!/bin/bash\n[ "$1" = "-x" ] && shift\nhost="$1"; shift\n'
                        f'case "$host" in\n{cases}esac\nexit 127\n')
    launcher.chmod(0o700)
    return hosts[0].wrap([find_executable("mpiexec"), "-launcher", "ssh", "-launcher-exec",
                          str(launcher), "-hosts", ",".join(h.name for h in hosts), "-n",
                          str(len(hosts)), "-ppn", "1", *map(str, cmd)])


@atexit.register
def _down_all():
    for c in list(_LIVE):
        try:
            c.down()
        except RuntimeError as err:
            print(err, file=sys.stderr)


if __name__ == "__main__":
    if sys.argv[1:] != ["cleanup"]:
        sys.exit("python -m exercise_utils.cluster cleanup")
    print("removed:", remove_stale() or "nothing")
