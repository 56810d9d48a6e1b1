"""Notebook 05's learning-rate scaling experiment: the schedule, and the torchrun script on 1
and 2 workers (quick sizes; no accuracy thresholds: quick runs are far too short)."""
import math

import pytest

from exercise_utils.ddp_torchrun_fault_tolerance import lr_scaling

FIELDS = {"workers", "rule", "warmup_epochs", "base_lr", "peak_lr", "batch", "global_batch",
          "steps_per_epoch", "steps", "epochs", "train_size", "test_size", "seed", "train_loss",
          "lr", "decay", "train_s", "threads", "test_loss", "accuracy", "wall_s"}


def test_rule_none_keeps_the_base_lr_whatever_the_workers():
    for k in (1, 2, 4):
        for step in (0, 3, 50):
            assert lr_scaling.lr_at(step, 10, k, "none", 0.01, warmup_epochs=1) == 0.01


def test_linear_rule_warms_up_per_step_to_k_times_the_base_lr():
    lr = [lr_scaling.lr_at(s, 10, 4, "linear", 0.01, warmup_epochs=1) for s in range(25)]
    assert lr[0] == pytest.approx(0.01)                       # starts at the base rate
    assert lr[5] == pytest.approx(0.01 + 0.03 * 5 / 10)        # linear, per step
    assert all(b > a for a, b in zip(lr[:10], lr[1:11]))      # rises every step of the warm-up
    assert lr[10:] == pytest.approx([0.04] * 15)              # then k * base, constant
    assert lr_scaling.lr_at(0, 10, 4, "linear", 0.01, warmup_epochs=0) == pytest.approx(0.04)
    assert lr_scaling.lr_at(2, 10, 3, "linear", 0.01, warmup_epochs=0.5) == pytest.approx(
        0.01 + 0.02 * 2 / 5)                                  # fractional warm-up, odd k
    assert lr_scaling.lr_at(7, 10, 1, "linear", 0.01, warmup_epochs=1) == 0.01   # k=1: no change
    with pytest.raises(ValueError, match="rule"):
        lr_scaling.lr_at(0, 10, 2, "sqrt")


def test_cosine_decay_after_the_warm_up_ends_at_zero():
    lr = [lr_scaling.lr_at(s, 10, 2, "linear", 0.01, 1, total_steps=30) for s in range(31)]
    assert lr[:11] == pytest.approx([0.01 + 0.01 * s / 10 for s in range(10)] + [0.02])
    assert lr[20] == pytest.approx(0.01)                      # half-way through the decay
    assert all(b < a for a, b in zip(lr[10:30], lr[11:31])) and lr[30] == pytest.approx(0)
    none = [lr_scaling.lr_at(s, 10, 4, "none", 0.01, 0, total_steps=30) for s in (0, 15, 30)]
    assert none == pytest.approx([0.01, 0.005, 0.0])          # same decay without scaling


def test_script_on_1_and_2_workers_halves_the_steps_and_scales_the_lr(tmp_path):
    one = lr_scaling.run(1, "none", seeds=(0,), out=tmp_path / "k1.json", echo=False)
    two = lr_scaling.run(2, "linear", 0.5, seeds=(0, 1), out=tmp_path / "k2.json", echo=False)
    assert len(one) == 1 and len(two) == 2, "one row per seed"
    for row in one + two:
        assert FIELDS <= set(row), f"missing fields {FIELDS - set(row)}"
        assert 0.0 <= row["accuracy"] <= 1.0 and math.isfinite(row["test_loss"])
        assert len(row["train_loss"]) == row["epochs"]
        assert row["steps"] == row["epochs"] * row["steps_per_epoch"] == len(row["lr"])
        assert row["lr"][0] == pytest.approx(row["base_lr"]) and max(row["lr"]) == pytest.approx(
            row["peak_lr"])
        assert row["threads"] == lr_scaling.THREADS
    r1, r2 = one[0], two[0]
    assert r1["steps_per_epoch"] == math.ceil(r1["train_size"] / r1["batch"])
    assert r2["steps_per_epoch"] * 2 == r1["steps_per_epoch"], "2 workers: half the steps"
    assert (r1["global_batch"], r2["global_batch"]) == (r1["batch"], 2 * r2["batch"])
    assert r1["peak_lr"] == r1["base_lr"] and r2["peak_lr"] == pytest.approx(2 * r2["base_lr"])
    half = r2["steps_per_epoch"] // 2                         # --warmup-epochs 0.5
    assert r2["lr"][half] == pytest.approx(r2["peak_lr"]), "warm-up of half an epoch is over"
    expected = [lr_scaling.lr_at(s, r2["steps_per_epoch"], 2, "linear", r2["base_lr"], 0.5,
                                 r2["steps"] if r2["decay"] == "cosine" else None)
                for s in range(r2["steps"])]
    assert r2["lr"] == pytest.approx(expected), "the script must follow lr_at"
    assert [r["seed"] for r in two] == [0, 1] and two[0]["train_loss"] != two[1]["train_loss"]

    rows = [dict(r, setting="1 worker") for r in one] + [
        dict(r, setting="linear + warm-up") for r in two[:1]]
    text = lr_scaling.table(rows)
    assert "linear + warm-up" in text and "steps/epoch" in text
    gap = lr_scaling.summary(rows)[1]["gap_points"]
    assert gap == pytest.approx(100 * (r1["accuracy"] - r2["accuracy"]))
    lr_scaling.plot(rows, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 0
