"""Notebook 05 (DDP under torchrun, snapshots, restarts): the simulated GPU paths, the judge's
step count and digests (Hypothesis), the checks' torchrun agent against workers that crash with
an exit code and with a signal, the fault injection and helpers of runner.py, and the whole
notebook autograded as the solution and as the blank release (which also proves that both
checkers accept the solution and say "not implemented yet" for the blank). The checks against
the known-wrong and right files: ``tests/test_checks.py``."""
import json
from pathlib import Path

import pytest
import torch

from hypothesis import given, settings
from hypothesis import strategies as st

from exercise_utils import cluster, launch
from exercise_utils.ddp_torchrun_fault_tolerance import (checks, digests, jobs, node_failure,
                                                         runner, simulate)
from exercise_utils.ddp_torchrun_fault_tolerance import join as ddp_join
from exercise_utils.notebook_files import extract_writefiles, writefile_cells
from grading import (autograde_solution_and_blank,
                     assert_launched_cells_open_with_their_box)

ROOT = Path(__file__).resolve().parents[1]
STEM = "05_ddp_torchrun_fault_tolerance"
SOLUTION = ROOT / "solutions" / f"{STEM}.ipynb"
POINTS = 8
CHECKERS = {"trainer": checks.check_trainer, "snapshots": checks.check_snapshots}


@pytest.fixture(scope="module")
def solution_file(tmp_path_factory):
    return extract_writefiles(SOLUTION, tmp_path_factory.mktemp("solution05"))["05_trainer"]


def test_solution_writes_the_trainer_file():
    assert {Path(p).name for p in writefile_cells(SOLUTION)} == {"05_trainer.py"}


def test_the_solution_passes_the_simulated_gpu_paths(solution_file):
    """ddp_setup and Trainer(...) on cuda:1, simulated in this process as rank 0 of a checked
    job does it (no launch, no group, no GPU); the checker's verdict on what was recorded."""
    from exercise_utils.rankworker import load_student
    student = load_student(solution_file)
    config = runner.parse_args(jobs.RUN + ["--snapshot", "absent.pt"])
    setup = {"cuda": simulate.simulate_setup(student, config, True),
             "cpu": simulate.simulate_setup(student, config, False)}
    assert setup["cuda"]["returned"] == [3, 1, 4, "cuda:1"] and setup["cuda"]["set_device"] == ["1"]
    checks._check_setup(setup)
    init = simulate.simulate_init(student, config)
    assert init == {"moved": ["cuda:1"], "ddp": [["1"]], "sampler": [4, 3]}
    checks._check_init(init)
    with pytest.raises(AssertionError, match="device_ids=\\['0'\\]"):
        checks._check_init({**init, "ddp": [["0"]]})
    with pytest.raises(AssertionError, match="= \\(2, 1\\); expected \\(4, 3\\)"):
        checks._check_init({**init, "sampler": [2, 1]})


@settings(max_examples=200, deadline=None)
@given(train=st.integers(1, 300), workers=st.integers(1, 5), batch=st.integers(1, 40))
def test_steps_per_epoch_is_what_a_distributed_sampler_gives(train, workers, batch):
    """The judge's step count equals the batches a DataLoader over a DistributedSampler yields on
    every rank (padding included), for any data size, world size and batch size."""
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    data = TensorDataset(torch.arange(train))
    for rank in range(workers):
        sampler = DistributedSampler(data, num_replicas=workers, rank=rank, shuffle=True)
        assert len(DataLoader(data, batch_size=batch, sampler=sampler)) == \
            jobs.steps_per_epoch(workers, train, batch)


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=20),
       where=st.integers(0, 19))
def test_digests_tell_tensors_apart_by_value_dtype_and_shape(values, where):
    x = torch.tensor(values, dtype=torch.float64)
    assert digests.tensor_digest(x) == digests.tensor_digest(x.clone())
    y = x.clone()
    y[where % len(values)] += 1.0
    assert digests.fingerprint(y) != digests.fingerprint(x)
    assert digests.tensor_digest(x.float())[2] == "float32" != digests.tensor_digest(x)[2]
    assert digests.fingerprint(x.reshape(1, -1)) != digests.fingerprint(x)
    assert digests.fingerprint(torch.tensor(len(values))) == digests.fingerprint(
        torch.tensor(len(values)))                       # 0-d int64 (BatchNorm's counter)


def test_a_loader_draws_from_the_sampler_directly_or_through_a_batch_sampler():
    """"self.loader: a DataLoader that draws from self.sampler, with config.batch_size
    examples per worker": sampler= with batch_size=, or batch_sampler=BatchSampler(sampler,
    ...), both count (a correct file written from the notebook used the second)."""
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, TensorDataset
    data = TensorDataset(torch.arange(10))
    sampler = DistributedSampler(data, num_replicas=2, rank=0)
    yes = {"batch_size": 4, "sampler_is_self_sampler": True}
    assert digests.loader_digest(DataLoader(data, batch_size=4, sampler=sampler), sampler) == yes
    assert digests.loader_digest(DataLoader(data, batch_sampler=BatchSampler(
        sampler, 4, drop_last=False)), sampler) == yes
    other = DistributedSampler(data, num_replicas=2, rank=0)
    assert digests.loader_digest(DataLoader(data, batch_size=4, sampler=other), sampler) == {
        "batch_size": 4, "sampler_is_self_sampler": False}
    assert digests.loader_digest(DataLoader(data, batch_size=8, shuffle=True), sampler)[
        "sampler_is_self_sampler"] is False
    assert not digests.loader_digest(None, sampler)["sampler_is_self_sampler"]


def test_the_sweeps_reach_every_edge_the_contract_names():
    """World size 3 that does not divide the data (padding), float64 in the snapshot jobs, a
    model with buffers (a 0-d int64 one), a frozen parameter, a tied weight and dropout, a
    warm-up that lasts into epoch 2 (the scheduler's state matters after the epoch-1 snapshot),
    a resume from a snapshot taken mid-run, a crash during a write, a simulated worker whose
    RANK, LOCAL_RANK and GPU differ."""
    from exercise_utils.ddp_torchrun_fault_tolerance import checks_snapshots
    assert jobs.TRAIN % checks.WORKERS and checks.WORKERS == 3
    assert "float64" in checks_snapshots.ARGS and "--crash-in-save" not in checks_snapshots.ARGS
    model = runner.check_net()
    buffers = dict(model.named_buffers())
    assert buffers["bn.num_batches_tracked"].dtype == torch.int64
    assert buffers["bn.num_batches_tracked"].dim() == 0
    assert not model.frozen.requires_grad and model.mid.weight is model.back.weight
    assert {"mid.weight", "back.weight"} <= set(model.state_dict())
    assert len(list(model.parameters())) == len(model.state_dict()) - len(buffers) - 1  # tied
    warmup = int(jobs.RUN[jobs.RUN.index("--warmup-steps") + 1])
    assert jobs.steps_per_epoch(checks_snapshots.WORKERS) < warmup < jobs.EPOCHS * \
        jobs.steps_per_epoch(checks_snapshots.WORKERS)
    assert simulate.FAKE_RANK != simulate.FAKE_LOCAL != 0


def test_agent_reports_the_first_failure_and_stops_the_others():
    """The checks' torchrun agent meets workers that exit with a code and that are killed by a
    signal: it names the first, stops the others (which would sleep for a minute), and reports
    a clean attempt as such."""
    import os
    import signal
    import time
    from exercise_utils.ddp_torchrun_fault_tolerance import agent

    def worker(failing, how):
        def run(rank, nproc, attempt, restarts, port, argv):
            if rank == failing:
                time.sleep(0.3)
                if how == "code":
                    os._exit(3)
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60 if how else 0)
            os._exit(0)
        return run
    start = time.monotonic()
    assert agent.run_attempt(3, 0, 0, [], target=worker(1, "code")) == (1, 3)
    assert agent.run_attempt(2, 0, 0, [], target=worker(0, "signal")) == (0, -signal.SIGKILL)
    assert time.monotonic() - start < 30
    assert agent.run_attempt(2, 0, 0, [], target=worker(None, None)) is None
    assert "killed by signal SIGKILL" in agent._describe(-9)


def test_agent_prefixes_every_line_with_the_rank():
    import io
    from exercise_utils.ddp_torchrun_fault_tolerance import agent
    out = io.StringIO()
    stream = agent._Prefixed(out, 1)
    stream.write("a\nb")
    stream.write("c\n")
    assert out.getvalue() == "[rank1]: a\n[rank1]: bc\n"


def test_settings_and_attempt_counter(monkeypatch):
    config = runner.parse_args(["--epochs", "2", "--crash-at-step", "5", "--lr", "0.1"])
    assert (config.epochs, config.crash_at_step, config.lr, config.crash_rank) == (2, 5, 0.1, 1)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert runner.attempt() == 1
    model = runner.make_model("mlp")
    opt, sched = runner.make_optimizer(model, runner.RunConfig(lr=1.0, warmup_steps=10))
    lrs = []
    for _ in range(12):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.1) and lrs[5] == pytest.approx(0.55) and lrs[10:] == [1.0, 1.0]


def test_rng_state_round_trip():
    import random
    import numpy as np
    import torch
    state = runner.rng_state()
    first = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    runner.set_rng_state(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == first


def test_compare_reports_the_largest_difference(tmp_path):
    import torch
    def out(path, w, step, sums, attempt):
        torch.save({"model": {"w": torch.tensor(w)}, "step": step, "epochs_run": 3,
                    "checksums": sums, "attempt": attempt, "world_size": 2}, path)
    out(tmp_path / "a.pt", [1.0, 2.0], 24, [[3.0], [3.0]], 0)
    out(tmp_path / "b.pt", [1.0, 2.5], 24, [[3.5], [3.25]], 1)
    cmp = runner.compare(tmp_path / "a.pt", tmp_path / "b.pt")
    assert cmp["max_abs_diff"] == 0.5 and cmp["attempts"] == (0, 1)
    assert cmp["replica_spread"] == (0.0, 0.25) and cmp["steps"] == (24, 24)


# ------------------------------------------------------------------ whole notebook
@pytest.mark.notebook
def test_autograde_solution_and_blank(tmp_path):
    graded, seconds = autograde_solution_and_blank(tmp_path, STEM, POINTS, len(CHECKERS))
    # the restarted job ends with the uninterrupted job's parameters, in the notebook too
    assert "largest parameter difference between A and B: 0" in graded
    assert "restarted 1 time(s)" in graded and "one job: 2 workers on 2 nodes" in graded
    assert "linear + warm-up" in graded
    # uneven inputs under DDP (the join module), from the notebook's two runs: without
    # model.join() the long rank waits in DDP's all-reduce until gloo's timeout ends the job
    # (nothing survives it); with it every rank runs all its batches, replicas identical and
    # equal to a one-process simulation
    results = tmp_path / "course" / "autograded" / "solution" / STEM / "results" / "05"
    hang, join = (json.loads((results / f"ddp_join_{mode}.json").read_text())
                  for mode in ("hang", "join"))
    hang["waits"] = {int(rank): where for rank, where in hang["waits"].items()}
    assert_hang_ends_by_the_gloo_timeout_and_leaves_no_process(hang)
    assert_join_runs_every_batch_on_every_rank(join)
    assert_join_replicas_identical_and_equal_to_the_one_process_simulation(join)
    assert_table_shows_both_outcomes(hang, join)
    # two hosts with their own network (root only; CI is root), and a node that dies
    if cluster.unavailable_reason():
        assert graded.count("skipped: ") == 2, "without root both cluster cells must say why"
        return
    assert "hostnames the workers saw: ['h0', 'h1']" in graded
    assert_node_failure(json.loads((results.parent / "05_node_failure.json").read_text()))


def assert_node_failure(found):
    """fixed: the job fails at the join timeout; replaced: ends exactly as the uninterrupted
    run; elastic: goes on alone (world size 1, more steps per epoch)."""
    runs = {r["mode"]: r for r in found["runs"]}
    for r in runs.values():
        assert "node 1 dies after step" in r["story"], r["story"]
        # h0's worker failed (gloo words it differently from run to run: "Connection closed by
        # peer", "reset by peer", ...) and h0's agent restarted
        assert "Worker group FAILED" in r["story"], r["story"]
    fixed, replaced, elastic = runs["fixed"], runs["replaced"], runs["elastic"]
    assert not fixed["ok"] and "RendezvousTimeoutError" in fixed["error"], fixed
    assert node_failure.JOIN_TIMEOUT < fixed["after_death"] < node_failure.JOIN_TIMEOUT + 60
    assert replaced["ok"] and "a new node starts" in replaced["story"], replaced
    spe = found["steps_per_epoch"]
    assert replaced["final"] == {"attempt": 1, "world_size": 2, "step": 3 * spe,
                                 "epochs_run": 3}, replaced["final"]
    assert found["replaced_vs_a"] == 0, "the replaced node's job must end as run A"
    assert elastic["ok"] and elastic["final"]["world_size"] == 1, elastic
    assert elastic["final"]["step"] > 3 * spe and elastic["final"]["epochs_run"] == 3, elastic


def assert_hang_ends_by_the_gloo_timeout_and_leaves_no_process(hang):
    assert hang["hung"] and hang["killed_by"] == "gloo timeout", hang
    assert ddp_join.is_gloo_timeout(hang["error"]), hang["error"]
    long_, short = hang["batches"]
    assert long_ > short, hang            # the 70/30 split: rank 0 has more batches
    assert hang["waits"][0] == (f"stuck in DDP's gradient all-reduce of batch {short + 1} "
                                f"of its {long_}"), hang["waits"]
    assert hang["waits"][1] == (f"ran all its {short} batches, then stuck in the "
                                "end-of-training barrier"), hang["waits"]
    assert hang["steps"] == [short, short], hang     # without join: rank 0 stops short
    assert hang["seconds"] < ddp_join.TIMEOUT / 2, hang     # the gloo timeout, not the launcher
    assert hang["left_processes"] == []


def assert_join_runs_every_batch_on_every_rank(join):
    assert not join["hung"]
    assert join["batches"][0] > join["batches"][1], join
    assert join["steps"] == join["batches"], join    # the long rank ran all 14, not 6


def assert_join_replicas_identical_and_equal_to_the_one_process_simulation(join):
    assert join["max_replica_diff"] <= 1e-6, join
    assert join["divide_by_initial"] is True
    assert join["max_vs_reference"] <= 1e-5, join
    # The simulation tells the two divisors apart, so the check above means something.
    assert join["max_vs_other_divisor"] > 1e-3, join


def assert_table_shows_both_outcomes(hang, join):
    text = ddp_join.table([hang, join])
    lines = text.splitlines()
    assert len(lines) == 4, text
    assert "gloo timeout after" in lines[2] and "6 / 6" in lines[2], text
    assert "completed" in lines[3] and "14 / 6" in lines[3], text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")
def test_gpu_run_uses_nccl_and_the_local_gpu(solution_file, tmp_path):
    """One worker per GPU (at most 2): NCCL, device_ids, a snapshot loaded back with
    map_location after an injected crash."""
    n = min(2, torch.cuda.device_count())
    out, snap = tmp_path / "final.pt", tmp_path / "snap.pt"
    launch.torchrun(solution_file, n, [
        "--data", "synthetic", "--train-size", "512", "--epochs", "2", "--snapshot", snap,
        "--out", out, "--crash-at-step", "12", "--crash-rank", n - 1],
        extra=["--max-restarts", "1"], timeout=300)
    final = torch.load(out, map_location="cpu")
    assert final["attempt"] == 1 and final["epochs_run"] == 2
    sums = final["checksums"]
    assert all(max(abs(a - b) for a, b in zip(s, sums[0])) < 1e-6 for s in sums)


@pytest.mark.timeout(420)
def test_every_launched_cell_of_the_blank_release_opens_with_its_box(tmp_path):
    """Issue 39: a student who runs a try cell, an experiment or a benchmark before finishing
    the file meets the short box first (which function, what to do), no traceback."""
    assert_launched_cells_open_with_their_box(STEM, tmp_path / "student")
