"""Notebook 06's benchmark script on the solution, quick sizes: one row per variant, sane
fields, identical replicas, table and plot. No timing assertions (a test is no benchmark)."""
import statistics
from pathlib import Path

from exercise_utils import ddp_bench
from exercise_utils.notebook_files import extract_writefiles

SOLUTION = Path(__file__).resolve().parents[1] / "solutions" / "06_build_your_own_ddp.ipynb"


def test_script_times_every_variant_and_keeps_replicas_identical(tmp_path):
    work = extract_writefiles(SOLUTION, tmp_path)["06_myddp"]
    rows = ddp_bench.run(work, out=tmp_path / "bench.json", echo=False)
    caps = [f"{c:g}" for c in ddp_bench.CAPS]
    expected = (["local", "naive", "flat", "overlap"] + [f"bucket {c}" for c in caps]
                + [f"torch {c}" for c in caps] + ["torch default"])
    assert [r["variant"] for r in rows] == expected, "one row per variant, in order"
    by = {r["variant"]: r for r in rows}
    tensors = by["local"]["param_tensors"]
    assert tensors == 4 * ddp_bench.DEPTH + 2
    for r in rows:
        assert r["step_ms"] > 0 and r["compute_ms"] > 0 and r["world_size"] == 2
        assert len(r["step_ms_all"]) == ddp_bench.REPEATS and r["threads"] == ddp_bench.THREADS
        assert r["exposed_share"] < 1
        if r["kind"] == "local":
            assert r["messages"] == 0 and r["comm_ms"] is None
            assert r["rank_diff"] > 0, "without sync the ranks' different batches must show"
        else:
            assert r["messages"] >= 1 and r["comm_ms"] > 0 and r["comm_share"] > 0
            assert r["rank_diff"] == 0, f"{r['variant']}: replicas differ by {r['rank_diff']}"
            assert r["torch_diff"] < 1e-4, f"{r['variant']} trained differently from torch DDP"
    assert by["naive"]["messages"] == by["overlap"]["messages"] == tensors
    assert by["flat"]["messages"] == 1 and by["bucket 25"]["messages"] == 1
    small = f"bucket {caps[0]}"
    assert 1 < by[small]["messages"] < tensors, "a tiny cap makes several buckets"
    assert by[f"torch {caps[0]}"]["messages"] > 1 and by["torch 25"]["messages"] == 1

    ratios = {r["variant"]: r for r in ddp_bench.with_ratios(rows)}
    assert ratios["torch default"]["vs_torch"] == 1.0
    paired = [a / b for a, b in zip(by["bucket 25"]["step_ms_all"], by["torch 25"]["step_ms_all"])]
    assert ratios["bucket 25"]["vs_torch_same_cap"] == statistics.median(paired)
    assert ratios["naive"]["vs_torch_same_cap"] is None
    text = ddp_bench.table(rows)
    assert "vs torch DDP" in text and "bucket 25" in text and "torch default" in text
    ddp_bench.plot(rows, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").stat().st_size > 0
