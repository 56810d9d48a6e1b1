"""Notebook 05, uneven inputs under DDP (exercise_utils.ddp_join): without ``model.join()`` the
rank with more batches waits in DDP's gradient all-reduce until the gloo timeout ends the job
(and nothing survives it); with it, every rank runs all its batches, the replicas are
identical and equal a single-process simulation. Two launches (about 25 s on 2 cores)."""
import pytest

from exercise_utils import ddp_join


@pytest.fixture(scope="module")
def hang():
    return ddp_join.demo("hang", echo=False)


@pytest.fixture(scope="module")
def join():
    return ddp_join.demo("join", echo=False)


def test_hang_ends_by_the_gloo_timeout_and_leaves_no_process(hang):
    assert hang["hung"] and hang["killed_by"] == "gloo timeout", hang
    assert "Timed out" in hang["error"], hang["error"]
    long_, short = hang["batches"]
    assert long_ > short, hang            # the 70/30 split: rank 0 has more batches
    assert hang["waits"][0] == (f"stuck in DDP's gradient all-reduce of batch {short + 1} "
                                f"of its {long_}"), hang["waits"]
    assert hang["waits"][1] == (f"ran all its {short} batches, then stuck in the "
                                "end-of-training barrier"), hang["waits"]
    assert hang["steps"] == [short, short], hang     # without join: rank 0 stops short
    assert hang["seconds"] < ddp_join.TIMEOUT / 2, hang     # the gloo timeout, not the launcher
    assert hang["left_processes"] == []


def test_join_runs_every_batch_on_every_rank(join):
    assert not join["hung"]
    assert join["batches"][0] > join["batches"][1], join
    assert join["steps"] == join["batches"], join    # the long rank ran all 14, not 6


def test_join_replicas_identical_and_equal_to_the_one_process_simulation(join):
    assert join["max_replica_diff"] <= 1e-6, join
    assert join["divide_by_initial"] is True
    assert join["max_vs_reference"] <= 1e-5, join
    # The simulation tells the two divisors apart, so the check above means something.
    assert join["max_vs_other_divisor"] > 1e-3, join


def test_table_shows_both_outcomes(hang, join):
    text = ddp_join.table([hang, join])
    lines = text.splitlines()
    assert len(lines) == 4, text
    assert "gloo timeout after" in lines[2] and "6 / 6" in lines[2], text
    assert "completed" in lines[3] and "14 / 6" in lines[3], text
