"""The grading sandbox (exercise_utils.sandbox, bubblewrap): what it hides, what it may
change, its network, ranks talking inside it, and nothing left behind."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from exercise_utils import launch, sandbox


@pytest.fixture(scope="module")
def bwrap():
    """bubblewrap, installed here with apt-get when it is missing and this is root (as CI is);
    skipped with the reason where no sandbox can run."""
    if shutil.which("bwrap") is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "bubblewrap"], capture_output=True,
                       timeout=600)
        sandbox.unavailable.cache_clear()
    reason = sandbox.unavailable()
    if reason:
        pytest.skip(f"no sandbox on this machine: {reason}")


def run_inside(code, **kwargs):
    """Run Python ``code`` in a sandbox; its last line of output, as JSON."""
    out = subprocess.run(sandbox.command([sys.executable, "-c", textwrap.dedent(code)],
                                         cwd="/", **kwargs),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_hidden_folders_read_empty_and_only_writable_folders_change(bwrap, tmp_path):
    secret, work, outside = tmp_path / "solutions", tmp_path / "work", tmp_path / "other.txt"
    secret.mkdir()
    (secret / "answer.py").write_text("SOLUTION = 42\n")
    (tmp_path / "gradebook.db").write_text("grades")
    outside.write_text("untouched")
    got = run_inside(f"""
        import json, os
        def attempt(fn):
            try:
                return fn()
            except OSError as exc:
                return type(exc).__name__
        print(json.dumps({{
            "listing": os.listdir({str(secret)!r}),
            "answer": attempt(lambda: open({str(secret / 'answer.py')!r}).read()),
            "gradebook": open({str(tmp_path / 'gradebook.db')!r}).read(),
            "overwrite": attempt(lambda: open({str(outside)!r}, "w").write("x")),
            "work": attempt(lambda: open({str(work / 'out.txt')!r}, "w").write("ok")),
            "tmp": attempt(lambda: open("/tmp/private.txt", "w").write("t")),
            "shm": attempt(lambda: open("/dev/shm/private", "w").write("s")),
        }}))
        """, writable=[work], hidden=[secret, tmp_path / "gradebook.db"], readable=[tmp_path])
    assert got == {"listing": [], "answer": "FileNotFoundError", "gradebook": "",
                   "overwrite": "OSError", "work": 2, "tmp": 1, "shm": 1}, got
    assert (work / "out.txt").read_text() == "ok" and outside.read_text() == "untouched"
    assert not os.path.exists("/tmp/private.txt") or open("/tmp/private.txt").read() != "t"


def test_only_its_own_loopback_without_network(bwrap):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    code = f"""
        import json, socket
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=5).close()
            print(json.dumps("connected"))
        except OSError as exc:
            print(json.dumps(type(exc).__name__))
        """
    try:
        assert run_inside(code) == "ConnectionRefusedError"
        assert run_inside(code, network=True) == "connected"
    finally:
        server.close()


def test_it_sees_and_signals_only_its_own_processes(bwrap):
    """Root inside (same uid as the judge's kernel and other submissions' ranks) can neither
    stop a process outside nor see it: the sandbox has a pid namespace of its own."""
    outside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        got = run_inside(f"""
            import json, os, signal
            try:
                os.kill({outside.pid}, signal.SIGSTOP)
                stopped = "stopped"
            except OSError as exc:
                stopped = type(exc).__name__
            mine = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
            print(json.dumps({{"stop": stopped, "outside_seen": {outside.pid} in mine,
                               "count": len(mine)}}))
            """)
        state = open(f"/proc/{outside.pid}/status").read().split("State:\t")[1].split("\n")[0]
        assert state[0] not in "Tt", state     # not stopped (it may still be starting: R)
        assert got["stop"] == "ProcessLookupError" and not got["outside_seen"], got
        assert got["count"] <= 3, got          # bwrap's init, the python, perhaps a shell
    finally:
        os.kill(outside.pid, 18)                # SIGCONT, whatever happened
        outside.kill()
        outside.wait()


def test_the_watch_tells_a_live_sandboxed_rank_from_a_dead_one(bwrap, tmp_path):
    """A rank's beat names its pid inside the sandbox, which the launcher cannot use (there it
    is some other process, or none); the watch reads the lock the beat holds instead: a beat
    counts while its writer lives, not after."""
    from exercise_utils import heartbeat
    code = ("import sys, time\nfrom exercise_utils import heartbeat\n"
            f"heartbeat.start({str(tmp_path)!r}, 0, period=0.1)\n"
            "print('up', flush=True)\ntime.sleep(120)")
    rank = subprocess.Popen(sandbox.command([sys.executable, "-c", code],
                                            writable=[tmp_path], cwd="/"),
                            stdout=subprocess.PIPE, text=True)
    watch = heartbeat.Watch(tmp_path, 1, hang_after=60)
    try:
        assert rank.stdout.readline().strip() == "up"
        deadline = time.monotonic() + 30
        while not (tmp_path / "beat0.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        beat = watch._read(0)
        assert beat is not None and beat["phase"] == "start"
        assert beat["pid"] != rank.pid and not any(
            p.pid == beat["pid"] for p in psutil.Process(rank.pid).children(recursive=True))
    finally:
        rank.kill()                # bwrap: its pid namespace, the rank with it
        rank.wait()
    deadline = time.monotonic() + 30
    while watch._read(0) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert watch._read(0) is None, "a dead rank's beat still counts"


def test_ranks_of_one_sandbox_reach_each_other(bwrap, tmp_path):
    """Two gloo ranks in one sandbox: an all-reduce over its private loopback."""
    got = run_inside("""
        import json, subprocess, sys
        code = ("import sys, torch, torch.distributed as dist; r = int(sys.argv[1]); "
                "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:29611', rank=r, "
                "world_size=2); t = torch.tensor([r + 1.0]); dist.all_reduce(t); "
                "print(t.item()); dist.destroy_process_group()")
        procs = [subprocess.Popen([sys.executable, "-c", code, str(r)], stdout=subprocess.PIPE,
                                  text=True) for r in range(2)]
        print(json.dumps([float(p.communicate(timeout=120)[0]) for p in procs]))
        """)
    assert got == [3.0, 3.0]


def test_a_sandboxed_tree_is_stopped_whole(bwrap, tmp_path):
    """The launcher's limit reaches every process inside (the test's fixture fails on any
    process left behind)."""
    cmd = sandbox.command([sys.executable, "-c", "import subprocess, sys, time; "
                           "subprocess.Popen([sys.executable, '-c', 'import time; "
                           "time.sleep(300)']); time.sleep(300)"], cwd="/")
    with pytest.raises(launch.LaunchTimeout):
        launch.run(cmd, timeout=3, echo=False)


def test_a_sandbox_is_stopped_without_waiting_for_its_init_to_be_reaped(bwrap):
    """Once its processes are gone the sandbox's init (bwrap, pid 1 of its namespace) is a
    zombie until its parent reaps it: kill_processes used to wait for that, up to the grace
    twice over (about a second per sandboxed launch at grading; here, with the parent stopped,
    2 x 30 s)."""
    from exercise_utils import processes
    proc = subprocess.Popen(sandbox.command(["sh", "-c", "sleep 300 & sleep 300"], cwd="/"),
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(psutil.Process(proc.pid).children(recursive=True)) < 4:
            assert time.monotonic() < deadline and proc.poll() is None, "the sandbox did not start"
            time.sleep(0.05)
        inside = psutil.Process(proc.pid).children(recursive=True)
        assert [processes.inner_pid(p) for p in inside][0] == 1         # bwrap's init
        proc.send_signal(signal.SIGSTOP)        # the outer bwrap: it reaps nothing while stopped
        start = time.monotonic()
        killed = processes.kill_processes(inside, grace=30)
        assert time.monotonic() - start < 15 and sorted(killed) == sorted(p.pid for p in inside)
        assert not [p for p in inside if processes._is_alive(p)]
        assert inside[0].status() == psutil.STATUS_ZOMBIE
    finally:
        proc.kill()
        proc.wait()


def test_nothing_outside_the_writable_folders_changes(bwrap, tmp_path):
    """Not even bwrap's own root, which holds the binds of the machine's folders."""
    got = run_inside("""
        import json
        def attempt(path):
            try:
                open(path, "w").write("x")
                return "written"
            except OSError as exc:
                return type(exc).__name__
        print(json.dumps([attempt(p) for p in ("/new", "/run/new", "/usr/new", "/tmp/new")]))
        """)
    assert got == ["OSError", "OSError", "OSError", "written"], got


def test_sandboxes_start_while_clusters_come_and_go(bwrap):
    """Namespaces that other launches' clusters mount under /run and unmount at any moment
    never stop a sandbox from starting (CI lost a check's points to ``bwrap: Can't bind mount
    /oldroot/ on /newroot/: ... remount "/newroot/run/dtfs-uts/...": Invalid argument``;
    binding ``/`` whole failed 38 of 4469 starts beside such clusters, this 0 of 2273)."""
    import threading
    import time
    from exercise_utils import cluster
    reason = cluster.unavailable_reason()
    if reason:
        pytest.skip(f"no clusters on this machine: {reason}")
    done, made = threading.Event(), [0]

    def churn():
        while not done.is_set():
            with cluster.Cluster(2, mesh=True):
                made[0] += 1

    churner = threading.Thread(target=churn)
    churner.start()
    failures, starts, end = [], 0, time.monotonic() + 15
    try:
        while time.monotonic() < end or made[0] < 20:
            out = subprocess.run(sandbox.command(["true"], cwd="/"), capture_output=True,
                                 text=True, timeout=60)
            starts += 1
            if out.returncode != 0:
                failures.append(out.stderr.strip())
    finally:
        done.set()
        churner.join()
    assert not failures, f"{len(failures)} of {starts} sandboxes failed to start: {failures[:3]}"


def test_no_bubblewrap_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    sandbox.unavailable.cache_clear()
    try:
        with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install bubblewrap"):
            sandbox.require()
    finally:
        sandbox.unavailable.cache_clear()
