"""exercise_utils.cluster: hosts in network namespaces with shaped links, always torn down.

Needs root and iproute2 (CI runs as root); elsewhere the tests that start hosts skip with the
reason, and the error a student then sees is tested on its own. Marked network: they run in
the parallel pass (a token bucket limits the rate whatever the load; measured: 100 Mbit/s and
1 Gbit/s links within 5% beside a loaded machine).
"""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from exercise_utils import cluster, launch, launch_many, netns
from exercise_utils.ddp_torchrun_fault_tolerance import hello, multinode
from exercise_utils.links import rate_bits

ROOT = Path(__file__).resolve().parents[1]
REASON = cluster.unavailable_reason()
needs_hosts = pytest.mark.skipif(REASON is not None, reason=f"no cluster here: {REASON}")
pytestmark = pytest.mark.network


def links():
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return sorted(line.split(":")[1].strip() for line in out.splitlines())


def leftovers():
    """Everything a cluster made by this process could leave behind: namespaces, their /etc
    files, UTS files (``dtfs-<this pid>-...``: the tests running beside this one, e.g. the
    checks observing links on a mesh, make clusters of their own at the same time)."""
    mine = f"{netns.PREFIX}{os.getpid()}-"
    found = netns.namespaces(mine)
    for folder in (netns.NETNS_ETC, netns.UTS_DIR):
        if folder.exists():
            found += [p.name for p in folder.iterdir() if p.name.startswith(mine)]
    return sorted(found)


def test_rates_parse_and_bad_rates_say_what_is_expected():
    assert rate_bits("100mbit") == 1e8 and rate_bits("1gbit") == 1e9
    assert rate_bits("10gbit") == 1e10 and rate_bits("2.5 Gbit") == 2.5e9
    assert rate_bits(None) is None and rate_bits("unshaped") is None
    for bad in ("100", "fast", "100mb", "1 gbps"):
        with pytest.raises(ValueError, match="expected e.g. '100mbit'"):
            rate_bits(bad)
    with pytest.raises(ValueError, match="2 to 200 hosts"):
        cluster.Cluster(1)


def test_without_root_a_clear_error_says_why_and_what_to_do(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root" in cluster.unavailable_reason()
    live = set(cluster._LIVE)       # a mesh this worker's checks keep up (exercise_utils.hosts)
    with pytest.raises(cluster.ClusterUnavailable, match=r"need root: run .*sudo.*Colab"):
        cluster.Cluster(2).up()
    assert set(cluster._LIVE) == live


@needs_hosts
def test_hosts_have_their_own_address_and_name_and_leave_nothing_behind():
    before_links, before = links(), leftovers()
    with cluster.Cluster(3) as net:
        names = {h.netns for h in net.hosts}
        assert len(names) == 3 and set(netns.namespaces()) >= names | {net.switch}
        for host in net.hosts:
            script = ("import socket; print(socket.gethostname(), "
                      "socket.gethostbyname(socket.gethostname()), socket.gethostbyname('h2'))")
            out = net.run(host, [sys.executable, "-c", script], echo=False, timeout=60).output
            assert out.split() == [host.name, host.address, "10.42.0.3"], out
        assert net.measure(net.hosts[0], net.hosts[2], mbytes=1) > 0
    assert leftovers() == before and links() == before_links


@needs_hosts
def test_a_mesh_counts_the_bytes_of_each_directed_link_and_leaves_nothing_behind():
    before_links, before = links(), leftovers()
    with cluster.Cluster(3, mesh=True) as net:
        assert net.switch is None and set(netns.namespaces()) >= {h.netns for h in net.hosts}
        start = net.link_bytes()
        assert sorted(start) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
        assert net.measure(net.hosts[0], net.hosts[2], mbytes=5) > 0
        sent = {k: v - start[k] for k, v in net.link_bytes().items()}
        assert 5e6 <= sent[0, 2] <= 5.3e6, sent             # the data and its headers
        assert sent[2, 0] < 0.05 * sent[0, 2], sent          # acknowledgements only
        assert max(sent[0, 1], sent[1, 0], sent[1, 2], sent[2, 1]) < 10_000, sent
    with pytest.raises(ValueError, match="mesh=True"):
        cluster.Cluster(2).link_bytes()
    with pytest.raises(ValueError, match="2 to 8"):
        cluster.Cluster(9, mesh=True)
    assert leftovers() == before and links() == before_links


MPI_ALLREDUCE = """
import pathlib, socket, sys
from mpi4py import MPI
import numpy as np
x = np.full(1 << 20, MPI.COMM_WORLD.Get_rank() + 1.0, dtype=np.float32)
y = np.empty_like(x)
MPI.COMM_WORLD.Allreduce(x, y)
rank = MPI.COMM_WORLD.Get_rank()     # a file each: the ranks' printed lines may interleave
pathlib.Path(sys.argv[1], f"rank{rank}").write_text(f"{rank} {socket.gethostname()} {y[0]}")
"""


@needs_hosts
@pytest.mark.parametrize("over_links", [False, True])
def test_mpi_ranks_on_mesh_hosts_and_what_their_links_carry(tmp_path, over_links):
    """MPICH runs one rank per host of a mesh (hydra through a stand-in for ssh); its data
    crosses the links only over TCP (UCX_TLS=tcp,self): by default UCX uses the machine's
    shared memory, and the links carry only the start-up (measured: 0.5% of the data)."""
    script = tmp_path / "allreduce.py"
    script.write_text(MPI_ALLREDUCE)
    with cluster.Cluster(3, mesh=True) as net:
        before = net.link_bytes()
        out = launch.run(net.mpiexec_command([sys.executable, script, tmp_path],
                                             tmp_path / "rsh"),
                         env=cluster.MPI_OVER_LINKS if over_links else {},
                         timeout=120, echo=False).output
        sent = {k: v - before[k] for k, v in net.link_bytes().items()}
    ranks = sorted((tmp_path / f"rank{r}").read_text().split() for r in range(3)
                   if (tmp_path / f"rank{r}").exists())
    assert ranks == [["0", "h0", "6.0"], ["1", "h1", "6.0"], ["2", "h2", "6.0"]], out
    data = 4 << 20
    if over_links:     # MPICH's algorithm (not a ring): about the data on a few links
        assert data <= sum(sent.values()) <= 6 * data, sent
    else:
        assert sum(sent.values()) < 0.1 * data, sent


@needs_hosts
def test_a_failure_inside_still_tears_everything_down():
    before, live = leftovers(), set(cluster._LIVE)
    with pytest.raises(RuntimeError, match="inside"):
        with cluster.Cluster(2):
            raise RuntimeError("inside")
    assert leftovers() == before and set(cluster._LIVE) == live


@needs_hosts
def test_a_killed_owner_s_namespaces_are_removed_by_the_next_cluster(tmp_path):
    """A notebook kernel killed with SIGKILL cannot tear down: the next cluster does."""
    code = ("from exercise_utils import cluster; import time; c = cluster.Cluster(2).up(); "
            "print(c.switch, flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)
    try:
        switch = proc.stdout.readline().strip()
        assert switch in netns.namespaces()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert switch in netns.namespaces()            # nobody tore it down
    with cluster.Cluster(2):
        assert switch not in netns.namespaces()
    assert not any(name.startswith(switch[:-3]) for name in leftovers())


@needs_hosts
@pytest.mark.serial    # a measured rate: at 1 Gbit/s a busy machine's sender falls below it
def test_links_are_shaped_within_20_percent_in_both_directions():
    with cluster.Cluster(2, rate="100mbit") as net:
        a, b = net.hosts
        up, down = net.measure(a, b, mbytes=12), net.measure(b, a, mbytes=12)
        net.shape("1gbit")
        fast = net.measure(a, b, mbytes=100)
        net.shape(None)
        free = net.measure(a, b, mbytes=100)
    for rate in (up, down):
        assert 80 <= rate <= 120, (up, down)
    assert 800 <= fast <= 1200, fast
    assert free > 1.5 * fast, (free, fast)           # unshaped is faster than 1 Gbit/s here


@needs_hosts
def test_a_two_host_torchrun_job_ends_with_the_expected_parameters(tmp_path):
    report = tmp_path / "hello.json"
    with cluster.Cluster(2, rate="1gbit") as net:
        multinode.two_hosts(net, hello.__file__, args=["--out", report], echo=False,
                            timeout=180)
    found = multinode.load_report(report)
    multinode.verify_job(found, 2, 1, expected_params=hello.reference_params(2))
    assert sorted(r["hostname"] for r in found["records"]) == ["h0", "h1"]


def test_run_many_lets_a_command_fail_when_asked_and_keeps_a_timed_transcript():
    lines = []
    results = launch_many.run_many(
        [["sh", "-c", "echo dying; exit 3"], ["sh", "-c", "sleep 1; echo alive"]],
        labels=["a", "b"], echo=False, may_fail=[0], transcript=lines, timeout=30)
    assert [r.returncode for r in results] == [3, 0]
    assert [line for _, line in lines] == ["[a] dying", "[b] alive"]
    assert lines[1][0] - lines[0][0] > 0.5             # when each line came
    with pytest.raises(launch_many.LaunchError, match="exit code 3"):
        launch_many.run_many([["sh", "-c", "exit 3"], ["sleep", "5"]], echo=False, timeout=30)
