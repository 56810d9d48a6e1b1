"""Multi-node without a cluster (notebook 05): two torchrun agents on one machine form ONE
job; a failing agent stops the whole job; the cluster / SLURM command text is valid torchrun."""
import copy
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exercise_utils import launch, launch_many
from exercise_utils.ddp_torchrun_fault_tolerance import hello, multinode
from exercise_utils.config import quick

pytestmark = pytest.mark.serial   # short launch limits: run alone, not beside other tests

ROOT = Path(__file__).resolve().parents[1]
HELLO = Path(hello.__file__)
NPROC = quick(2, 1)          # workers per agent: world size 4 (full) or 2 (quick)


def test_two_agents_form_one_job(tmp_path):
    out = tmp_path / "hello.json"
    a, b = multinode.two_agents(HELLO, NPROC, ["--out", out], timeout=multinode.TIMEOUT)
    report = multinode.load_report(out)
    world = 2 * NPROC
    print(multinode.verify_job(report, 2, NPROC, hello.reference_params(world)))
    recs = report["records"]
    assert report["world_size"] == world and len(recs) == world
    assert len({r["group_rank"] for r in recs}) == 2
    assert len({r["pid"] for r in recs}) == world
    assert len({r["run_id"] for r in recs}) == 1          # one rendezvous id for both agents
    # each agent started its own workers: its output holds exactly its node's hello lines
    for result in (a, b):
        nodes = set(re.findall(r"\[hello\] rank \d+/\d+ .*?GROUP_RANK\) (\d+)", result.output))
        assert len(nodes) == 1, result.output
    assert "replicas identical: True" in a.output + b.output


def _report(world=2, nproc=1):
    params = hello.reference_params(world)
    recs = [{"rank": r, "local_rank": r % nproc, "world_size": world, "group_rank": r // nproc,
             "all_reduce": world * (world + 1) / 2, "params": list(params)} for r in range(world)]
    return {"world_size": world, "records": recs}, params


def test_verify_job_rejects_what_a_broken_job_looks_like():
    good, params = _report(4, 2)
    assert "4 workers on 2 nodes" in multinode.verify_job(good, 2, 2, params)
    flaws = {
        "WORLD_SIZE": lambda r: r["records"][1].update(world_size=2),      # two separate jobs
        "each once": lambda r: r["records"][3].update(rank=0),
        "GROUP_RANKs": lambda r: [x.update(group_rank=0) for x in r["records"]],
        "all_reduce": lambda r: r["records"][2].update(all_reduce=3.0),
        "replica differs": lambda r: r["records"][2]["params"].__setitem__(0, 9.0),
    }
    for fragment, spoil in flaws.items():
        bad = copy.deepcopy(good)
        spoil(bad)
        with pytest.raises(AssertionError, match=fragment):
            multinode.verify_job(bad, 2, 2)
    with pytest.raises(AssertionError, match="not averaged"):
        multinode.verify_job(good, 2, 2, hello.reference_params(1))


def test_failing_agent_stops_the_whole_job_quickly():
    start = time.monotonic()
    with pytest.raises(launch.LaunchError) as err:
        multinode.two_agents(HELLO, 1, node_args=((), ("--no-such-flag",)), echo=False,
                             timeout=multinode.TIMEOUT)
    assert not isinstance(err.value, launch.LaunchTimeout)
    msg = str(err.value)
    assert "node b" in msg and "exit code" in msg and "--no-such-flag" in msg, msg
    assert time.monotonic() - start < multinode.TIMEOUT / 2
    # node a's agent and worker are gone too: tests/conftest.py fails the test otherwise


def test_run_many_labels_output_and_kills_the_others_on_failure():
    ok = [sys.executable, "-c", "print('one'); print('two', end='')"]
    results = launch_many.run_many([ok, ok], labels=["x", "y"], timeout=30, echo=False)
    assert [r.output for r in results] == ["one\ntwo", "one\ntwo"]
    sleeper = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"]
    failer = [sys.executable, "-c", "import time; time.sleep(1); raise SystemExit(5)"]
    start = time.monotonic()
    with pytest.raises(launch.LaunchError) as err:
        launch_many.run_many([sleeper, failer], labels=["sleepy", "broken"], timeout=60, echo=False)
    assert time.monotonic() - start < 20
    assert "broken" in str(err.value) and "exit code 5" in str(err.value)
    assert err.value.returncode == 5 and "[sleepy] up" in err.value.output
    with pytest.raises(launch.LaunchTimeout, match="sleepy, broken still running"):
        launch_many.run_many([sleeper, sleeper], labels=["sleepy", "broken"], timeout=1.5, echo=False)


def _torchrun_args(line):
    """Parse a torchrun command line with torchrun's own argument parser."""
    from torch.distributed.run import get_args_parser
    words = shlex.split(line)
    assert words[0] == "torchrun", line
    return get_args_parser().parse_args(words[1:])


def test_cluster_command_is_a_valid_torchrun_line():
    line = multinode.cluster_commands(3, 4, "train.py", host="n0.example.org", port=29400,
                                      args=["--epochs", "2"])
    a = _torchrun_args(line)
    assert (a.nnodes, a.nproc_per_node, a.rdzv_backend) == ("3", "4", "c10d")
    assert a.rdzv_endpoint == "n0.example.org:29400" and a.rdzv_id
    assert (a.training_script, a.training_script_args) == ("train.py", ["--epochs", "2"])


def test_slurm_script_is_valid_bash_with_one_agent_per_node():
    text = multinode.slurm_script(4, 8, "train.py", args=["--epochs", "2"])
    for flag in ("--nodes=4", "--ntasks-per-node=1", "--gpus-per-node=8"):
        assert re.search(rf"^#SBATCH {flag}\b", text, re.M), flag
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    srun = text[text.index("srun torchrun"):].replace("\\\n", " ")
    a = _torchrun_args(srun.split("\n")[0][len("srun "):])
    assert (a.nnodes, a.nproc_per_node, a.rdzv_backend) == ("4", "8", "c10d")
    assert a.rdzv_endpoint == "$head_node:29500" and a.rdzv_id == "$SLURM_JOB_ID"
    assert "scontrol show hostnames" in text
    cpu = multinode.slurm_script(2, 0, "train.py", nproc_per_node=2)
    assert "--gpus-per-node" not in cpu and "--nproc-per-node=2" in cpu
