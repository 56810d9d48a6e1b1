r"""What notebook 10's network sweep (:mod:`.network`) runs inside its ranks: one model trained
data-, tensor- and pipeline-parallel, the bytes each puts on the links and its step time.

A torchrun script, one rank on each of the two hosts of an :class:`exercise_utils.cluster.Cluster`
(:func:`exercise_utils.cluster.each_rate` starts it on every host, with ``--out`` per rate)::

    python -m torch.distributed.run --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d \
        --rdzv-endpoint=h0:29400 --rdzv-id=dtfs-job --max-restarts=0 \
        -m exercise_utils.bonus_model_parallel.network_ranks \
        --work work/10_model_parallel.py --out results/10_model_parallel_network.json.100mbit.json

The model: ``depth`` residual blocks ``x + MLP(width, 4 width)(x)`` (your ``MLP``, seed 0, the
same weights in every mode), a batch of ``tokens`` rows, the mse loss against a fixed target,
plain SGD after every step. Modes (one launch runs them all, interleaved: one step of each per
round, so that a change of load falls on all alike):

* ``data``: the whole model on each rank, half the batch; the gradients averaged with one
  ``dist.all_reduce`` of one flat buffer per step;
* ``tensor``: every block's MLP your ``ParallelMLP.from_mlp``, the whole batch on both ranks;
* ``pipeline``: blocks ``[0, depth/2)`` on rank 0, the rest on rank 1, your ``pipeline_step``
  with ``one_f_one_b_order(2, m, rank)``;
* ``<mode> compute``: the same arithmetic on each rank with no communication (``data``: the
  model on half the batch; ``tensor``: blocks ``MLP(width, 2 width)``, a rank's shard, on the
  whole batch; ``pipeline``: the rank's half of the blocks on the m micro-batches one after
  the other, no bubble).

Bytes: every rank reads its own namespace's ``/sys/class/net/<dev>/statistics/tx_bytes``
(all interfaces but ``lo``: what the host sent onto its link, every byte on the wire), after a
barrier before the step and after a barrier after it (so the step's data has left the queues);
the two ranks' differences are summed: both directions of the link (the barriers' few hundred
bytes included). Time: each rank's ``perf_counter`` around the step alone, the slowest rank's.
Rank 0 writes ``{"config", "rows"}``. Used in 10_bonus_model_parallel (through :mod:`.network`).
"""
import statistics
import sys
import time

from ..bench import rank_rows, script_parser
from ..forking import exit_flushed
from ..links import host_tx_bytes

MODES = ("data", "tensor", "pipeline")
LR = 0.01                   # plain SGD
PG_TIMEOUT_S = 120          # gloo timeout: a data step at 100 Mbit/s takes ~0.7 s


def parse_args(argv=None):
    """Command-line settings (defaults: :mod:`.network`'s constants)."""
    from . import network
    return script_parser("data / tensor / pipeline parallel on two hosts",
                         "work/10_model_parallel.py",
                         "results/10_model_parallel_network_ranks.json",
                         {"width": network.WIDTH, "depth": network.DEPTH,
                          "tokens": network.TOKENS, "microbatches": network.MICROBATCHES,
                          "warmup": network.WARMUP, "steps": network.STEPS,
                          "threads": 1}).parse_args(argv)


def make_steps(student, args, rank, world):
    """``{name: step}``: one training step of every mode and of its compute-only twin; each
    step returns this rank's loss (None where the rank has none)."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    class Residual(nn.Module):
        def __init__(self, mlp):
            super().__init__()
            self.mlp = mlp

        def forward(self, x):
            return x + self.mlp(x)

    def blocks(hidden=4):
        torch.manual_seed(0)
        return nn.Sequential(*[Residual(student.MLP(args.width, hidden * args.width))
                               for _ in range(args.depth)])

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.tokens, args.width, generator=gen)
    y = torch.randn(args.tokens, args.width, generator=gen)
    half = slice(rank * args.tokens // world, (rank + 1) * args.tokens // world)
    m, k = args.microbatches, args.depth // world

    def trained(model, step):
        opt = torch.optim.SGD(model.parameters(), lr=LR)

        def one():
            opt.zero_grad(set_to_none=True)
            loss = step(model)
            opt.step()
            return loss
        return one

    def plain(rows):
        def step(model):
            loss = F.mse_loss(model(x[rows]), y[rows])
            loss.backward()
            return float(loss.detach())
        return step

    def data(model):
        loss = plain(half)(model)
        params = [q for q in model.parameters()]
        flat = torch.cat([q.grad.reshape(-1) for q in params])
        dist.all_reduce(flat)
        flat /= world
        offset = 0
        for q in params:
            q.grad.copy_(flat[offset:offset + q.numel()].view_as(q))
            offset += q.numel()
        return loss                 # this rank's half: the batch's loss is the ranks' mean

    def pipeline(model):
        last = rank == world - 1
        loss = student.pipeline_step(model, student.one_f_one_b_order(world, m, rank),
                                     inputs=x if rank == 0 else None,
                                     targets=y if last else None,
                                     loss_fn=F.mse_loss if last else None)
        return loss if last else None

    def stage_compute(model):
        for xj, yj in zip(x.tensor_split(m), y.tensor_split(m)):
            (F.mse_loss(model(xj), yj) * (xj.shape[0] / args.tokens)).backward()

    tensor = blocks()
    for block in tensor:
        block.mlp = student.ParallelMLP.from_mlp(block.mlp)
    stage = nn.Sequential(*list(blocks())[rank * k:(rank + 1) * k])
    own = nn.Sequential(*list(blocks())[rank * k:(rank + 1) * k])
    return {"data": trained(blocks(), data), "tensor": trained(tensor, plain(slice(None))),
            "pipeline": trained(stage, pipeline),
            "data compute": trained(blocks(), plain(half)),
            "tensor compute": trained(blocks(hidden=4 // world), plain(slice(None))),
            "pipeline compute": trained(own, stage_compute)}, blocks()


def measure(steps, args):
    """Rounds of one step of every variant (the first ``warmup`` rounds untimed): per variant
    this rank's seconds and tx bytes per timed step, and its losses (all rounds)."""
    import torch.distributed as dist
    names = list(steps)
    seconds = {n: [] for n in names}
    sent = {n: 0 for n in names}
    losses = {n: [] for n in names}
    for r in range(args.warmup + args.steps):
        for name in names[r % len(names):] + names[:r % len(names)]:   # order rotated
            dist.barrier()
            before = host_tx_bytes()
            start = time.perf_counter()
            losses[name].append(steps[name]())
            took = time.perf_counter() - start
            dist.barrier()
            if r >= args.warmup:
                seconds[name].append(took)
                sent[name] += host_tx_bytes() - before
    return seconds, sent, losses


def benchmark(student, args, rank, world):
    """The rows (the same on every rank): one per mode."""
    import torch
    import torch.distributed as dist
    if args.depth % world or (4 * args.width) % world or args.tokens % (world * args.microbatches):
        raise ValueError(f"depth, 4 x width and tokens / m must divide by {world} ranks")
    steps, full = make_steps(student, args, rank, world)
    seconds, sent, losses = measure(steps, args)
    names = list(steps)
    times = torch.tensor([seconds[n] for n in names], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)             # the slowest rank's per step
    total = torch.tensor([float(sent[n]) for n in names], dtype=torch.float64)
    dist.all_reduce(total)                                   # both hosts: both directions
    rounds = args.warmup + args.steps
    per_rank = torch.tensor([[v if v is not None else 0.0 for v in losses[n]] for n in MODES],
                            dtype=torch.float64)
    dist.all_reduce(per_rank)
    loss = {"data": per_rank[0] / world, "tensor": per_rank[1] / world, "pipeline": per_rank[2]}
    param_bytes = sum(q.numel() * q.element_size() for q in full.parameters())
    rows = []
    for mode in MODES:
        i, c = names.index(mode), names.index(f"{mode} compute")
        rows.append({
            "mode": mode, "world_size": world, "width": args.width, "depth": args.depth,
            "tokens": args.tokens, "microbatches": args.microbatches, "steps": args.steps,
            "param_bytes": param_bytes, "activation_bytes": args.tokens * args.width * 4,
            "bytes_per_step": float(total[i]) / args.steps,
            "compute_bytes_per_step": float(total[c]) / args.steps,
            "step_ms": 1e3 * statistics.median(times[i].tolist()),
            "step_ms_all": [1e3 * t for t in times[i].tolist()],
            "compute_ms": 1e3 * statistics.median(times[c].tolist()),
            "loss": float(loss[mode][0]), "loss_last": float(loss[mode][rounds - 1]),
            "losses": loss[mode].tolist(), "threads": torch.get_num_threads()})
    return rows


def main(argv=None):
    """Entry point of every rank started by torchrun (see the module docstring): rank 0
    writes the rows (:func:`exercise_utils.bench.rank_rows`)."""
    rank_rows(benchmark, parse_args(argv), PG_TIMEOUT_S)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_flushed()    # the group is destroyed, the rows written
