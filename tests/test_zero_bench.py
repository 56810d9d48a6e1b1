"""Notebook 07's benchmark script on the solution, quick sizes: one row per variant, world size
and rank; the optimizer state measured per rank is the whole with 1 rank and about 1/N of it
with N ranks for both sharded optimizers; every variant trains alike; table and plot. No
timing or RSS assertions (a test is no benchmark)."""
from pathlib import Path

import pytest

from exercise_utils import zero_bench
from exercise_utils.notebook_files import extract_writefiles

SOLUTION = Path(__file__).resolve().parents[1] / "solutions" / "07_bonus_zero_sharding.ipynb"


WORLDS = (1, 3)          # two of the notebook's three launches (1, 2, 3 ranks): under 30 s


def test_script_measures_state_per_rank_for_every_variant(tmp_path):
    work = extract_writefiles(SOLUTION, tmp_path)["07_zero"]
    rows = zero_bench.run(work, out=tmp_path / "bench.json", world_sizes=WORLDS, echo=False)
    assert (tmp_path / "bench.json").is_file()
    keys = [(r["variant"], r["world_size"], r["rank"]) for r in rows]
    assert sorted(keys) == sorted((v, w, r) for w in WORLDS for v in zero_bench.VARIANTS
                                  for r in range(w))
    full = next(r["state_mb"] for r in rows if r["variant"] == "adam" and r["world_size"] == 1)
    assert full == pytest.approx(2 * rows[0]["param_mb"], rel=0.01), "AdamW: two moments"
    for r in rows:
        assert r["param_diff"] < 1e-6, f"{r['variant']} with {r['world_size']} ranks trained " \
                                       "differently from AdamW"
        assert r["rss_mb"] >= 0
        if r["variant"] == "adam":
            assert r["state_mb"] == full, "plain AdamW keeps the whole state on every rank"
    for world in WORLDS:
        for variant in ("sharded", "torch zero"):
            shares = [r["state_mb"] for r in rows
                      if r["variant"] == variant and r["world_size"] == world]
            assert sum(shares) == pytest.approx(full, rel=1e-6), (variant, world, shares)
            assert max(shares) <= 1.3 * full / world, (variant, world, shares)
    summary = {(s["variant"], s["world_size"]): s for s in zero_bench.summary(rows)}
    assert summary[("adam", 1)]["state_vs_adam"] == 1.0
    text = zero_bench.table(rows)
    assert "state MB (max rank)" in text and "torch zero" in text
    zero_bench.plot(rows, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").stat().st_size > 0
