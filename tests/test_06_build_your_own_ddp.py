"""Notebook 06 (build your own DDP), work in progress: the five checkers against the solution,
the known-wrong files and the blank release; the solution launched by torchrun and by mpiexec.
The solution lives in tests/fixtures/06_myddp_solution.py until the notebook
(solutions/06_build_your_own_ddp.ipynb) holds it in its %%writefile work/06_myddp.py cell.

The checkers keep their launches' results per file content, so the five checks of one file
cost one launch per world size (2 and 3 ranks)."""
import re
from pathlib import Path

import pytest

from exercise_utils import checks_myddp, launch

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "tests" / "fixtures" / "06_myddp_solution.py"
WRONG = ROOT / "tests" / "wrong"
CHECKERS = {"api": checks_myddp.check_api, "naive": checks_myddp.check_naive,
            "flat": checks_myddp.check_flat, "overlap": checks_myddp.check_overlap,
            "buckets": checks_myddp.check_buckets}

# Each known-wrong file and a fragment of the message its checker must give.
EXPECTED = {
    "06_api_no_broadcast": "every rank must hold rank 1's parameters and buffers",
    "06_api_sampler_pads": "returned per_rank_batch=6 and batches of [6, 6, 6, 6, 1]",
    "06_naive_sum_not_averaged": "gradients summed, not averaged? Divide by world_size",
    "06_flat_no_copy_back": "Copy the reduced values back into each p.grad",
    "06_overlap_blocking_in_hook": "OverlapDDP's all_reduce calls are blocking",
    "06_buckets_forward_order": "expected reverse registration order",
    "06_buckets_large_param_crash": "a parameter larger than the cap must get a bucket of its own",
    "06_buckets_no_sync_ignored": "a backward inside BucketDDP.no_sync() launched",
}


def exercise_of(stem):
    return next(name for name in CHECKERS if stem[3:].startswith(name))


def blank(text):
    """The release's version of a student file: every solution region raises."""
    return re.sub(r"^( *)### BEGIN SOLUTION\n.*?^ *### END SOLUTION\n",
                  r"\1raise NotImplementedError()\n", text, flags=re.S | re.M)


def test_solution_regions_sit_inside_function_bodies():
    text = SOLUTION.read_text()
    begins = re.findall(r"^( *)### BEGIN SOLUTION$", text, flags=re.M)
    assert len(begins) == text.count("### END SOLUTION") >= 15
    assert all(len(indent) >= 4 for indent in begins)
    compile(blank(text), "blank", "exec")


@pytest.mark.parametrize("name", list(CHECKERS))
def test_solution_passes(name):
    CHECKERS[name](SOLUTION)


def test_every_wrong_file_has_an_expected_message():
    stems = {p.stem for p in WRONG.glob("06_*.py")}
    assert stems == set(EXPECTED), "tests/wrong/06_* and EXPECTED must list the same files"


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_checker_rejects_wrong_file(stem):
    with pytest.raises(AssertionError) as err:
        CHECKERS[exercise_of(stem)](WRONG / f"{stem}.py")
    assert EXPECTED[stem] in str(err.value)


def test_blank_is_reported_as_not_implemented(tmp_path):
    path = tmp_path / "06_myddp.py"
    path.write_text(blank(SOLUTION.read_text()))
    for name, check in CHECKERS.items():
        with pytest.raises(AssertionError, match="not implemented yet: ") as err:
            check(path)
        assert str(path) in str(err.value), name


def test_one_stage_crashing_costs_only_its_own_points():
    """A crash in stage 5 fails the combined launch; the other stages are run on their own."""
    for name in ("api", "naive", "flat", "overlap"):
        CHECKERS[name](WRONG / "06_buckets_large_param_crash.py")


SCRIPT = """
import sys, torch, torch.nn.functional as F
sys.path.insert(0, {folder!r})
import importlib.util
spec = importlib.util.spec_from_file_location("myddp", {path!r})
ddp = importlib.util.module_from_spec(spec); spec.loader.exec_module(ddp)
rank, size, device = ddp.init(backend="gloo", timeout_s=30)
torch.manual_seed(rank)                       # different on purpose: broadcast fixes it
model = torch.nn.Linear(4, 2)
ddp.broadcast_parameters(model)
data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
loader, per_rank = ddp.partition_dataset(data, batch_size=8)
opt = ddp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, "flat")
for x, y in loader:
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
total = model.weight.detach().sum().reshape(1)
sums = [torch.zeros(1) for _ in range(size)]
torch.distributed.all_gather(sums, total)
print(f"rank {{rank}} of {{size}} on {{device}}: {{len(loader)}} steps of {{per_rank}}, "
      f"replicas equal: {{max(s.item() for s in sums) == min(s.item() for s in sums)}}")
import gc; gc.collect()       # free what holds the group now, not at exit (gloo abort)
torch.distributed.barrier()
torch.distributed.destroy_process_group()
"""


@pytest.mark.parametrize("launcher", ["torchrun", "mpiexec"])
def test_solution_runs_under_torchrun_and_mpiexec(launcher, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(folder=str(ROOT), path=str(SOLUTION)))
    run = launch.torchrun if launcher == "torchrun" else launch.mpiexec
    out = run(script, 2, timeout=120, echo=False).output
    for rank in (0, 1):
        assert f"rank {rank} of 2 on cpu: 4 steps of 4, replicas equal: True" in out, out
