"""Notebook 05 (DDP under torchrun, snapshots, restarts), work in progress: the checker of the
torchrun Trainer against the solution and the known-wrong files; the fault injection of
ddp_run. The solution lives in tests/fixtures/05_trainer_solution.py until the notebook
(solutions/05_ddp_torchrun_fault_tolerance.ipynb) holds it in its %%writefile cell."""
from pathlib import Path

import pytest

from exercise_utils import checks_ddp, ddp_run

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "tests" / "fixtures" / "05_trainer_solution.py"
WRONG = ROOT / "tests" / "wrong"

CHECKERS = {"trainer": checks_ddp.check_trainer, "snapshots": checks_ddp.check_snapshots}

# Each known-wrong file and a fragment of the message its checker must give.
EXPECTED = {
    "05_trainer_no_set_epoch": "was [0, 0, 0]; expected [0, 1, 2]. Call self.sampler.set_epoch",
    "05_trainer_no_ddp": "the replicas differ at the end",
    "05_snapshots_no_optimizer_state": "the snapshot lacks ['optimizer']",
    "05_snapshots_in_place": "PytorchStreamReader failed reading zip archive",
    "05_snapshots_every_rank_saves": "wrote the snapshot",
}


def exercise_of(stem):
    return next(name for name in CHECKERS if stem[3:].startswith(name))


def test_solution_trains_without_snapshots():
    checks_ddp.check_trainer(SOLUTION)


def test_solution_snapshots_survive_a_torn_save_and_a_mid_epoch_crash():
    checks_ddp.check_snapshots(SOLUTION)


def test_every_wrong_file_has_an_expected_message():
    assert {p.stem for p in WRONG.glob("05_*.py")} == set(EXPECTED)


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_checker_rejects_wrong_file(stem):
    with pytest.raises(AssertionError) as err:
        CHECKERS[exercise_of(stem)](WRONG / f"{stem}.py")
    assert EXPECTED[stem] in str(err.value)


def test_blank_trainer_is_reported_as_not_implemented(tmp_path):
    text = SOLUTION.read_text()
    start, end = text.index("    ### BEGIN SOLUTION\n    rank,"), text.index("    ### END SOLUTION\n")
    blank = tmp_path / "05_trainer.py"
    blank.write_text(text[:start] + "    raise NotImplementedError()\n" + text[end:])
    for check in CHECKERS.values():
        with pytest.raises(AssertionError, match="not implemented yet"):
            check(blank)


def test_settings_and_attempt_counter(monkeypatch):
    config = ddp_run.parse_args(["--epochs", "2", "--crash-at-step", "5", "--lr", "0.1"])
    assert (config.epochs, config.crash_at_step, config.lr, config.crash_rank) == (2, 5, 0.1, 1)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert ddp_run.attempt() == 1
    model = ddp_run.make_model("mlp")
    opt, sched = ddp_run.make_optimizer(model, ddp_run.RunConfig(lr=1.0, warmup_steps=10))
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
    state = ddp_run.rng_state()
    first = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    ddp_run.set_rng_state(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == first
