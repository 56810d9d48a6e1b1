"""The checker harness: per-rank results and student-readable failures."""
import textwrap
import time

import numpy as np
import pytest

from exercise_utils import harness, notebook_files, sessions
from exercise_utils.compare import assert_close
from exercise_utils.harness import run_ranks


pytestmark = pytest.mark.usefixtures("env_pythonpath")
GLOO_SUM = "harness_probes:probe_gloo_sum"


def student(tmp_path, code, name="student.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return path


def test_gloo_results_per_rank(tmp_path):
    path = student(tmp_path, """
        import torch.distributed as dist
        def reduce(t):
            dist.all_reduce(t)
        """)
    assert run_ranks(path, GLOO_SUM, 3, "gloo", timeout=60) == [6.0, 6.0, 6.0]
    assert run_ranks(path, "harness_probes:probe_world", 2, "gloo") == [(0, 2, True), (1, 2, True)]


def test_optimizer_warm_up_only_when_asked(tmp_path):
    """``warm_up=True`` (notebook 04) imports torch._dynamo before the student's code; other
    checks skip those seconds of CPU per rank."""
    path = student(tmp_path, "x = 1\n")
    probe = "harness_probes:probe_dynamo_loaded"
    assert run_ranks(path, probe, 1, "none") == [False]
    assert run_ranks(path, probe, 1, "none", warm_up=True) == [True]


def test_pgwatch_sees_the_process_group_and_keeps_ops_usable(tmp_path):
    path = student(tmp_path, "x = 1\n")
    [(schema, names, total)] = run_ranks(path, "harness_probes:probe_pgwatch", 1, "gloo")
    assert schema == "c10d::allreduce_" and total == 3.0
    assert "ProcessGroup.allreduce" in names or "torch.ops.c10d.allreduce_" in names, names


def test_the_recorder_records_every_public_form_of_a_collective(tmp_path):
    """*_single forms under the name of their *_tensor twin, *_object forms as themselves,
    nothing hidden (issue 25: notebook 09 with reduce_scatter_single or gather_object lost every
    point as an integrity violation); async_op and the size found by name, wherever they sit;
    a list form's size is its tensors' (an all-gather into a list records what
    all_gather_into_tensor records: bench_sp's ring bytes counted it as nothing)."""
    path = student(tmp_path, "x = 1\n")
    for events, hidden, objects in run_ranks(path, "harness_probes:probe_recorder_forms", 2,
                                             "gloo", timeout=60):
        assert hidden == [] and objects == [0]
        colls = [(name, numel, async_op) for kind, name, numel, async_op in
                 [e for e in events if e[0] == "coll"]]
        assert colls == [("all_gather_into_tensor", 4, False), ("reduce_scatter_tensor", 2, False),
                         ("gather_object", 0, False), ("broadcast_object_list", 0, False),
                         ("reduce_scatter_tensor", 3, True), ("all_gather_into_tensor", 2, False),
                         ("all_gather", 4, False), ("reduce_scatter", 3, False),
                         ("all_to_all", 2, False)]


def test_not_implemented_yet(tmp_path):
    """The function a rank found unimplemented, and the file's other unfinished ones (up to
    three: a file with every stage still to do lists none)."""
    path = student(tmp_path, """
        def reduce(t):
            raise NotImplementedError()

        def later(t):
            # a later exercise
            raise NotImplementedError("your code here")

        class Later:
            def step(self):
                raise NotImplementedError

        def done(t):
            return t
        """)
    with pytest.raises(AssertionError, match="not implemented yet: reduce") as err:
        run_ranks(path, GLOO_SUM, 2, "gloo", timeout=60)
    assert str(err.value).endswith("Still to do in that file, in order: later, Later.step.")
    assert notebook_files.unimplemented(path) == ["reduce", "later", "Later.step"]
    many = tmp_path / "many.py"
    many.write_text("".join(f"def f{i}():\n    raise NotImplementedError\n" for i in range(5)))
    assert len(notebook_files.unimplemented(many)) == 5
    assert notebook_files.unimplemented(tmp_path / "missing.py") == []


def test_gloo_hang_is_reported_and_killed(tmp_path):
    path = student(tmp_path, """
        import torch.distributed as dist
        def reduce(t):
            if dist.get_rank() == 0:
                dist.all_reduce(t)      # rank 1 never joins
        """)
    start = time.monotonic()
    with pytest.raises(AssertionError) as err:
        run_ranks(path, GLOO_SUM, 2, "gloo", timeout=10)
    assert time.monotonic() - start < 40
    msg = str(err.value)
    assert "hung: ranks issued different collectives?" in msg and "ranks still waiting: [0]" in msg


def test_crash_of_one_rank_is_reported_without_waiting(tmp_path):
    path = student(tmp_path, """
        import torch.distributed as dist
        def reduce(t):
            if dist.get_rank() == 1:
                raise ValueError("bad shapes on rank 1")
            dist.all_reduce(t)
        """)
    start = time.monotonic()
    with pytest.raises(AssertionError, match=r"rank 1 raised ValueError: bad shapes on rank 1"):
        run_ranks(path, GLOO_SUM, 2, "gloo", timeout=60)
    assert time.monotonic() - start < 40, "the waiting rank must be stopped at once"


def test_mpi_crash_of_one_rank(tmp_path):
    path = student(tmp_path, """
        def value(rank):
            return 1 / (rank - 1)
        """)
    with pytest.raises(AssertionError, match="rank 1 raised ZeroDivisionError"):
        run_ranks(path, "harness_probes:probe_value", 2, "mpi", timeout=60)


def test_mpi_ranks_are_forked_from_one_zygote(tmp_path):
    """Under mpiexec every rank is a child of the one zygote that imported torch once, not a
    fresh interpreter (exercise_utils.zygote)."""
    path = student(tmp_path, "value = None\n")
    ranks = run_ranks(path, "harness_probes:probe_parent", 3, "mpi", timeout=60)
    assert len({pid for pid, _ in ranks}) == 1, ranks
    assert "exercise_utils.zygote --socket" in ranks[0][1], ranks


def test_mpi_rank_killed_by_a_signal_fails_the_launch_at_once(tmp_path):
    """A forked rank killed by SIGKILL: its stub exits 137, mpiexec stops the job, the other
    rank is killed with it, and the check says so without waiting for a hang."""
    path = student(tmp_path, """
        import os, signal, time
        def value(rank):
            if rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(120)
        """)
    start = time.monotonic()
    with pytest.raises(AssertionError, match="failed before reporting a result"):
        run_ranks(path, "harness_probes:probe_value", 2, "mpi", timeout=60)
    assert time.monotonic() - start < 50


def test_a_session_forks_every_launch_from_one_zygote(tmp_path):
    """Inside harness.session() (every check_* runs in one) gloo and lone-process launches
    are forked from one zygote, which survives a hung launch and is gone after the block."""
    import psutil
    path = student(tmp_path, """
        import time
        def value(rank):
            time.sleep(600)
        """)
    with harness.session():
        first = run_ranks(path, "harness_probes:probe_lineage", 2, "gloo", timeout=60)
        with pytest.raises(AssertionError, match="hung"):
            run_ranks(path, "harness_probes:probe_value", 2, "gloo", timeout=5)
        again = run_ranks(path, "harness_probes:probe_lineage", 1, "none", timeout=60)
    assert {pid for pid, _ in first + again} == {first[0][0]}, (first, again)
    assert "exercise_utils.zygote --socket" in first[0][1]
    assert not psutil.pid_exists(first[0][0])


def test_a_judge_module_runs_forked_from_the_session_zygote(env_pythonpath):
    """harness.module_command (notebook 05's torchrun agent): the module's main() runs in a
    child of the session's zygote (torch imported there once), with the command line given;
    its return value is the launch's exit status. Without a session, or at grading, there is
    none (the caller starts a process of its own)."""
    from exercise_utils import launch
    assert harness.module_command("harness_probes", ["0"]) is None
    with harness.session():
        ok = launch.run(harness.module_command("harness_probes", ["x", "0"], ["torch"]),
                        nprocs=1, timeout=120, echo=False)
        with pytest.raises(launch.LaunchError) as failed:
            launch.run(harness.module_command("harness_probes", ["3"]), nprocs=1,
                       timeout=120, echo=False)
    assert "module-main args=['x', '0'] torch=True" in ok.output, ok.output
    assert "exercise_utils.zygote --socket" in ok.output, ok.output
    assert failed.value.returncode == 3, failed.value


def test_a_launch_that_lost_its_zygote_runs_again_without_it(tmp_path, monkeypatch, capfd):
    """The session's zygote died before any rank started (a CI run: a check lost 2 points to
    "exit code 1 after 0.5 s" with no output): nothing of the student's ran, so the launch
    runs again on its own and passes; why the zygote died is said on stderr; the next launch
    of the session forks from a new zygote."""
    import psutil
    marker = tmp_path / "kill-once"
    marker.touch()
    monkeypatch.setenv("DTFS_TEST_KILL_ONCE", str(marker))
    path = student(tmp_path, "def value(rank):\n    return rank * 10\n")
    with harness.session():
        assert run_ranks(path, "harness_zygote_killer:probe_value", 2, "gloo",
                         timeout=60) == [0, 10]
        err = capfd.readouterr().err
        assert "zygote (pid" in err and "was lost: exit status -9" in err, err
        assert "the launch ran again" in err, err
        assert not marker.exists()
        after = run_ranks(path, "harness_zygote_killer:probe_lineage", 2, "gloo", timeout=60)
        assert "exercise_utils.zygote --socket" in after[0][1] and after[0][0] == after[1][0]
        assert psutil.pid_exists(after[0][0])


def test_a_rank_that_started_is_never_run_again(tmp_path):
    """A launch whose stub lost the zygote after a rank started (the student's code may have
    run, and killed it) is judged as it is: its failure stands."""
    path = student(tmp_path, """
        import os, signal, time
        import psutil
        def value(rank):
            if rank == 0:       # the spawner's parent: the zygote
                os.kill(psutil.Process(os.getppid()).ppid(), signal.SIGKILL)
            time.sleep(30)
            return rank
        """)
    with harness.session():
        with pytest.raises(AssertionError, match="failed before reporting"):
            run_ranks(path, "harness_probes:probe_value", 2, "gloo", timeout=60)


def test_a_nested_session_ends_with_no_rank_of_its_own_left():
    """The test suite holds one session around many checks: when a check's (nested) session
    ends, whatever the zygote forked and is still alive (a rank judged by its report, still
    exiting) is killed, the zygote is not. (A CI-like run failed two tests for a rank left
    behind, once the session outlived the check.)"""
    import os
    import subprocess
    import sys
    import psutil
    from exercise_utils.processes import TAG
    with harness.session(start=True):
        state = sessions.SESSION[0]
        with harness.session():
            lingering = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                         env={**os.environ, TAG: state["tag"]})
            time.sleep(0.5)
        assert lingering.wait(timeout=10) is not None
        assert psutil.pid_exists(state["proc"].pid) and state["proc"].poll() is None


def test_a_session_without_launches_starts_no_zygote():
    """A check that launches nothing through run_ranks (05 runs torchrun jobs) pays for no
    zygote: it starts at the first launch."""
    import psutil

    def zygotes():           # (this worker's hosts' zygotes, if any, were there before)
        found = set()
        for child in psutil.Process().children(recursive=True):
            try:
                if "exercise_utils.zygote" in " ".join(child.cmdline()):
                    found.add(child.pid)
            except psutil.Error:            # a child that ended meanwhile, or a zombie
                pass
        return found
    before = zygotes()
    with harness.session():
        time.sleep(0.5)
        assert not zygotes() - before


def test_the_zygote_imports_torch_when_a_function_the_probe_calls_will(tmp_path):
    """A rank imports torch from its zygote when it will need it: the probe, or a function or
    class it calls, in its module or in a course module it imports the name from, however
    deep (01's scatter probe builds its dataset with ``inputs.scatter_data``, which imports
    torch: each MPI rank imported it after the fork, ~2 s of CPU each, 7 s of a 0.6 s launch
    on 2 cores); never where no code of the rank does (01's bounds and convergence probes on
    a numpy file), unless the student's file imports it."""
    module = "exercise_utils.mpi_parallel_sgd.probes"
    numpy_file = student(tmp_path, "import numpy as np\n")
    assert sessions.needs_torch(numpy_file, module, "probe_scatter")
    assert sessions.needs_torch(numpy_file, module, "probe_broadcast")
    assert not sessions.needs_torch(numpy_file, module, "probe_bounds")
    assert not sessions.needs_torch(numpy_file, module, "probe_convergence")
    torch_file = student(tmp_path, "import numpy as np\nfrom torch import nn\n", "t.py")
    assert sessions.needs_torch(torch_file, module, "probe_convergence")


def test_syntax_error_is_reported(tmp_path):
    path = student(tmp_path, "def value(rank)\n    return rank\n")
    with pytest.raises(AssertionError, match="SyntaxError"):
        run_ranks(path, "harness_probes:probe_value", 1, timeout=60)


def test_missing_file(tmp_path):
    with pytest.raises(AssertionError, match="does not exist: run the cell that writes it first"):
        run_ranks(tmp_path / "nope.py", "harness_probes:probe_value")


def test_exit_in_student_code_is_reported(tmp_path):
    path = student(tmp_path, "import sys\ndef value(rank):\n    sys.exit(0)\n")
    with pytest.raises(AssertionError, match="SystemExit"):
        run_ranks(path, "harness_probes:probe_value", 1, timeout=60)


def test_assert_close_names_rank_tensor_and_size():
    with pytest.raises(AssertionError, match=r"rank 2 differs by 3\.0e-02 in fc1\.weight"):
        assert_close({"fc1.weight": np.array([1.03, 2.0])}, {"fc1.weight": np.array([1.0, 2.0])},
                     "parameters", rank=2)
    with pytest.raises(AssertionError, match="has shape"):
        assert_close({"w": np.zeros(3)}, {"w": np.zeros(4)}, "parameters", rank=0)
    with pytest.raises(AssertionError, match="lacks"):
        assert_close({}, {"w": np.zeros(4)}, "parameters", rank=0)
    assert_close({"w": np.ones(3)}, {"w": np.ones(3) + 1e-7}, "parameters", rank=0)


# ------------------------------------------------ hangs are hangs, not slowness (heartbeat)
def test_a_rank_s_cpu_leaves_out_the_beating_thread():
    """The beat's own CPU (a few ms per beat, more on a loaded machine) must not make a blocked
    rank look busy: a CI run took 218 s to call a 15 s deadlock a hang. Here a thread that
    burns 1 s of CPU stands for the beating thread, and measures as it does."""
    import threading
    import psutil
    from exercise_utils.heartbeat import _cpu
    proc, seen = psutil.Process(), {}

    def burn():
        seen["all"], seen["rank"] = _cpu(proc), _cpu(proc, time.thread_time())
        end = time.thread_time() + 1.0
        while time.thread_time() < end:
            pass
        seen["all"] = _cpu(proc) - seen["all"]
        seen["rank"] = _cpu(proc, time.thread_time()) - seen["rank"]
    worker = threading.Thread(target=burn)
    worker.start()
    worker.join()
    assert seen["all"] > 0.8 and seen["rank"] < 0.2, seen


def test_slow_but_busy_ranks_are_not_a_hang(tmp_path):
    """Ranks that compute for three times the hang limit on one line of Python are making
    progress (their CPU time rises): the check waits for them."""
    path = student(tmp_path, """
        import time
        import torch.distributed as dist
        def reduce(t):
            end = time.monotonic() + 9
            while time.monotonic() < end: pass
            dist.all_reduce(t)
        """)
    assert run_ranks(path, GLOO_SUM, 2, "gloo", timeout=3) == [3.0, 3.0]


def test_a_rank_that_reported_is_done_even_if_slow_to_exit(tmp_path):
    """Every rank reported: the check returns without waiting for the processes to exit."""
    path = student(tmp_path, """
        import atexit, time
        atexit.register(time.sleep, 120)
        def value(rank):
            return rank * 2
        """)
    start = time.monotonic()
    assert run_ranks(path, "harness_probes:probe_value", 2, timeout=60, limit=100) == [0, 2]
    assert time.monotonic() - start < 60


def test_hang_message_says_where_each_waiting_rank_stands(tmp_path):
    path = student(tmp_path, """
        import torch.distributed as dist
        def reduce(t):
            if dist.get_rank() == 1:
                dist.broadcast(t, src=1)
            else:
                dist.all_reduce(t)
        """)
    with pytest.raises(AssertionError) as err:
        run_ranks(path, GLOO_SUM, 2, "gloo", timeout=5)
    msg = str(err.value)
    assert "ranks still waiting: [0, 1]" in msg, msg
    assert "line 5 (reduce)" in msg and "line 7 (reduce)" in msg, msg
    assert "hung: ranks issued different collectives?" in msg


def test_a_point_to_point_deadlock_is_named_as_one(tmp_path):
    """Both ranks send first with a blocking dist.send: the message says who waits on whom,
    not "different collectives"."""
    path = student(tmp_path, """
        import torch.distributed as dist
        def reduce(t):
            peer = 1 - dist.get_rank()
            dist.send(t, dst=peer, tag=7)
            dist.recv(t, src=peer, tag=7)
        """)
    with pytest.raises(AssertionError) as err:
        run_ranks(path, GLOO_SUM, 2, "gloo", timeout=5)
    msg = str(err.value)
    assert ("hung: a point-to-point deadlock: rank 0 waits in send to rank 1, rank 1 waits in "
            "send to rank 0") in msg, msg
    assert "inside send to rank 1 (tag 7)" in msg and "collectives" not in msg, msg


def test_a_rank_that_spins_while_its_peer_waits_is_a_hang_within_the_timeout(tmp_path):
    """Rank 0 polls a receive that never completes (``while not work.is_completed()``), burning
    CPU on one line; rank 1 waits in a receive from rank 0. Reported after the hang timeout,
    not at the wall limit, with both places; a rank that only loops, with no rank waiting,
    stays an endless loop for the wall limit (test_endless_loop_is_stopped_at_the_limit)."""
    path = student(tmp_path, """
        import torch.distributed as dist
        def reduce(t):
            if dist.get_rank() == 0:
                work = dist.irecv(t, src=1, tag=3)
                while not work.is_completed():
                    pass
            else:
                dist.recv(t, src=0, tag=3)
        """)
    start = time.monotonic()
    with pytest.raises(AssertionError) as err:
        run_ranks(path, GLOO_SUM, 2, "gloo", timeout=5, limit=300)
    took = time.monotonic() - start
    msg = str(err.value)
    assert "rank 0: spinning at line" in msg and "(reduce)" in msg, msg
    assert "rank 1: no progress for" in msg and "inside recv from rank 0 (tag 3)" in msg, msg
    assert "hung: rank 0 kept looping on the same few lines" in msg, msg
    assert took < 150, f"reported after {took:.0f} s (the wall limit was 300 s)"


def test_a_stuck_process_without_collectives_is_not_blamed_on_collectives(tmp_path):
    path = student(tmp_path, """
        import threading
        def value(rank):
            threading.Event().wait()     # waits for ever, no communication
        """)
    with pytest.raises(AssertionError) as err:
        run_ranks(path, "harness_probes:probe_value", 1, timeout=4)
    msg = str(err.value)
    assert "stopped making progress" in msg and "collectives" not in msg, msg


def test_endless_loop_is_stopped_at_the_limit(tmp_path):
    path = student(tmp_path, "def value(rank):\n    while True:\n        pass\n")
    with pytest.raises(AssertionError, match="kept making progress, so all were stopped") as err:
        run_ranks(path, "harness_probes:probe_value", 1, timeout=3, limit=12)
    assert "rank 0: busy at " in str(err.value), str(err.value)   # its line, or an import


def test_mpi_hang_is_reported_although_mpi_spins(tmp_path):
    """A blocked MPI call spins at 100% CPU: the line standing still is what counts."""
    path = student(tmp_path, """
        from mpi4py import MPI
        def value(rank):
            if rank == 0:
                MPI.COMM_WORLD.barrier()
            return rank
        """)
    with pytest.raises(AssertionError) as err:
        run_ranks(path, "harness_probes:probe_value", 2, "mpi", timeout=5)
    msg = str(err.value)
    assert "ranks finished: [1]" in msg and "ranks still waiting: [0]" in msg, msg


def test_a_mismatch_names_its_likely_cause():
    """Issue 26, part 4: a NaN, a result that never moved, N or 1/N times the update, the
    opposite sign, or a replayed known mistake is named; anything else is not guessed at."""
    from exercise_utils.compare import assert_close, likely_cause
    start = {"w": np.array([1.0, 2.0, 3.0]), "b": np.array([0.5])}
    want = {"w": np.array([1.1, 1.8, 3.3]), "b": np.array([0.4])}
    moved = lambda k: {n: start[n] + k * (want[n] - start[n]) for n in want}  # noqa: E731
    assert "summed instead of averaged" in likely_cause(moved(3.0), want, start, 3)
    assert "1/3 of the expected update" in likely_cause(moved(1 / 3), want, start, 3)
    assert "opposite sign" in likely_cause(moved(-1.0), want, start, 3)
    assert "nothing moved" in likely_cause(moved(0.0), want, start, 3)
    nan = {"w": np.array([1.0, np.nan, 3.0]), "b": np.array([0.4])}
    assert "first in w (flat index 1" in likely_cause(nan, want, start, 3)
    assert likely_cause(moved(1.7), want, start, 3) == ""
    assert likely_cause({"w": np.array([9.0, 0.0, 1.0]), "b": np.array([0.0])}, want, start,
                        3) == ""
    assert "summed instead" in likely_cause({"v": np.array([4.0, -2.0])},
                                            {"v": np.array([2.0, -1.0])}, size=2)
    with pytest.raises(AssertionError, match=r"differs by .*Likely cause: a known slip\."):
        assert_close(moved(1.7), want, "x", 0, start=start, size=3,
                     mistakes={"not this one.": lambda: want, "a known slip.": lambda: moved(1.7)})
    with pytest.raises(AssertionError) as err:
        assert_close(moved(1.7), want, "x", 0, start=start, size=3)
    assert "Likely cause" not in str(err.value)


@pytest.mark.parametrize("size", [2, 3])
def test_each_rank_takes_its_own_salt_before_any_student_code(tmp_path, monkeypatch, size):
    """Where salts are given (at grading; here DTFS_SALT=1) each rank's ``ctx.salt`` is the
    number the judge wrote for it alone, and when the student's code runs no rank's salt file
    is left to read (each rank deleted its own, then waited for the others). Without salts
    every ``ctx.salt`` is 0 and the judge gets none."""
    path = student(tmp_path, "x = 1\n")
    monkeypatch.setenv(harness.SALT, "1")
    salts = {}
    got = run_ranks(path, "harness_probes:probe_salt", size, "gloo", timeout=60, salts=salts)
    assert sorted(salts) == list(range(size)) and len(set(salts.values())) == size, salts
    assert got == [(salts[r], []) for r in range(size)], (got, salts)
    monkeypatch.setenv(harness.SALT, "0")
    none = {}
    assert run_ranks(path, "harness_probes:probe_salt", size, "gloo", timeout=60,
                     salts=none) == [(0, [])] * size and none == {}


def test_every_point_to_point_form_is_counted_once_by_every_recorder(tmp_path):
    """Blocking, non-blocking, by group rank and batched (P2POp): one call is one message of
    its own kind, size and peer (size only in 08's) for the recorders of notebooks 03, 08 and
    10 (issue 37: torch
    2.14's dist.send is isend + wait, and notebook 10's recorder counted a blocking
    pipeline's every message twice), and notebook 08's (whose wrappers broke P2POp: torch
    accepts only its own isend / irecv there, and tells a send by identity)."""
    path = student(tmp_path, "x = 1\n")
    sent = [("send", 5, 1), ("isend", 5, 1), ("send", 5, 1), ("isend", 5, 1)]
    received = [("recv", 5, 0), ("irecv", 5, 0), ("recv", 5, 0), ("irecv", 5, 0)]
    for rank, logged in enumerate(run_ranks(path, "harness_probes:probe_point_to_point_forms",
                                            2, "gloo", timeout=60)):
        want = sent if rank == 0 else received
        assert logged["03"] == want, (rank, logged["03"])
        assert logged["10"] == want, (rank, logged["10"])
        assert logged["08"] == [(name, 5, None) for name, _, _ in want], (rank, logged["08"])


def test_every_rank_must_have_received_the_number_the_judge_gave_rank_0():
    """integrity.verify_rank0_number (notebooks 10 and 11): the shared inputs come from rank
    0's number as each rank's probe received it; a rank that got another (a file that changed
    the broadcast: unsalted inputs, whose answers a file could carry) is an integrity
    violation, judged against the judge's own number (0 where the launch was not salted)."""
    from exercise_utils.contract import CheckFailure
    from exercise_utils.integrity import VIOLATION, verify_rank0_number
    verify_rank0_number([{"salt0": 7}, {"salt0": 7}], {0: 7, 1: 3})
    verify_rank0_number([{"salt0": 0}, {"salt0": 0}, {"salt0": 0}], {})
    for res, salts in (([{"salt0": 7}, {"salt0": 0}], {0: 7, 1: 3}),
                       ([{"salt0": 0}, {"salt0": 0}], {0: 7, 1: 3}),     # all agree: not enough
                       ([{"salt0": 5}, {"salt0": 5}], {})):
        with pytest.raises(CheckFailure, match=VIOLATION):
            verify_rank0_number(res, salts)
