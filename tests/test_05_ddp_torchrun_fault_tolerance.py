"""Notebook 05 (DDP under torchrun, snapshots, restarts): the checkers of the torchrun Trainer
against the known-wrong files, the fault injection and helpers of runner.py, and the whole
notebook autograded as the solution and as the blank release (which also proves that both
checkers accept the solution and say "not implemented yet" for the blank)."""
import json
from pathlib import Path

import pytest
import torch

from exercise_utils import cluster, launch
from exercise_utils.ddp_torchrun_fault_tolerance import checks, node_failure, runner
from exercise_utils.ddp_torchrun_fault_tolerance import join as ddp_join
from exercise_utils.notebook_files import extract_writefiles, writefile_cells
from grading import autograde_solution_and_blank

ROOT = Path(__file__).resolve().parents[1]
STEM = "05_ddp_torchrun_fault_tolerance"
SOLUTION = ROOT / "solutions" / f"{STEM}.ipynb"
RIGHT = ROOT / "tests" / "right"
POINTS = 8
CHECKERS = {"trainer": checks.check_trainer, "snapshots": checks.check_snapshots}


def exercise_of(stem):
    return next(name for name in CHECKERS if stem[3:].startswith(name))


@pytest.fixture(scope="module")
def solution_file(tmp_path_factory):
    return extract_writefiles(SOLUTION, tmp_path_factory.mktemp("solution05"))["05_trainer"]


def test_solution_writes_the_trainer_file():
    assert {Path(p).name for p in writefile_cells(SOLUTION)} == {"05_trainer.py"}


def _simulated_setup(tmp_path, source):
    """The check of ``ddp_setup`` on ``source`` (a trainer file's text), simulated in this
    process as a torchrun worker's rank 0 does it: no launch, no process group."""
    import importlib.util
    from exercise_utils.ddp_torchrun_fault_tolerance import probes
    path = tmp_path / f"trainer_{len(list(tmp_path.iterdir()))}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = runner.parse_args(checks.RUN)
    setup = {"cuda": probes.simulate_setup(module, config, True),
             "cpu": probes.simulate_setup(module, config, False)}
    checks._check_setup({"rank0_attempt0": {"setup": setup}})


@pytest.mark.parametrize("old, new, message", [
    ('torch.device("cuda", local_rank)', 'torch.device("cuda", rank)',
     "returned [3, 1, 4, 'cuda:3']; expected (rank, local_rank, world_size, device) = "
     "(3, 1, 4, 'cuda:1')"),
    ("        torch.cuda.set_device(local_rank)\n", "",
     "called torch.cuda.set_device with nothing; expected LOCAL_RANK (1)"),
    ('"nccl", torch.device', '"gloo", torch.device', "chose the backend 'gloo'; expected 'nccl'"),
    ('rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])',
     'rank = local_rank = int(os.environ["LOCAL_RANK"])', "returned [1, 1, 4, 'cuda:1']"),
])
def test_setup_check_names_gpu_mistakes(tmp_path, solution_file, old, new, message):
    """The GPU half of ddp_setup's requirement (its other half, the timeout, has the wrong file
    05_trainer_no_timeout), checked on a CPU: NCCL, cuda:LOCAL_RANK, set_device, RANK."""
    source = Path(solution_file).read_text()
    _simulated_setup(tmp_path, source)                    # the solution passes
    assert source.count(old) == 1
    with pytest.raises(AssertionError) as err:
        _simulated_setup(tmp_path, source.replace(old, new))
    assert message in str(err.value)
    assert "on a machine with CUDA (simulated" in str(err.value)


def test_resumed_check_names_a_load_without_map_location():
    """The map_location half of load_snapshot's requirement (its other half has the wrong file
    05_snapshots_scheduler_not_restored), without a launch."""
    final = {"attempt": 1, "epochs_run": 3, "step": 24, "scheduler_steps": 24, "model": {}}
    logs = {"rank0_attempt1": {"loads": [{"path": "snapshot.pt", "map_location": "None"}]}}
    with pytest.raises(AssertionError, match="torch.load without map_location"):
        checks._check_resumed(final, final, logs, "C")
    logs["rank0_attempt1"]["loads"][0]["map_location"] = "cpu"
    checks._check_resumed(final, final, logs, "C")


def test_rng_container_is_any_one_entry_per_rank():
    from exercise_utils.ddp_torchrun_fault_tolerance.checks import _one_entry_per_rank
    assert _one_entry_per_rank([1, 2], 2) and _one_entry_per_rank({1: "b", 0: "a"}, 2)
    assert not _one_entry_per_rank([1], 2) and not _one_entry_per_rank({"0": 1, "1": 2}, 2)
    assert not _one_entry_per_rank({0: 1, 1: 2, 2: 3}, 2) and not _one_entry_per_rank(None, 2)


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
    graded, seconds = autograde_solution_and_blank(tmp_path, STEM, POINTS, len(CHECKERS), 900)
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
