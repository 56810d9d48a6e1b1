"""What notebook 10's benchmark (:mod:`.bench`) runs inside its ranks around the student's code.

* :func:`stack`, :func:`stage_of`: the stack of Linear + Tanh layers and the layers of stage s;
* :class:`TimedStage` (with :class:`Clock`): a stage module whose forward lasts exactly
  ``t_f`` and whose backward ``2 t_f`` (the real compute, then a sleep), timed in the
  "latency hidden" model: an op starts when both its own previous op and the op of the
  neighbour that produced its input have ended, so a message's latency is absorbed inside the
  op (it still shows when data arrives after the op should have ended). Each activation carries
  one extra feature column, the sender's end stamp (seconds since a base the ranks agree on);
  its gradient carries the backward's end stamp back. ``pipeline_step`` itself runs unchanged;
* :class:`SavedTracker` (with :class:`Tracked`): the bytes of the tensors autograd saved for
  the backward that are alive, and their peak (``saved_tensors_hooks``; parameters excluded, a
  tensor saved twice counted once);
* :func:`time_interleaved`: variants timed A B A B ..., a barrier before each step, the slowest
  rank's time per step;
* :func:`library_rows` (:func:`tensor_row`, :func:`pipeline_row`): your ``ParallelMLP`` against
  ``ColwiseParallel`` / ``RowwiseParallel``, your ``pipeline_step`` against ``PipelineStage`` +
  ``Schedule1F1B``: step times, losses and the largest gradient difference.

Used in 10_bonus_model_parallel (through :mod:`.bench`).
"""
import copy
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def stack(width, depth, seed=0):
    """``depth`` blocks ``Linear(width, width) + Tanh`` (seed ``seed``)."""
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh())
                           for _ in range(depth)])


def stage_of(full, p, s):
    """Stage ``s`` of ``p``: its ``len(full) // p`` consecutive blocks (shared, not copied)."""
    k = len(full) // p
    return nn.Sequential(*[full[i] for i in range(s * k, (s + 1) * k)])


def sleep_until(deadline):
    """Sleep, then yield the core, until ``time.perf_counter()`` reaches ``deadline``."""
    rest = deadline - time.perf_counter()
    if rest > 0:
        time.sleep(rest)
    while time.perf_counter() < deadline:
        os.sched_yield()


class Clock:
    """One rank's time model: op stamps ``(kind, start, end)`` in seconds since ``base``."""

    def __init__(self, t_f, first, last):
        self.t_f, self.first, self.last = t_f, first, last
        self.ops, self.base, self.prev_end, self.b_start = [], 0.0, 0.0, 0.0

    def now(self):
        return time.perf_counter() - self.base

    def sleep_until(self, t):
        sleep_until(t + self.base)


class _BwdStart(torch.autograd.Function):
    """At the stage's output: its backward is the first of the stage's backward pass."""

    @staticmethod
    def forward(ctx, y, clock):
        ctx.clock = clock
        return y.view_as(y)

    @staticmethod
    def backward(ctx, g):
        c = ctx.clock
        ready = c.prev_end if c.last else float(g[..., -1].reshape(-1)[0])
        c.b_start = max(c.prev_end, ready)
        if not c.last:
            g = g.clone()
            g[..., -1] = 0.0                   # the stamp column is no data
        return g, None


class _BwdEnd(torch.autograd.Function):
    """At the stage's input: its backward is the last; pads the backward to ``2 t_f`` and
    stamps the gradient sent back."""

    @staticmethod
    def forward(ctx, x, clock):
        ctx.clock = clock
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        c = ctx.clock
        c.sleep_until(c.b_start + 2 * c.t_f)
        end = c.now()
        c.ops.append(("B", c.b_start, end))
        c.prev_end = end
        if not c.first:
            g = g.clone()
            g[..., -1] = end
        return g, None


class TimedStage(nn.Module):
    """``inner`` with its forward padded to ``t_f`` and its backward to ``2 t_f`` (the stage
    input must require grad, on stage 0 too, so that the backward reaches :class:`_BwdEnd`)."""

    def __init__(self, inner, clock):
        super().__init__()
        self.inner, self.clock = inner, clock

    def forward(self, x):
        c = self.clock
        x = _BwdEnd.apply(x, c)
        ready = c.prev_end
        if not c.first:
            ready = float(x.detach()[..., -1].reshape(-1)[0])
            x = x[..., :-1]
        start = max(c.prev_end, ready)
        y = self.inner(x)
        c.sleep_until(start + c.t_f)
        end = c.now()
        c.ops.append(("F", start, end))
        c.prev_end = end
        if not c.last:
            y = torch.cat([y, torch.full_like(y[..., :1], end)], dim=-1)
        return _BwdStart.apply(y, c)


def timed_step(clock, step):
    """Run ``step()`` on every rank from a common base; return ``(bubble, makespan s, busy s)``
    over all ranks: ``bubble = 1 - sum of busy times / (p * makespan)``."""
    clock.ops, clock.prev_end = [], 0.0
    dist.barrier()
    base = torch.tensor([time.perf_counter() + 0.002], dtype=torch.float64)
    dist.all_reduce(base, op=dist.ReduceOp.MAX)
    clock.base = float(base)
    sleep_until(clock.base)
    step()
    mine = torch.tensor([min(s for _, s, _ in clock.ops), max(e for _, _, e in clock.ops),
                         sum(e - s for _, s, e in clock.ops)], dtype=torch.float64)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    makespan = max(float(v[1]) for v in every) - min(float(v[0]) for v in every)
    busy = sum(float(v[2]) for v in every)
    return 1 - busy / (len(every) * makespan), makespan, busy


class SavedTracker:
    """Bytes of the tensors saved by autograd (inside :meth:`hooks`) that are alive now
    (``live``) and at most since :meth:`reset_peak` (``peak``). Parameters and views of them
    are not counted; a tensor saved by several nodes is counted once (key: data pointer and
    size). An entry dies when autograd drops it (the graph freed by its backward)."""

    def __init__(self, params):
        self.param_ptrs = {q.untyped_storage().data_ptr() for q in params}
        self.refs, self.live, self.peak = {}, 0, 0

    def reset_peak(self):
        self.peak = self.live

    def hooks(self):
        tracker = self

        class Packed:
            __slots__ = ("t", "key")

            def __init__(self, t, key):
                self.t, self.key = t, key

            def __del__(self):
                if self.key is not None:
                    tracker._release(self.key)

        def pack(t):
            if t.untyped_storage().data_ptr() in tracker.param_ptrs:
                return Packed(t, None)
            key = (t.data_ptr(), t.numel() * t.element_size())
            if not tracker.refs.get(key):
                tracker.live += key[1]
                tracker.peak = max(tracker.peak, tracker.live)
            tracker.refs[key] = tracker.refs.get(key, 0) + 1
            return Packed(t, key)

        return torch.autograd.graph.saved_tensors_hooks(pack, lambda packed: packed.t)

    def _release(self, key):
        self.refs[key] -= 1
        if not self.refs[key]:
            del self.refs[key]
            self.live -= key[1]


class Tracked(nn.Module):
    """``inner`` with its forward run under ``tracker``'s hooks."""

    def __init__(self, inner, tracker):
        super().__init__()
        self.inner, self.tracker = inner, tracker

    def forward(self, x):
        with self.tracker.hooks():
            return self.inner(x)


def time_interleaved(steps, warmup, iters):
    """Time the callables of ``steps`` interleaved (A B A B ...) after ``warmup`` untimed calls
    each, a barrier before each call; per call the slowest rank's seconds. Returns the list of
    each variant's times (seconds), the same on every rank."""
    for step in steps:
        for _ in range(warmup):
            step()
    times = [[] for _ in steps]
    for _ in range(iters):
        for i, step in enumerate(steps):
            dist.barrier()
            start = time.perf_counter()
            step()
            times[i].append(time.perf_counter() - start)
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def medians(times):
    """``(median of A, median of B, median of the per-step ratios A/B)`` in ms, ms, 1."""
    a, b = times
    return (1e3 * statistics.median(a), 1e3 * statistics.median(b),
            statistics.median(x / y for x, y in zip(a, b)))


def _library_row(what, world, times, losses, grad_diff, **sizes):
    mine_ms, torch_ms, paired = medians(times)
    return {"part": "library", "what": what, "world_size": world, "mine_ms": mine_ms,
            "torch_ms": torch_ms, "ratio": mine_ms / torch_ms, "ratio_paired": paired,
            "loss_mine": losses[0], "loss_torch": losses[1],
            "loss_diff": abs(losses[0] - losses[1]), "grad_diff": grad_diff, **sizes}


def _max_over_ranks(value):
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def tensor_row(student, args, rank, world, tokens, warmup):
    """Your ParallelMLP against ColwiseParallel + RowwiseParallel on an input of ``tokens``
    (batch, sequence) rows, ``warmup`` untimed steps: MSE loss, x needs grad (so both run the
    backward all-reduce of f)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    d = args.tp_width
    torch.manual_seed(0)
    full = student.MLP(d, 4 * d)
    lib = parallelize_module(copy.deepcopy(full), init_device_mesh("cpu", (world,)),
                             {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    mine = student.ParallelMLP.from_mlp(full)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(*tokens, d, generator=gen, requires_grad=True)
    y = torch.randn(*tokens, d, generator=gen)
    losses, grads = [None, None], [None, None]

    def step(i, model):
        def one():
            model.zero_grad(set_to_none=True)
            x.grad = None
            loss = F.mse_loss(model(x), y)
            loss.backward()
            losses[i], grads[i] = float(loss.detach()), x.grad
        return one
    times = time_interleaved([step(0, mine), step(1, lib)], warmup, args.iters)
    diff = _max_over_ranks(float((grads[0] - grads[1]).abs().max()))
    return _library_row("tensor", world, times, losses, diff, width=d, tokens=list(tokens))


def pipeline_row(student, args, rank, world, depth, warmup):
    """Your pipeline_step + one_f_one_b_order against PipelineStage + Schedule1F1B on a stack of
    ``depth`` blocks, ``warmup`` untimed steps (mean loss per micro-batch, gradients divided by
    m after the step: the whole batch's mean loss, as yours)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    m, last = args.pp_microbatches, rank == world - 1
    full = stack(args.pp_width, depth)
    mine, lib = (copy.deepcopy(stage_of(full, world, rank)) for _ in range(2))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.pp_batch, args.pp_width, generator=gen)
    y = torch.randn(args.pp_batch, args.pp_width, generator=gen)
    order = student.one_f_one_b_order(world, m, rank)
    schedule = Schedule1F1B(PipelineStage(lib, stage_index=rank, num_stages=world,
                                          device=torch.device("cpu")),
                            n_microbatches=m, loss_fn=F.mse_loss)
    losses = [0.0, 0.0]

    def yours():
        mine.zero_grad(set_to_none=True)
        loss = student.pipeline_step(mine, order, inputs=x, targets=y, loss_fn=F.mse_loss)
        losses[0] = float(loss) if last else 0.0

    def torchs():
        lib.zero_grad(set_to_none=True)
        if rank == 0:
            schedule.step(x)
        elif last:
            per_mb = []
            schedule.step(target=y, losses=per_mb)
            losses[1] = sum(float(v.detach()) for v in per_mb) / m   # equal micro-batches
        else:
            schedule.step()
    times = time_interleaved([yours, torchs], warmup, args.iters)
    diff = _max_over_ranks(max(float((a.grad - b.grad).abs().max())
                               for a, b in zip(mine.parameters(), lib.parameters())))
    both = torch.tensor(losses, dtype=torch.float64)
    dist.broadcast(both, src=world - 1)
    return _library_row("pipeline", world, times, both.tolist(), diff, width=args.pp_width,
                        batch=args.pp_batch, m=m)


def library_rows(student, args, rank, world, depth, warmup, tokens):
    """Rank 0: the rows of the tensor and pipeline comparisons; the other ranks: none.
    ``depth``, ``warmup``, ``tokens``: :mod:`.bench`'s settings (``DEPTH``, ``WARMUP``,
    ``TP_TOKENS``), given by it: this module imports nothing of it."""
    rows = [tensor_row(student, args, rank, world, tokens, warmup),
            pipeline_row(student, args, rank, world, depth, warmup)]
    return rows if rank == 0 else []
