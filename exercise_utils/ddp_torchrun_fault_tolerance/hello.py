"""Hello, multi-node DDP: every worker of a torchrun job says who it is, then trains 3 steps.

Each worker initialises gloo (env://, short timeout), prints one line with RANK, LOCAL_RANK,
WORLD_SIZE, GROUP_RANK (its node's rank), LOCAL_WORLD_SIZE, the hostname and the result of
an all_reduce of (rank + 1), which must be world * (world + 1) / 2. Then it trains a tiny
DistributedDataParallel model for ``STEPS`` SGD steps on its own random batch and prints
(rank 0) a checksum of the parameters. With ``--out FILE`` rank 0 writes JSON with every
worker's record (gathered with all_gather_object). Needs only torch: copy it to a cluster.

Two "nodes" on one machine (run each line in its own terminal, or use
``exercise_utils.ddp_torchrun_fault_tolerance.multinode.two_agents``)::

    torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d \
        --rdzv-endpoint=127.0.0.1:29500 --rdzv-id=hello \
        exercise_utils/ddp_torchrun_fault_tolerance/hello.py --out work/05_hello.json

On real hosts replace 127.0.0.1 by the first host's address (``multinode.cluster_commands``).
Used in 05_ddp_torchrun_fault_tolerance.
"""
import argparse
import gc
import json
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 3          # DDP training steps
BATCH = 4          # examples per worker and step
LR = 0.1           # SGD learning rate
TIMEOUT_S = 30     # gloo timeout: a missing peer fails in seconds, not 30 minutes
IN, OUT = 6, 3     # the tiny model: Linear(IN, OUT)


def make_model(seed):
    """The tiny model, initialised from ``seed`` (workers use their rank: DDP must fix that)."""
    torch.manual_seed(seed)
    return nn.Linear(IN, OUT)


def make_batch(rank, step):
    """Worker ``rank``'s batch at ``step``: (x, y), BATCH examples, different for every rank."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)


def flat_params(model):
    """All parameters as one flat float64 list (fixed order)."""
    return torch.cat([p.detach().double().flatten() for p in model.parameters()]).tolist()


def checksum(values):
    """Position-weighted sum: replicas with the same numbers in another order differ."""
    return float(sum((i + 1) * v for i, v in enumerate(values)))


def reference_params(world_size, steps=STEPS):
    """What the DDP job must end with, computed in ONE process: rank 0's initial model,
    SGD on the union of the workers' batches (DDP averages the per-worker mean gradients,
    which equals the gradient of the mean over all examples because batches are equal).

    Returns:
        list[float]: the flat parameters (as :func:`flat_params`).
    """
    model = make_model(0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        xs, ys = zip(*(make_batch(r, step) for r in range(world_size)))
        opt.zero_grad()
        nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return flat_params(model)


def identity():
    """This worker's torchrun environment as a dict."""
    env = os.environ
    return {"rank": int(env["RANK"]), "local_rank": int(env["LOCAL_RANK"]),
            "world_size": int(env["WORLD_SIZE"]), "group_rank": int(env["GROUP_RANK"]),
            "local_world_size": int(env["LOCAL_WORLD_SIZE"]), "hostname": socket.gethostname(),
            "pid": os.getpid(), "master": f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}",
            "run_id": env.get("TORCHELASTIC_RUN_ID", "")}


def train(rank, steps):
    """``steps`` DDP steps of the tiny model; returns the flat parameters."""
    model = DDP(make_model(seed=rank))          # DDP broadcasts rank 0's parameters
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        x, y = make_batch(rank, step)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()   # gradients all-reduced (averaged)
        opt.step()
    return flat_params(model.module)


def main(argv=None):
    p = argparse.ArgumentParser(description="multi-node DDP hello (notebook 05)")
    p.add_argument("--out", default="", help="rank 0 writes every worker's record here (JSON)")
    p.add_argument("--steps", type=int, default=STEPS, help="DDP training steps")
    args = p.parse_args(argv)
    dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
    me = identity()
    total = torch.tensor([float(me["rank"] + 1)])
    dist.all_reduce(total)
    w = me["world_size"]
    me["all_reduce"] = float(total.item())
    print(f"[hello] rank {me['rank']}/{w} local_rank {me['local_rank']}/{me['local_world_size']}"
          f" node (GROUP_RANK) {me['group_rank']} host {me['hostname']} pid {me['pid']}: "
          f"all_reduce(rank+1) = {me['all_reduce']:g} (expected {w * (w + 1) // 2})", flush=True)
    me["params"] = train(me["rank"], args.steps)
    me["checksum"] = checksum(me["params"])
    records = [None] * w
    dist.all_gather_object(records, me)
    if me["rank"] == 0:
        same = len({r["checksum"] for r in records}) == 1
        print(f"[hello] after {args.steps} DDP steps: parameter checksum {me['checksum']:.6f}; "
              f"replicas identical: {same}", flush=True)
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump({"world_size": w, "steps": args.steps, "records": records}, f, indent=1)
    dist.barrier()
    # DDP models left in reference cycles still hold the group: free them now, or gloo's
    # threads may abort the process at interpreter exit (SIGABRT; see runner.main)
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave without the interpreter's teardown: even after the barrier, the collected DDP
    # model and destroy_process_group(), a worker aborted there now and then (SIGABRT,
    # "terminate called without an active exception": a C++ thread of the c10d stack still
    # joinable when static objects are destroyed; 2 of 10 two-node jobs on a loaded 2-core
    # machine). The job's work is done and its output flushed; the exit code stays 0.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
