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
from grading import assert_release_regions_in_function_bodies, autograde_solution_and_blank

ROOT = Path(__file__).resolve().parents[1]
STEM = "07_bonus_zero_sharding"
SOLUTION = ROOT / "solutions" / f"{STEM}.ipynb"
RELEASE = ROOT / "notebooks" / f"{STEM}.ipynb"
POINTS = 8
RIGHT = ROOT / "tests" / "right"
CHECKERS = {"memory": checks.check_memory, "sharded": checks.check_sharded,
            "checkpoint": checks_checkpoint.check_checkpoint}


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
