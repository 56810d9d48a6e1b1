r"""What notebook 11's placement sweep (:mod:`.network`) runs inside its ranks: your composed step
of a GPT on a 2 x 2 x 2 mesh whose ranks sit on two hosts of four, the bytes that cross the link
between the hosts and the step time.

A torchrun script, four ranks on each of the two hosts of an
:class:`exercise_utils.cluster.Cluster` (:func:`.network.sweep` starts it on both, once per
placement and link rate)::

    python -m torch.distributed.run --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d \
        --rdzv-endpoint=h0:29400 --rdzv-id=dtfs-job --max-restarts=0 \
        -m exercise_utils.bonus_composed.network_ranks --work work/11_composed.py \
        --placement tp-inside --out results/11_composed_network.json.tp-inside.100mbit.json

The placement is the rank each worker takes in the gloo group (torchrun numbers host 0's
workers 0-3 and host 1's 4-7; ``RANK`` is rewritten before the group is made, rank 0 staying
rank 0): ``tp-inside`` keeps torchrun's numbering, so that with ``tp`` varying fastest each
host holds one data-parallel replica (both pipeline stages, both tensor-parallel ranks) and only
the data-parallel all-reduces cross the link; ``tp-across`` gives worker ``l`` of host ``h``
rank ``2 l + h``, so that every tensor-parallel pair is split between the hosts and only its
all-reduces cross (the replicas and the stages' messages stay inside a host).

The model: your ``GPT`` (seed 0, float32) of ``--vocab``, ``--width``, ``--heads``,
``--hidden``, ``--layers``, ``--seq``, cut by ``GPTStage.from_model`` on your ``Mesh(2, 2,
2)``; ``composed_step`` on a batch of ``--batch`` sequences (seed 1) every round, the gradients
set to None before it (no optimizer: the same step each round). Bytes: the first worker of
each host reads its namespace's ``/sys/class/net/<dev>/statistics/tx_bytes`` (all interfaces
but ``lo``: what the host sent onto its link) after a barrier before and after every timed
step; the two hosts' differences are summed (both directions). Time: each rank's
``perf_counter`` around the step, the slowest rank's. Rank 0 writes ``{"config", "rows"}``.
Used in 11_bonus_composed (through :mod:`.network`).
"""
import os
import statistics
import sys
import time

from ..bench import rank_rows, script_parser
from ..forking import exit_flushed
from ..links import host_tx_bytes

PER_HOST = 4
PG_TIMEOUT_S = 180          # gloo timeout: a step at 100 Mbit/s with tp across takes ~2 s
PLACEMENTS = ("tp-inside", "tp-across")


def placed_rank(placement, host, local):
    """The rank in the gloo group of worker ``local`` of ``host`` (see the module docstring)."""
    if placement == "tp-inside":
        return host * PER_HOST + local
    if placement == "tp-across":
        return 2 * local + host
    raise ValueError(f"unknown placement {placement!r}; one of {PLACEMENTS}")


def parse_args(argv=None):
    """Command-line settings (defaults: :mod:`.network`'s constants)."""
    from . import network
    p = script_parser("a composed GPT step on two hosts of four ranks", "work/11_composed.py",
                      "results/11_composed_network_ranks.json",
                      {**network.MODEL, "warmup": network.WARMUP, "steps": network.STEPS,
                       "threads": 1})
    p.add_argument("--placement", default="tp-inside", choices=PLACEMENTS)
    return p.parse_args(argv)


def benchmark(student, args, rank, world):
    """The row (the same on every rank) of this placement."""
    import torch
    import torch.distributed as dist

    from . import network
    if world != 2 * PER_HOST:
        raise ValueError(f"the sweep runs 2 hosts of {PER_HOST} ranks, not {world} ranks")
    reads = int(os.environ.get("LOCAL_RANK", rank % PER_HOST)) == 0
    mesh = student.Mesh(2, 2, 2)
    model, tokens, targets = network.model_and_batch(student, args)
    stage = student.GPTStage.from_model(model, mesh)
    del model
    seconds, sent, losses = [], 0, []
    for r in range(args.warmup + args.steps):
        for p in stage.parameters():
            p.grad = None
        dist.barrier()
        before = host_tx_bytes() if reads else 0
        start = time.perf_counter()
        losses.append(student.composed_step(stage, tokens, targets, mesh))
        took = time.perf_counter() - start
        dist.barrier()
        if r >= args.warmup:
            seconds.append(took)
            sent += (host_tx_bytes() - before) if reads else 0
    times = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)              # the slowest rank's per step
    total = torch.tensor([float(sent)], dtype=torch.float64)
    dist.all_reduce(total)                                    # both hosts: both directions
    return [{"placement": args.placement, "world_size": world, "steps": args.steps,
             **{k: getattr(args, k) for k in ("vocab", "width", "heads", "hidden", "layers",
                                               "seq", "batch")},
             "bytes_per_step": float(total) / args.steps,
             "step_ms": 1e3 * statistics.median(times.tolist()),
             "step_ms_all": [1e3 * t for t in times.tolist()], "loss": losses[0],
             "threads": torch.get_num_threads()}]


def main(argv=None):
    """Entry point of every rank started by torchrun (see the module docstring): the worker
    takes its placed rank, then rank 0 writes the rows (:func:`exercise_utils.bench.rank_rows`)."""
    args = parse_args(argv)
    host = int(os.environ["GROUP_RANK"])
    os.environ["RANK"] = str(placed_rank(args.placement, host, int(os.environ["LOCAL_RANK"])))
    rank_rows(benchmark, args, PG_TIMEOUT_S)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_flushed()    # the group is destroyed, the rows written
