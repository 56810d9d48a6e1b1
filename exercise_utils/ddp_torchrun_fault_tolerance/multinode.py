"""Multi-node training without a cluster: two torchrun agents on one machine form ONE job.

A multi-node torchrun job is one *agent* (``torchrun``) per node. The agents meet at a
rendezvous (``--rdzv-backend=c10d --rdzv-endpoint=HOST:PORT --rdzv-id=JOB``): a TCP store
hosted by the agent that runs on HOST (it binds PORT first; the others connect to it). Once
``--nnodes`` agents have joined, each node gets a GROUP_RANK and every worker a global RANK
out of WORLD_SIZE = nnodes * nproc_per_node; then every agent starts its workers. Nothing
in that protocol needs the nodes to be different machines, so two agents started at the
same time on 127.0.0.1 are exactly a two-node job, and the same command with a real host
name runs on a cluster. Flags as documented in "torchrun (Elastic Launch)" and the elastic
Quickstart (https://docs.pytorch.org/docs/stable/elastic/run.html,
https://pytorch.org/docs/stable/elastic/quickstart.html); the SLURM script follows
pytorch/examples distributed/ddp-tutorial-series/slurm/sbatch_run.sh.

Used in 05_ddp_torchrun_fault_tolerance.
"""
import json
import shlex
import sys
import uuid

from .. import launch, launch_many
from ..commands import agent_command   # one torchrun agent's command (in the core: the cluster uses it too)
from ..config import quick

TIMEOUT = quick(120, 60)   # seconds for a whole two-agent job (both agents together)
LABELS = ("node a", "node b")


def two_agents(script, nproc_per_node=1, args=(), module=False, timeout=TIMEOUT, echo=True,
               node_args=((), ()), max_restarts=0, port=None):
    """Run a two-node torchrun job on this machine: two agents, one c10d rendezvous.

    Both agents start at the same time with ``--nnodes=2`` and the same
    ``--rdzv-endpoint=127.0.0.1:<free port>`` and ``--rdzv-id``; output lines are printed
    live as ``[node a] ...`` / ``[node b] ...``. If either agent fails, or ``timeout``
    passes, both are stopped with all their workers.

    Args:
        script: the training script (or module with ``module=True``).
        nproc_per_node: workers per agent (world size = 2 * nproc_per_node).
        args: script arguments for both nodes.
        module: run the script as a module (``-m``).
        timeout: seconds for the whole job.
        echo: print the output as it arrives.
        node_args: extra script arguments for node a and node b (to make one side differ).
        max_restarts: torchrun ``--max-restarts`` of each agent.
        port: rendezvous port (default: a free one).
    Returns:
        list[launch.RunResult]: node a's and node b's (``.output`` unlabelled).
    Raises:
        launch.LaunchError: an agent failed ("node b (`...`) failed with exit code 1 ...").
        launch.LaunchTimeout: the job did not finish in time (e.g. an agent never joined).
    """
    endpoint = f"127.0.0.1:{port or launch.free_port()}"
    rdzv_id = f"dtfs-{uuid.uuid4().hex[:8]}"
    cmds = [agent_command(script, 2, nproc_per_node, endpoint, rdzv_id, [*args, *extra],
                          module, max_restarts) for extra in node_args]
    if echo:
        for label, cmd in zip(LABELS, cmds):
            print(f"[{label}] $ {display(cmd)}", flush=True)
    return launch_many.run_many(cmds, timeout=timeout, labels=LABELS, echo=echo,
                           nprocs=nproc_per_node,
                           what=f"the two-agent job ({rdzv_id}, rendezvous {endpoint})")


def two_hosts(cluster, script, nproc_per_node=1, args=(), timeout=TIMEOUT, echo=True):
    """Run a torchrun job on the two hosts of an :class:`exercise_utils.cluster.Cluster`.

    One agent per host (``h0`` and ``h1``, each with its own address and network stack), the
    c10d rendezvous on ``h0``, gloo over the (shaped) link: exactly the commands of a real
    two-machine job. Output lines are labelled ``[h0]`` / ``[h1]``.

    Returns:
        list[launch.RunResult]: h0's and h1's.
    Raises:
        launch.LaunchError / launch.LaunchTimeout: as :func:`two_agents`.
    """
    if len(cluster.hosts) != 2:
        raise ValueError(f"two_hosts needs a cluster of 2 hosts, not {len(cluster.hosts)}")
    if echo:
        print(f"[h0, h1] $ {display(cluster.torchrun_command(script, nproc_per_node, args))}",
              flush=True)
    return cluster.torchrun(script, nproc_per_node, args, timeout=timeout, echo=echo,
                            what="the two-host job")


def display(cmd):
    """A command list as a shell line, with ``python -m torch.distributed.run`` shown as
    ``torchrun`` (the same program)."""
    cmd = list(cmd)
    if cmd[1:3] == ["-m", "torch.distributed.run"]:
        cmd = ["torchrun", *cmd[3:]]
    return " ".join(shlex.quote(str(c)) for c in cmd)


def cluster_commands(nnodes, nproc_per_node, script, host="node0.example.org", port=29500,
                     args=(), rdzv_id="job42"):
    """The torchrun line to type on EVERY host of a cluster job (the same line everywhere).

    ``host`` is one of the nodes (any; it hosts the rendezvous store on ``port``, which the
    others must be able to reach). Start it on all ``nnodes`` hosts within the rendezvous
    join timeout (600 s by default); the ranks are assigned when all have joined.

    Returns:
        str: one shell line.
    """
    return display(agent_command(script, nnodes, nproc_per_node, f"{host}:{port}", rdzv_id,
                                 args, python="torchrun"))


def slurm_script(nodes, gpus_per_node, script, args=(), nproc_per_node=None, job_name="ddp",
                 time="00:30:00", port=29500, cpus_per_task=None, setup="# source .venv/bin/activate"):
    """A complete sbatch script running ``script`` on ``nodes`` nodes with torchrun.

    One SLURM task per node (``--ntasks-per-node=1``): that task is the torchrun agent,
    which starts ``nproc_per_node`` workers (default: one per GPU). The first node of the
    allocation hosts the rendezvous; the SLURM job id is the rendezvous id.

    Args:
        nodes: number of nodes.
        gpus_per_node: GPUs per node (0: a CPU cluster, no ``--gpus-per-node`` line).
        script: training script path; args: its arguments.
        nproc_per_node: workers per node (default ``gpus_per_node`` or 1).
        job_name, time, cpus_per_task: the usual #SBATCH settings.
        port: rendezvous port on the first node.
        setup: shell lines that activate the environment (module load, venv, ...).
    Returns:
        str: the script (submit with ``sbatch job.sh``).
    """
    nproc = nproc_per_node or gpus_per_node or 1
    lines = ["#!/bin/bash", "# one SLURM task per node: the torchrun agent, which starts the workers",
             f"#SBATCH --job-name={job_name}", f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1"]
    if gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_node}")
    if cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={cpus_per_task}")
    lines += [f"#SBATCH --time={time}", "#SBATCH --output=%x-%j.out", "", setup,
              "# the first node of the allocation hosts the rendezvous",
              'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              "", "srun torchrun \\", f"    --nnodes={nodes} \\",
              f"    --nproc-per-node={nproc} \\", "    --rdzv-backend=c10d \\",
              f'    --rdzv-endpoint="$head_node:{port}" \\', '    --rdzv-id="$SLURM_JOB_ID" \\',
              "    " + " ".join(shlex.quote(str(a)) for a in (script, *args)), ""]
    return "\n".join(lines)


def load_report(path):
    """Read the JSON written by ``hello.py --out`` (:mod:`.hello`)."""
    with open(path) as f:
        return json.load(f)


def verify_job(report, nnodes, nproc_per_node, expected_params=None, atol=1e-6):
    """Check that a :mod:`.hello` report comes from ONE correct multi-node job.

    Checks: every worker saw WORLD_SIZE = nnodes * nproc_per_node; the ranks are 0..W-1,
    each once; there are ``nnodes`` distinct GROUP_RANKs with ``nproc_per_node`` workers
    each and local ranks 0..nproc-1 on each; every all_reduce gave W(W+1)/2; all replicas
    have identical parameters after the DDP steps (and, if given, equal to
    ``expected_params``, e.g. ``hello.reference_params(W)``).

    Raises:
        AssertionError: naming what is wrong.
    Returns:
        str: a one-line summary.
    """
    world = nnodes * nproc_per_node
    recs = report["records"]
    sizes = sorted({r["world_size"] for r in recs})
    assert sizes == [world], f"workers saw WORLD_SIZE {sizes}, expected one job of {world}"
    ranks = sorted(r["rank"] for r in recs)
    assert ranks == list(range(world)), f"ranks {ranks}: expected 0..{world - 1}, each once"
    nodes = {}
    for r in recs:
        nodes.setdefault(r["group_rank"], []).append(r["local_rank"])
    assert sorted(nodes) == list(range(nnodes)), (
        f"GROUP_RANKs {sorted(nodes)}: expected {nnodes} nodes 0..{nnodes - 1}")
    for g, local in nodes.items():
        assert sorted(local) == list(range(nproc_per_node)), (
            f"node {g} has local ranks {sorted(local)}, expected 0..{nproc_per_node - 1}")
    want = world * (world + 1) / 2
    for r in recs:
        assert r["all_reduce"] == want, (
            f"rank {r['rank']}: all_reduce(rank+1) = {r['all_reduce']}, expected {want}")
    first = recs[0]["params"]
    for r in recs:
        diff = max(abs(a - b) for a, b in zip(r["params"], first))
        assert diff == 0, f"rank {r['rank']}'s replica differs from rank {recs[0]['rank']}'s by {diff:.1e}"
    if expected_params is not None:
        diff = max(abs(a - b) for a, b in zip(first, expected_params))
        assert diff <= atol, (f"the replicas differ by {diff:.1e} from the single-process "
                              "reference: gradients were not averaged over all the workers?")
    return (f"one job: {world} workers on {nnodes} nodes, ranks 0..{world - 1}, "
            f"all_reduce = {want:g} everywhere, replicas identical")
