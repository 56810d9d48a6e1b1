"""Notebook 04 (data-parallel CIFAR-10 ResNet): its checkers against the known-wrong files,
the launcher and settings, the real CIFAR-10 loading path on a fixture in CIFAR's pickle
format, the experiment tables, the GPU path (where a GPU exists), and the whole notebook
autograded as the solution and as the blank release."""
import dataclasses
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exercise_utils import launch, models
from exercise_utils.resnet_cifar_data_parallel import (checks, checks_rank, probes, probes_rank,
                                                       runner, tricks)
from exercise_utils.resnet_cifar_data_parallel import experiments as cx
from exercise_utils.bench import load_json
from exercise_utils.notebook_files import extract_writefiles, writefile_cells
from grading import (autograde_solution_and_blank,
                     assert_launched_cells_open_with_their_box)
from test_data import make_cifar

ROOT = Path(__file__).resolve().parents[1]
STEM = "04_resnet_cifar_data_parallel"
SOLUTION = ROOT / "solutions" / f"{STEM}.ipynb"
RIGHT = ROOT / "tests" / "right"
CHECKERS = {"rank_process": checks.check_rank_process, "train": checks.check_train}
POINTS = 6


def exercise_of(stem):
    return next(name for name in CHECKERS if stem[3:].startswith(name))


@pytest.fixture(scope="module")
def solution_file(tmp_path_factory):
    return extract_writefiles(SOLUTION, tmp_path_factory.mktemp("solution04"))["04_cifar_dp"]


def test_solution_writes_the_trainer_file():
    assert {Path(p).name for p in writefile_cells(SOLUTION)} == {"04_cifar_dp.py"}


def test_importing_the_checker_patches_nothing():
    """The checker is imported in the notebook kernel: it must not replace the trainer's parts."""
    assert models.ResNetBagOfTricks is probes.ORIGINAL["ResNetBagOfTricks"]
    assert models.ResNetBagOfTricks is not probes._RecordedModel
    for name in ("EMA", "minibatches", "evaluate"):
        assert getattr(tricks, name) is probes.ORIGINAL[name]


def train_configs():
    return [(name, world, dataclasses.replace(probes.CONFIG, **changes))
            for name, world, changes in probes.TRAIN_RUNS]


def test_check_config_makes_the_classic_splits_uneven():
    """Every train run (47 examples on 2 ranks, 71 on 3, 23 on 1): the correct split runs 2
    minibatches of one ghost batch per rank and leaves a remainder; with more than one rank
    the 'last rank takes the rest' and strided (ceil) splits give a rank a third."""
    for name, world, c in train_configs():
        mb = c.batch_size // world
        per = c.train_size // world
        assert mb == c.ghost_size and per // mb == 2 and (c.train_size % world or world == 1), name
        assert c.train_size % mb and per % mb, name           # remainders to drop
        if world > 1:
            assert (c.train_size - (world - 1) * per) // mb == 3, name
            assert -(-c.train_size // world) // mb == 3, name


def test_the_sweeps_reach_every_edge_the_contract_names():
    """train: 1, 2 and 3 ranks, 2 epochs, an ema_every that divides the steps of an epoch and
    one that does not (a count restarted per epoch never reaches it); rank_process: 1, 2 and 3
    ranks, no GPU, one GPU shared, a GPU per rank, a train that raises, every timeout
    different, an address other than the default; one launch holds the largest run."""
    configs = train_configs()
    assert {world for _, world, _ in configs} == {1, 2, 3}
    assert all(c.epochs >= 2 for _, _, c in configs)
    per_epoch = {name: c.train_size // world // (c.batch_size // world)
                 for name, world, c in configs}
    everies = {(name, c.ema_every) for name, _, c in configs}
    assert any(per_epoch[n] % e == 0 for n, e in everies)
    assert any(per_epoch[n] % e and e <= 2 * per_epoch[n] for n, e in everies)
    runs = probes_rank.RUNS
    assert {world for _, world, *_ in runs} == {1, 2, 3}
    assert {0, 1} <= {gpus for _, _, gpus, *_ in runs}
    assert any(gpus >= world for _, world, gpus, *_ in runs)
    assert any(raises for *_, raises in runs)
    timeouts = [t for _, _, _, t, _, _ in runs]
    assert len(set(timeouts)) == len(timeouts) and runner.TrainConfig.timeout_s not in timeouts
    assert {addr for *_, addr, _ in runs} - {runner.TrainConfig.master_addr}
    assert probes.LAUNCH == max(world for _, world, *_ in runs + probes.TRAIN_RUNS)


@settings(max_examples=200, deadline=None)
@given(gpus=st.integers(0, 8), world=st.integers(1, 8), data=st.data())
def test_judge_backend_is_choose_backend_under_simulated_gpus(gpus, world, data):
    """The backend and device the rank_process check demands, for any number of (simulated)
    GPUs, ranks and rank, are what runner.choose_backend returns (the contract's pair)."""
    rank = data.draw(st.integers(0, world - 1))
    set_devices = []
    with probes.simulated_gpus(gpus, set_devices):
        backend, device = runner.choose_backend(world, rank)
    assert (backend, str(device)) == checks_rank.expected_backend(gpus, world, rank)
    assert set_devices == ([str(rank)] if gpus >= world else [])
    assert torch.cuda.set_device is not None and "lambda" not in repr(torch.cuda.device_count)


# ------------------------------------------------------------------ launcher and settings
def test_settings_presets_and_command_line():
    world, results, config = runner.parse_args(
        ["--world-size", "3", "--preset", "gpu", "--epochs", "4", "--augment", "false",
         "--lr", "0.2", "--data", "synthetic-cifar10", "--results", "r.json"])
    assert (world, results) == (3, "r.json")
    assert (config.epochs, config.augment, config.lr, config.width) == (4, False, 0.2, 64)
    cpu = runner.make_config("cpu")
    assert cpu.width == 16 and cpu.batch_size == 128 and cpu.train_size < 50000
    with pytest.raises(ValueError, match="unknown settings"):
        runner.make_config("cpu", widht=8)
    with pytest.raises(SystemExit):
        runner.parse_args(["--augment", "maybe"])


def test_backend_and_device_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: test_gpu_run covers it")
    assert runner.choose_backend(2, 1) == ("gloo", torch.device("cpu"))


def test_real_cifar_loading_path_and_launcher_on_a_fixture(solution_file, tmp_path):
    """CIFAR-10 python batches (the real archive's format) through the trainer: 2 ranks,
    the launcher's spawn, rank 0's JSON summary."""
    make_cifar(tmp_path / "data" / "cifar-10-batches-py")     # 20 training, 6 test images
    assert runner.resolve_data("auto", str(tmp_path / "data")) == "cifar10"
    assert runner.resolve_data("auto", str(tmp_path / "nothing")) == "synthetic-cifar10"
    out = tmp_path / "run.json"
    result = launch.python(solution_file, [
        "--world-size", "2", "--preset", "cpu", "--data", "auto", "--data-root",
        tmp_path / "data", "--train-size", "20", "--test-size", "6", "--batch-size", "8",
        "--ghost-size", "4", "--width", "4", "--epochs", "2", "--whitening-examples", "20",
        "--results", out], timeout=120, echo=False)
    summary = load_json(out)["summary"]
    assert summary["data"] == "cifar10" and summary["device"] == "cpu"
    assert (summary["examples"], summary["minibatch_size"], summary["minibatches_per_epoch"]) \
        == (10, 4, 2)
    assert [e["epoch"] for e in summary["epochs"]] == [1, 2]
    assert 0 <= summary["epochs"][-1]["val_acc"] <= 1
    assert "cifar10 train: 20 images from folder" in result.output
    assert "rank 1: 10 training examples, 2 minibatches of 4 per epoch" in result.output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")
def test_gpu_run(solution_file, tmp_path):
    out = tmp_path / "gpu.json"
    launch.python(solution_file, ["--world-size", "1", "--preset", "gpu", "--data",
                                  "synthetic-cifar10", "--train-size", "2048", "--test-size",
                                  "512", "--epochs", "1", "--results", out], timeout=300)
    summary = load_json(out)["summary"]
    assert summary["device"].startswith("cuda") and summary["epochs"][0]["val_acc"] > 0


# ------------------------------------------------------------------ experiment tables
def _summary(world, seconds, acc):
    return dict(world_size=world, device="cpu", batch_size=128 * world, minibatch_size=128,
                minibatches_per_epoch=16 // world,
                epochs=[dict(epoch=1, time_s=99.0, train_loss=2.0, val_acc=0.1),
                        dict(epoch=2, time_s=seconds, train_loss=0.5, val_acc=acc)],
                config=dict(width=16))


def test_tables_and_plot(tmp_path):
    runs = [_summary(1, 6.0, 0.9), _summary(2, 4.0, 0.88)]
    rows = cx.rows(runs)
    assert [r["speed"] for r in rows] == [1.0, 1.5]        # from the last epoch's time
    assert "1.50" in cx.table(runs) and "0.880" in cx.table(runs)
    assert "0.2" not in cx.seed_table().split("\n")[0] and "2.73" in cx.seed_table()
    assert Path(cx.plot(runs, tmp_path / "p.png")).stat().st_size > 1000


# ------------------------------------------------------------------ whole notebook
@pytest.mark.notebook
def test_autograde_solution_and_blank(tmp_path):
    graded, _ = autograde_solution_and_blank(tmp_path, STEM, POINTS, len(CHECKERS))
    assert "speed vs 1st" in graded and "gradient all-reduce, 2 gloo ranks" in graded


@pytest.mark.timeout(420)
def test_every_launched_cell_of_the_blank_release_opens_with_its_box(tmp_path):
    """Issue 39: a student who runs a try cell, an experiment or a benchmark before finishing
    the file meets the short box first (which function, what to do), no traceback."""
    assert_launched_cells_open_with_their_box(STEM, tmp_path / "student")
