"""Notebook 07 (bonus: ZeRO-1 optimizer-state sharding): the three checkers against the
known-wrong files, the correct variants (tests/right/) and the blank release, a crash in one stage costing only its points, and the
whole notebook autograded as the solution and as the blank release, with the rows of the
benchmark it ran (``bench``, quick sizes) checked.

``check_sharded`` and ``check_checkpoint`` share their launches (one per world size, 2 and 3
ranks) per file content; ``check_memory`` launches nothing."""
import json
from pathlib import Path

import pytest

from exercise_utils.bonus_zero_sharding import bench, checks, checks_checkpoint
from exercise_utils.notebook_files import extract_writefiles
from grading import (assert_release_regions_in_function_bodies,
                     assert_wrong_files_listed, autograde_solution_and_blank)

ROOT = Path(__file__).resolve().parents[1]
STEM = "07_bonus_zero_sharding"
SOLUTION = ROOT / "solutions" / f"{STEM}.ipynb"
RELEASE = ROOT / "notebooks" / f"{STEM}.ipynb"
POINTS = 8
WRONG = ROOT / "tests" / "wrong"
RIGHT = ROOT / "tests" / "right"
CHECKERS = {"memory": checks.check_memory, "sharded": checks.check_sharded,
            "checkpoint": checks_checkpoint.check_checkpoint}

# Each known-wrong file and a fragment of the message its checker must give.
EXPECTED = {
    "07_memory_stage1_grads": "expected 3.14062e+10 bytes (31.41 GB) for the stage 1, P_os",
    "07_sharded_full_state": "each rank must keep state only for its own shard",
    "07_sharded_no_sync": "every rank must receive the updated parameters from their owners",
    "07_sharded_unbalanced": "unbalanced partition with 2 ranks",
    "07_sharded_group_defaults": "its hyper-parameters must be kept",
    "07_sharded_not_an_optimizer": "ShardedOptimizer must be a torch.optim.Optimizer",
    "07_sharded_scheduler_not_synced": "step() must copy the hyper-parameters of param_groups "
                                       "to the local optimizer first",
    "07_checkpoint_local_indices": "map each rank's local indices to the global ones",
    "07_memory_ignores_k": "bytes_per_device(2e+06, 8, stage=0, k=8) returned 3.2e+07 bytes",
    "07_memory_no_value_error": "bytes_per_device(1000, 2, stage=4) must raise ValueError",
    "07_sharded_unsorted_greedy": "partition_parameters([1, 1, 10], 2, loads=None) returned "
                                  "[0, 1, 0]; expected [1, 1, 0]",
    "07_sharded_loads_ignored": "partition a new group starting from the elements each rank "
                                "already owns",
    "07_sharded_zero_grad_own_shard": "reset the gradients of ALL parameters",
    "07_checkpoint_hyperparameters_local_only": "into param_groups too",
    "07_checkpoint_ignores_to": "rank 1 raised RuntimeError: no consolidated state on this rank",
}


def exercise_of(stem):
    return next(name for name in CHECKERS if stem[3:].startswith(name))


@pytest.fixture(scope="module")
def solution_file(tmp_path_factory):
    return extract_writefiles(SOLUTION, tmp_path_factory.mktemp("solution07"))["07_zero"]


@pytest.fixture(scope="module")
def blank_file(tmp_path_factory):
    """The release's student file: every solution region replaced by a raise."""
    return extract_writefiles(RELEASE, tmp_path_factory.mktemp("blank07"))["07_zero"]


def test_release_regions_sit_inside_function_bodies(blank_file):
    assert_release_regions_in_function_bodies(blank_file, 8)


def test_every_wrong_file_has_an_expected_message():
    assert_wrong_files_listed("07", EXPECTED)


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_checker_rejects_wrong_file(stem):
    with pytest.raises(AssertionError) as err:
        CHECKERS[exercise_of(stem)](WRONG / f"{stem}.py")
    assert EXPECTED[stem] in str(err.value)


@pytest.mark.parametrize("stem", sorted(p.stem for p in RIGHT.glob("07_*.py")))
def test_checker_accepts_right_file(stem):
    """Correct files written differently from the solution (tests/right/) must pass."""
    CHECKERS[exercise_of(stem)](RIGHT / f"{stem}.py")



def test_a_crashing_checkpoint_costs_only_its_own_points(tmp_path, solution_file):
    """load_state_dict raising (not NotImplementedError) fails the combined launch; the
    training stage is then run on its own and passes."""
    text = Path(solution_file).read_text().replace(
        '        groups, state, local = [], {}, 0\n',
        '        raise KeyError("params")\n', 1)
    path = tmp_path / "07_zero.py"
    path.write_text(text)
    with pytest.raises(AssertionError, match="rank . raised KeyError"):
        checks_checkpoint.check_checkpoint(path)
    checks.check_sharded(path)


# ------------------------------------------------------------------ whole notebook
@pytest.mark.notebook
def test_autograde_solution_and_blank(tmp_path):
    graded, seconds = autograde_solution_and_blank(tmp_path, STEM, POINTS, len(CHECKERS), 900)
    assert "7.5B (ZeRO paper)" in graded and "torch zero" in graded
    # the benchmark the notebook ran (quick sizes): its rows, table and plot
    results = tmp_path / "course" / "autograded" / "solution" / STEM / "results"
    assert_benchmark_rows(json.loads((results / "07_zero_bench.json").read_text()), tmp_path)


def assert_benchmark_rows(rows, tmp_path):
    """One row per variant, world size and rank; the optimizer state measured per rank is the
    whole with 1 rank and about 1/N of it with N ranks for both sharded optimizers; every
    variant trains alike. No timing or RSS assertions (a test is no benchmark)."""
    worlds = tuple(bench.WORLD_SIZES)
    keys = [(r["variant"], r["world_size"], r["rank"]) for r in rows]
    assert sorted(keys) == sorted((v, w, r) for w in worlds for v in bench.VARIANTS
                                  for r in range(w))
    full = next(r["state_mb"] for r in rows if r["variant"] == "adam" and r["world_size"] == 1)
    assert full == pytest.approx(2 * rows[0]["param_mb"], rel=0.01), "AdamW: two moments"
    for r in rows:
        assert r["param_diff"] < 1e-6, f"{r['variant']} with {r['world_size']} ranks trained " \
                                       "differently from AdamW"
        assert r["rss_mb"] >= 0
        if r["variant"] == "adam":
            assert r["state_mb"] == full, "plain AdamW keeps the whole state on every rank"
    for world in worlds:
        for variant in ("sharded", "torch zero"):
            shares = [r["state_mb"] for r in rows
                      if r["variant"] == variant and r["world_size"] == world]
            assert sum(shares) == pytest.approx(full, rel=1e-6), (variant, world, shares)
            assert max(shares) <= 1.3 * full / world, (variant, world, shares)
    summary = {(s["variant"], s["world_size"]): s for s in bench.summary(rows)}
    assert summary[("adam", 1)]["state_vs_adam"] == 1.0
    text = bench.table(rows)
    assert "state MB (max rank)" in text and "torch zero" in text
    bench.plot(rows, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").stat().st_size > 0
