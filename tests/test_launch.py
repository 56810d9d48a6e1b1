"""The launcher: live output, timeouts, errors, free ports, and no process left behind."""
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from exercise_utils import launch

pytestmark = pytest.mark.serial   # short launch limits: run alone, not beside other tests


def write(tmp_path, name, code):
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return path


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# A child in a new session (as torchrun and mpiexec workers are) that records its pid.
SESSION_CHILD = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)
open(sys.argv[1], "w").write(str(child.pid))
"""


def test_output_is_collected_and_echoed(tmp_path, capsys):
    script = write(tmp_path, "hello.py", "print('hello'); print('world')")
    result = launch.python(script, timeout=30)
    assert result.returncode == 0
    assert result.output.splitlines() == ["hello", "world"]
    assert "hello\nworld" in capsys.readouterr().out


def test_failure_names_command_exit_code_and_output(tmp_path):
    script = write(tmp_path, "bad.py", "print('about to fail')\nraise SystemExit(3)")
    with pytest.raises(launch.LaunchError) as err:
        launch.python(script, timeout=30, echo=False)
    msg = str(err.value)
    assert "bad.py" in msg and "exit code 3" in msg and "about to fail" in msg
    assert err.value.returncode == 3


def test_hang_is_killed_with_children_in_new_sessions(tmp_path):
    pidfile = tmp_path / "pid"
    script = write(tmp_path, "hang.py", SESSION_CHILD + "import time\ntime.sleep(600)\n")
    start = time.monotonic()
    with pytest.raises(launch.LaunchTimeout) as err:
        launch.python(script, [pidfile], timeout=3, echo=False)
    assert time.monotonic() - start < 15
    assert "did not finish within 3 s" in str(err.value) and "hang.py" in str(err.value)
    assert not alive(int(pidfile.read_text()))


def test_success_still_kills_stragglers(tmp_path):
    pidfile = tmp_path / "pid"
    script = write(tmp_path, "leaves_child.py", SESSION_CHILD)
    launch.python(script, [pidfile], timeout=30, echo=False)
    assert not alive(int(pidfile.read_text()))


def test_mpi_rank_crash_kills_the_others(tmp_path):
    script = write(tmp_path, "crash.py", """
        import sys
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        if comm.Get_rank() == 1:
            print("rank 1 crashes", flush=True)
            sys.exit(5)
        comm.Barrier()          # the others wait for rank 1 forever
        """)
    start = time.monotonic()
    with pytest.raises(launch.LaunchError) as err:
        launch.mpiexec(script, 3, timeout=60, echo=False)
    assert time.monotonic() - start < 50, "a crashed rank must end the job, not the timeout"
    assert "rank 1 crashes" in str(err.value) and "mpiexec -n 3" in str(err.value)


def test_mpi_hang_is_killed_and_labelled(tmp_path):
    pidfile = tmp_path / "pid"
    script = write(tmp_path, "mpihang.py", """
        import subprocess, sys
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        if comm.Get_rank() == 0:
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                     start_new_session=True)
            open(sys.argv[1], "w").write(str(child.pid))
            print("rank 0 waits in a barrier", flush=True)
            comm.Barrier()
        """)
    with pytest.raises(launch.LaunchTimeout) as err:
        launch.mpiexec(script, 2, [pidfile], timeout=8, echo=False)
    assert "[0] rank 0 waits in a barrier" in err.value.output
    assert "collective" in str(err.value)
    assert not alive(int(pidfile.read_text()))


def test_ctrl_c_kills_everything(tmp_path):
    pidfile = tmp_path / "pid"
    script = write(tmp_path, "hang.py", SESSION_CHILD + "import time\ntime.sleep(600)\n")
    driver = write(tmp_path, "driver.py", f"""
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)   # as in a terminal or kernel
        from exercise_utils import launch
        launch.python({str(script)!r}, [{str(pidfile)!r}], timeout=600)
        """)
    proc = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    grandchild = int(pidfile.read_text())
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert "Interrupted" in err
    assert not alive(grandchild)


def test_free_ports_are_bindable_and_differ():
    import socket
    ports = {launch.free_port() for _ in range(5)}
    assert len(ports) >= 4
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_free_ports_differ_across_processes():
    """Processes asking side by side (parallel grading jobs) never get the same port: 3 x 300
    ports drawn at random from ~28000 would share about 14 without the reservation."""
    code = "from exercise_utils import launch; print(*(launch.free_port() for _ in range(300)))"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    drawn = [set(map(int, p.communicate(timeout=120)[0].split())) for p in procs]
    assert [len(d) for d in drawn] == [300] * 3
    assert not (drawn[0] & drawn[1] or drawn[0] & drawn[2] or drawn[1] & drawn[2])


def test_threads_per_process_default(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    script = write(tmp_path, "t.py", "import os; print(os.environ['OMP_NUM_THREADS'])")
    out = launch.python(script, timeout=30, echo=False, nprocs=4).output.strip()
    assert out == str(max(1, (os.cpu_count() or 1) // 4))
    out = launch.python(script, timeout=30, echo=False, threads_per_process=3).output.strip()
    assert out == "3"


def test_mpiexec_not_found_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="pip install mpich"):
        launch.mpiexec("x.py", 2)


def test_mpiexec_rejects_bad_process_count():
    with pytest.raises(ValueError, match="at least 1"):
        launch.mpiexec("x.py", 0)


def test_every_run_gets_a_fresh_master_port(tmp_path, monkeypatch):
    monkeypatch.setenv("MASTER_PORT", "1")            # a stale value from the environment
    script = write(tmp_path, "port.py", "import os; print(os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'])")
    first = launch.python(script, timeout=30, echo=False).output.split()
    second = launch.python(script, timeout=30, echo=False).output.split()
    assert first[0] == "127.0.0.1" and first[1] != "1" and first[1] != second[1]
    out = launch.python(script, timeout=30, echo=False, env={"MASTER_PORT": "12345"}).output
    assert out.split()[1] == "12345"


def test_torchrun_runs_gloo_workers(tmp_path):
    script = write(tmp_path, "ddp_hello.py", """
        import datetime, torch, torch.distributed as dist
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        print(f"rank {dist.get_rank()} sum {t.item():g}", flush=True)
        dist.barrier()
        dist.destroy_process_group()
        """)
    out = launch.torchrun(script, 2, timeout=120, echo=False).output
    assert "rank 0 sum 3" in out and "rank 1 sum 3" in out


def test_torchrun_hang_kills_workers(tmp_path):
    pidfile = tmp_path / "pids"
    script = write(tmp_path, "ddp_hang.py", """
        import datetime, os, sys, torch, torch.distributed as dist
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
        with open(sys.argv[1], "a") as f:
            f.write(f"{os.getpid()}\\n")
        if dist.get_rank() == 0:
            dist.all_reduce(torch.ones(1))      # rank 1 never joins
        dist.barrier()
        """)
    folders = set(Path(tempfile.gettempdir()).glob("dtfs-zygote-*"))
    with pytest.raises(launch.LaunchTimeout):
        launch.torchrun(script, 2, [pidfile], timeout=15, echo=False)
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2 and not any(alive(p) for p in pids)
    # the job's zygote, killed with the rest, leaves nothing on disk (an abstract socket)
    assert set(Path(tempfile.gettempdir()).glob("dtfs-zygote-*")) <= folders


def test_killed_launcher_takes_mpi_workers_with_it(tmp_path):
    pidfile = tmp_path / "pids"
    script = write(tmp_path, "wait.py", """
        import os, sys, time
        from mpi4py import MPI
        with open(sys.argv[1], "a") as f:
            f.write(f"{os.getpid()}\\n")
        MPI.COMM_WORLD.Barrier()
        time.sleep(600)
        """)
    driver = write(tmp_path, "driver.py", f"""
        from exercise_utils import launch
        launch.mpiexec({str(script)!r}, 2, [{str(pidfile)!r}], timeout=600)
        """)
    proc = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(pidfile.read_text().split() if pidfile.exists() else []) < 2:
        assert time.monotonic() < deadline, "the MPI workers did not start"
        time.sleep(0.2)
    proc.kill()                                   # like a kernel killed by a restart
    proc.wait()
    pids = [int(p) for p in pidfile.read_text().split()]
    deadline = time.monotonic() + 20
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in pids), "workers survived their launcher"


def test_a_forked_worker_writes_each_line_whole(tmp_path):
    """A job's ranks share one pipe and python's traceback printer writes a line in pieces:
    each line goes out whole, so that two ranks' tracebacks never mix within a line (a
    fragment of one showed as a line of its own under notebook 05's failure box, in a
    fresh-clone run under load). Rank 0 writes a line's indent, rank 1 a whole line, then
    rank 0 the rest of its line (files order them)."""
    script = write(tmp_path, "pieces.py", """
        import os, sys, time
        from pathlib import Path
        here = Path(sys.argv[1])

        def wait(name):
            while not (here / name).exists():
                time.sleep(0.01)
        if os.environ["RANK"] == "0":
            sys.stderr.write("    ")
            (here / "indent").touch()
            wait("other")
            sys.stderr.write("runner.main(ddp_setup, Trainer)\\n")
        else:
            wait("indent")
            sys.stderr.write("NotImplementedError\\n")
            (here / "other").touch()
        """)
    lines = launch.torchrun(script, 2, [tmp_path], timeout=120, echo=False).output.splitlines()
    assert "    runner.main(ddp_setup, Trainer)" in lines and "NotImplementedError" in lines, lines


def test_torchrun_forks_its_workers_and_they_end_as_fresh_ones_would(tmp_path):
    """One node: the agent and the workers are forked from the job's zygote (torch imported
    before the script starts), each runs the script as ``python -u`` would (its argv, its
    folder first on sys.path, torchrun's environment), and a worker killed by a signal reaches
    torchrun as that signal; ``fork=False`` starts fresh interpreters."""
    script = write(tmp_path, "forked.py", """
        import os, sys
        preloaded = "torch" in sys.modules
        import torch.distributed as dist
        dist.init_process_group("gloo")
        print(f"rank {dist.get_rank()} preloaded {preloaded} argv {sys.argv[1:]} "
              f"path0 {sys.path[0]} world {os.environ['WORLD_SIZE']}", flush=True)
        dist.barrier()
        if sys.argv[1] == "kill" and dist.get_rank() == 1:
            os.kill(os.getpid(), 9)
        dist.destroy_process_group()
        """)
    out = launch.torchrun(script, 2, ["ok", "x y"], timeout=120, echo=False).output
    for rank in (0, 1):
        assert (f"rank {rank} preloaded True argv ['ok', 'x y'] path0 {tmp_path} world 2"
                in out), out
    with pytest.raises(launch.LaunchError) as err:
        launch.torchrun(script, 2, ["kill"], timeout=120, echo=False)
    assert "exitcode  : -9" in err.value.output and "SIGKILL" in err.value.output
    out = launch.torchrun(script, 2, ["ok"], fork=False, timeout=120, echo=False).output
    assert "rank 0 preloaded False" in out and "rank 1 preloaded False" in out
