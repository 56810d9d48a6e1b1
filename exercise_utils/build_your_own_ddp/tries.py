"""Notebook 06's try cells (issue 39): each part of ``work/06_myddp.py`` run as soon as it is
written, on 2 gloo ranks, printing what it did beside what one process does
(:mod:`exercise_utils.tries`). Nothing is judged here (the CHECK cells do that): a wrong part
shows as a difference, a part not written yet as the short box of
:mod:`exercise_utils.display`.

    from exercise_utils.build_your_own_ddp import tries
    tries.run("api")          # then "broadcast", "reduce", "overlap" and "buckets"

Used in 06_build_your_own_ddp.
"""
import torch
import torch.distributed as dist
import torch.nn as nn

from .. import tries as core
from ..recorder import Recorder

WORK = "work/06_myddp.py"
SAMPLES, BATCH, SEED = 12, 4, 0


def run(part, work=WORK):
    """Run the try of ``part`` (``"api"``, ``"broadcast"``, ``"reduce"``, ``"overlap"`` or
    ``"buckets"``) with the file ``work`` on 2 gloo ranks; print what each rank did."""
    core.run(TRIES, part, work)


# ----------------------------------------------------------------------------- in the ranks
def _model(seed, dtype=torch.float64):
    """Three small layers, seeded differently on each rank (as the checks start them)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(),
                         nn.Linear(4, 1)).to(dtype)


def _batch(rank, world):
    """Rank ``rank``'s 2 samples of one global batch of ``2 * world`` (the same on every
    rank, so that one process can train on all of it)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2 * world, 3, generator=g, dtype=torch.float64)
    y = torch.randn(2 * world, 1, generator=g, dtype=torch.float64)
    return x, y, slice(2 * rank, 2 * rank + 2)


def _one_process_grads(world):
    """The gradients of one process (rank 0's model) on the whole global batch."""
    model = _model(1)
    x, y, _ = _batch(0, world)
    nn.functional.mse_loss(model(x), y).backward()
    return [p.grad for p in model.parameters()]


def _worst(params, expected):
    return f"{max(float((p.grad - e).abs().max()) for p, e in zip(params, expected)):.1e}"


def _backward(model, rank, world):
    x, y, mine = _batch(rank, world)
    nn.functional.mse_loss(model(x[mine]), y[mine]).backward()


def _counted(student, work):
    """Run ``work()`` with the collectives recorded; return ``(its value, [(name, async)])``."""
    rec = Recorder()
    rec.install(student)
    try:
        value = work()
    finally:
        rec.uninstall()
    return value, [(e[1], e[3]) for e in rec.take() if e[0] == "coll"]


def try_api(mine, ctx):
    """init() and partition_dataset() on 12 samples, a global batch of 4."""
    got = mine.init(timeout_s=30)
    loader, per_rank = mine.partition_dataset(list(range(SAMPLES)), BATCH, seed=SEED)
    order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(SEED)).tolist()
    lines = [f"init() -> {tuple(map(str, got))}; partition_dataset(12 samples, batch_size=4) "
             f"-> per-rank batch {per_rank} (expected {BATCH // ctx.size})"]
    for k, batch in enumerate(loader):
        lines.append(f"step {k}: this rank {[int(i) for i in batch]} of the global batch "
                     f"{order[k * BATCH:(k + 1) * BATCH]} (one process, seed {SEED})")
    return lines + [f"{len(lines) - 1} steps (expected {SAMPLES // BATCH})"]


def try_broadcast(mine, ctx):
    """broadcast_parameters(), then one DistributedOptimizer step with a simple averaging
    strategy of this try's own (parts 3 to 5 are not needed yet)."""
    model = _model(ctx.rank + 1)
    before = float(sum(p.sum() for p in model.parameters()))
    mine.broadcast_parameters(model)
    after = float(sum(p.sum() for p in model.parameters()))

    def average(params):
        for p in params:
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= ctx.size

    opt = mine.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model,
                                    strategy=average)
    opt.zero_grad()
    _backward(model, ctx.rank, ctx.size)
    opt.step()
    reference = _model(1)
    for p, g in zip(reference.parameters(), _one_process_grads(ctx.size)):
        p.data -= 0.1 * g
    worst = max(float((p - q).abs().max()) for p, q in zip(model.parameters(),
                                                           reference.parameters()))
    return [f"sum of the parameters: {before:.6f} before broadcast_parameters, {after:.6f} "
            "after (rank 0's on every rank)",
            f"one DistributedOptimizer step (SGD, lr 0.1, gradients averaged): max difference "
            f"from one process's step on the whole batch {worst:.1e}"]


def try_reduce(mine, ctx):
    """allreduce_naive and allreduce_flat on gradients 1 (rank 0) and 2 (rank 1), a frozen
    parameter among them; the collectives each issued."""
    lines = []
    for name in ("allreduce_naive", "allreduce_flat"):
        model = _model(0)
        model[2].weight.requires_grad_(False)
        params = list(model.parameters())
        for p in params:
            if p.requires_grad:
                p.grad = torch.full_like(p, ctx.rank + 1.0)
        _, calls = _counted(mine, lambda: getattr(mine, name)(params))
        values = sorted({round(float(v), 9) for p in params if p.grad is not None
                         for v in p.grad.flatten()})
        kinds = ", ".join(f"{calls.count(c)} x {c[0]}" for c in dict.fromkeys(calls))
        lines.append(f"{name}: {kinds or 'no collective'} for 5 gradients; every gradient "
                     f"now {values} (expected [{(ctx.size + 1) / 2}]: the mean); the frozen "
                     f"weight's grad {model[2].weight.grad}")
    return lines


def _wrapped_step(mine, ctx, cls, **kwargs):
    """A backward through the student's wrapper; the collectives started during it, then
    the max difference from one process's gradients after finishing."""
    ddp = getattr(mine, cls)(_model(ctx.rank + 1), **kwargs)
    _, during = _counted(mine, lambda: _backward(ddp, ctx.rank, ctx.size))
    ddp.finish_gradient_synchronization()
    params = list(ddp.module.parameters())
    return ddp, during, _worst(params, _one_process_grads(ctx.size))


def try_overlap(mine, ctx):
    """One backward through OverlapDDP: the all-reduces it started during backward."""
    _, during, worst = _wrapped_step(mine, ctx, "OverlapDDP")
    started = sum(1 for _, is_async in during if is_async)
    return [f"during backward: {len(during)} collective(s), {started} of them asynchronous "
            "(expected 6 asynchronous all_reduce: one per parameter)",
            f"after finish_gradient_synchronization: max difference from one process's "
            f"gradients {worst}"]


def try_buckets(mine, ctx):
    """BucketDDP with a 100-byte cap: its buckets, one backward, and one inside no_sync()."""
    ddp, during, worst = _wrapped_step(mine, ctx, "BucketDDP", bucket_cap_mb=100 / 2 ** 20)
    with ddp.no_sync():
        _, quiet = _counted(mine, lambda: _backward(ddp, ctx.rank, ctx.size))
    ddp.finish_gradient_synchronization()
    return [f"buckets (cap 100 bytes, float64): {ddp.buckets}",
            f"during backward: {len(during)} collective(s) (expected one per bucket); after "
            f"finish_gradient_synchronization: max difference from one process's gradients "
            f"{worst}",
            f"a backward inside no_sync(): {len(quiet)} collective(s) (expected 0)"]


TRIES = {
    "api": core.Try(try_api, ("init", "partition_dataset"), "init and partition_dataset"),
    "broadcast": core.Try(try_broadcast, ("broadcast_parameters", "DistributedOptimizer.__init__",
                                          "DistributedOptimizer.step",
                                          "DistributedOptimizer.zero_grad"),
                          "broadcast_parameters and DistributedOptimizer"),
    "reduce": core.Try(try_reduce, ("allreduce_naive", "allreduce_flat"),
                       "allreduce_naive and allreduce_flat"),
    "overlap": core.Try(try_overlap, ("broadcast_parameters", "OverlapDDP.__init__",
                                      "OverlapDDP._on_grad_ready",
                                      "OverlapDDP.finish_gradient_synchronization"),
                        "OverlapDDP"),
    "buckets": core.Try(try_buckets, ("broadcast_parameters", "BucketDDP.__init__",
                                      "BucketDDP._on_grad_ready",
                                      "BucketDDP.finish_gradient_synchronization",
                                      "BucketDDP.no_sync"), "BucketDDP"),
}
