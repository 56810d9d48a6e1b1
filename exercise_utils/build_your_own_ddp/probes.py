"""What runs inside the ranks of notebook 06's checks: one probe per stage.

:func:`probe` runs inside every rank started by :func:`exercise_utils.harness.run_ranks`
(2 ranks with torchrun's variables ``RANK``/``WORLD_SIZE``, 3 ranks under ``mpiexec``). It
joins the job with the student's ``init`` (or by itself when ``init`` is not written yet),
replaces every ``torch.distributed`` collective by a recording wrapper (which collective,
how many elements, ``async_op``, when its ``wait()`` came; collectives that reach the
ProcessGroup below them are kept per stage as ``hidden``: :mod:`.recorder`) and runs one
probe per graded stage: ``api``, ``naive``, ``flat``, ``overlap``, ``buckets`` (which ends
with a layer skipped in one step: ``_train_unused``). For the stages that broadcast
(``api``, ``overlap``, ``buckets``) the models come seeded differently on every rank, so a
missing broadcast shows; ``allreduce_naive`` / ``allreduce_flat`` get the same
start on every rank (they only average). The models, batches and the replay the checker
compares with are in :mod:`.reference`.

Used in 06_build_your_own_ddp (by :mod:`.checks` and :mod:`.checks_overlap`).
"""
import datetime
import gc
from pathlib import Path

import torch
import torch._dynamo  # noqa: F401 - the ranks' optimizers need it: imported once, before they fork
import torch.distributed as dist
import torch.nn.functional as F

from ..models import TinyMLP
from ..rankworker import not_implemented
from ..recorder import Recorder
from .reference import (BUCKET_CAPS, DATA_SIZE, GLOBAL_BATCH, LR, MOMENTUM, STEPS, UNUSED_AT,
                        batch, dataset, grads_of, named_state, seeded_model)

STAGES = ("api", "naive", "flat", "overlap", "buckets")


# ---------------------------------------------------------------- the probe
def probe(student, ctx, stages, progress, gloo_timeout):
    """Run the probes of ``stages``; return ``{stage: result}`` (``{"todo": function}``
    where the student's code raised NotImplementedError). Other errors propagate."""
    results, rec = {}, Recorder()
    _progress(progress, ctx.rank, "api:init")
    if "api" in stages:
        results["api"] = {"init": _try(student, lambda: _init(student, ctx, gloo_timeout))}
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=ctx.rank, world_size=ctx.size,
                                timeout=datetime.timedelta(seconds=gloo_timeout))
    if (dist.get_rank(), dist.get_world_size()) != (ctx.rank, ctx.size):
        raise RuntimeError(f"after init() this process is rank {dist.get_rank()} of "
                           f"{dist.get_world_size()}; the launcher started it as rank "
                           f"{ctx.rank} of {ctx.size}: {LAUNCHER_VARIABLES}")
    rec.install(student)
    try:
        for stage in stages:
            _progress(progress, ctx.rank, stage)
            out = _try(student, lambda: PROBES[stage](student, ctx, rec, progress))
            results.setdefault(stage, {}).update(out, hidden=rec.take_hidden())
    finally:
        rec.uninstall()
    _progress(progress, ctx.rank, "done")
    gc.collect()        # free the hooks, handles and graphs that hold the group (gloo abort)
    dist.barrier()
    dist.destroy_process_group()
    return results


def _progress(folder, rank, what):
    (Path(folder) / f"rank{rank}").write_text(what)


def _try(student, fn):
    try:
        return fn()
    except NotImplementedError as exc:
        return not_implemented(student, exc)


LAUNCHER_VARIABLES = ("read the rank and world size from the launcher's variables (torchrun: "
                      "RANK, WORLD_SIZE; MPICH: PMI_RANK, PMI_SIZE; Open MPI: "
                      "OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE)")


def _init(student, ctx, gloo_timeout):
    try:
        rank, size, device = student.init(backend="gloo", timeout_s=gloo_timeout)
    except Exception as exc:  # noqa: BLE001 - one cause is certain, the others propagate
        if "address already in use" not in str(exc) and "EADDRINUSE" not in str(exc):
            raise
        # The check gives every rank the same MASTER_PORT, which only rank 0 listens on: a
        # second listener means a second process that believes it is rank 0.
        raise RuntimeError(f"init() failed on rank {ctx.rank} of {ctx.size}: the process "
                           "group's store port (MASTER_PORT) was already taken by another "
                           "process of this job, so two processes believe they are rank 0: "
                           f"{LAUNCHER_VARIABLES}") from None
    ok = dist.is_initialized()
    return {"returned": [int(rank), int(size), str(device)], "initialized": ok,
            "backend": dist.get_backend() if ok else None,
            "group": [dist.get_rank(), dist.get_world_size()] if ok else None}


def probe_api(student, ctx, rec, progress):
    torch.manual_seed(50 + ctx.rank)
    model, root = TinyMLP(), ctx.size - 1
    before, ptrs = named_state(model), [p.data_ptr() for p in model.parameters()]
    student.broadcast_parameters(model, root=root)
    out = {"broadcast": {"root": root, "before": before, "after": named_state(model),
                         "in_place": ptrs == [p.data_ptr() for p in model.parameters()]}}
    data = torch.utils.data.TensorDataset(*dataset())
    try:
        student.partition_dataset(data, GLOBAL_BATCH + 1)
        out["indivisible"] = "returned normally"
    except ValueError:
        out["indivisible"] = None
    except Exception as exc:  # noqa: BLE001 - reported by the checker
        out["indivisible"] = f"raised {type(exc).__name__}: {exc}"
    loader, per_rank = student.partition_dataset(data, GLOBAL_BATCH, seed=0)
    out["per_rank"], out["batches"] = int(per_rank), [b[2].tolist() for b in loader]
    sizes = [len(b) for b in out["batches"]]
    fits = torch.tensor([float(sizes == [GLOBAL_BATCH // ctx.size] * (DATA_SIZE // GLOBAL_BATCH))])
    rec.call("all_reduce", fits, op=dist.ReduceOp.MIN)
    if fits.item() < 1:         # no training on wrong batches: the checker reports them
        return out
    out["train"] = {s: _train_api(student, ctx, data, s) for s in ("naive", "flat")}
    return out


def _train_api(student, ctx, data, strategy):
    log, all_reduce = [], dist.all_reduce

    def reference(kind):
        def reduce(params):
            with_grad = [p for p in params if p.grad is not None]
            log.append(f"{kind} of {len(with_grad)} gradients")
            for p in with_grad:
                all_reduce(p.grad)          # the recorder's wrapper: counted, not checked
                p.grad.div_(ctx.size)
        return reduce
    saved = student.allreduce_naive, student.allreduce_flat
    student.allreduce_naive, student.allreduce_flat = reference("naive"), reference("flat")
    try:
        model = seeded_model("bn", 100 + ctx.rank)
        init = named_state(model)
        student.broadcast_parameters(model, root=0)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        inner_step, inner_zero = opt.step, opt.zero_grad
        opt.step = lambda *a, **k: (log.append("optimizer.step"), inner_step(*a, **k))[1]
        opt.zero_grad = lambda *a, **k: (log.append("optimizer.zero_grad"), inner_zero(*a, **k))[1]
        dopt = student.DistributedOptimizer(opt, model, strategy=strategy)
        loader, _ = student.partition_dataset(data, GLOBAL_BATCH, seed=1)
        batches = []
        for x, y, idx in loader:
            dopt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            log.append("backward")
            dopt.step()
            batches.append(idx.tolist())
    finally:
        student.allreduce_naive, student.allreduce_flat = saved
    return {"init": init, "batches": batches, "final": named_state(model), "log": log}


def _probe_reduce(function):
    def run(student, ctx, rec, progress):
        out = {}
        for name in ("tied", "bn"):
            model = seeded_model(name, 0)               # the same start on every rank
            init, steps, grads = named_state(model), [], None
            opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
            unused = torch.nn.Parameter(torch.zeros(3))     # trainable, never gets a gradient
            for step in range(STEPS):
                opt.zero_grad(set_to_none=True)
                x, y = batch(name, step, ctx.rank)
                F.cross_entropy(model(x), y).backward()
                rec.take()
                getattr(student, function)([unused] + list(model.parameters()))
                steps.append(rec.take())
                grads = grads or grads_of(model)
                opt.step()
            out[name] = {"init": init, "final": named_state(model), "events": steps,
                         "grads": grads}
        return out
    return run


def _train_ddp(student, ctx, rec, name, make_ddp, no_sync_first=False):
    model = seeded_model(name, 100 + ctx.rank)
    init = named_state(model)
    for pname, p in model.named_parameters():
        if p.requires_grad:      # registered before the student's hooks: they run first
            p.register_post_accumulate_grad_hook(lambda _, n=pname: rec.mark("ready", n))
    ddp = make_ddp(model)
    after_init, steps, grads = named_state(model), [], None
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        rec.take()
        if step == 0 and no_sync_first:
            with ddp.no_sync():
                F.cross_entropy(ddp(batch(name, 0, ctx.rank, 1)[0]),
                                batch(name, 0, ctx.rank, 1)[1]).backward()
            rec.mark("no_sync_end")
        x, y = batch(name, step, ctx.rank)
        x.requires_grad_(True)
        x.register_hook(lambda g: rec.mark("input_grad"))
        F.cross_entropy(ddp(x), y).backward()
        rec.mark("backward_done")
        ddp.finish_gradient_synchronization()
        steps.append(rec.take())
        grads = grads or grads_of(model)
        opt.step()
    return ddp, {"init": init, "after_init": after_init, "final": named_state(model),
                 "events": steps, "grads": grads}


def probe_overlap(student, ctx, rec, progress):
    return {name: _train_ddp(student, ctx, rec, name, student.OverlapDDP)[1]
            for name in ("tied", "bn")}


def probe_buckets(student, ctx, rec, progress):
    out = {}
    for name in ("tied", "bn"):
        _progress(progress, ctx.rank, f"buckets:{name}")
        cap = BUCKET_CAPS[name] / 2 ** 20
        ddp, out[name] = _train_ddp(student, ctx, rec, name,
                                    lambda m: student.BucketDDP(m, bucket_cap_mb=cap), True)
        names = {id(p): n for n, p in ddp.module.named_parameters()}
        out[name]["buckets"] = [[b if isinstance(b, str) else names.get(id(b), repr(b))
                                 for b in bucket] for bucket in ddp.buckets]
    _progress(progress, ctx.rank, "buckets:unused")
    out["unused"] = _train_unused(student, ctx)
    return out


def _train_unused(student, ctx):
    """BucketDDP(BranchNet), the branch skipped in step UNUSED_AT (its parameters get no
    gradient): ``{"error": [step, type, message, is RuntimeError] or None, "final": state}``,
    the error being what finish_gradient_synchronization raised (training stops there)."""
    model = seeded_model("branch", 100 + ctx.rank)
    ddp = student.BucketDDP(model, bucket_cap_mb=BUCKET_CAPS["branch"] / 2 ** 20)
    opt, error = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM), None
    for step in range(UNUSED_AT + 1):
        opt.zero_grad(set_to_none=True)
        model.use_branch = step != UNUSED_AT
        x, y = batch("branch", step, ctx.rank)
        F.cross_entropy(ddp(x), y).backward()
        try:
            ddp.finish_gradient_synchronization()
        except Exception as exc:  # noqa: BLE001 - reported by the checker
            error = [step, type(exc).__name__, str(exc), isinstance(exc, RuntimeError)]
            break
        opt.step()
    return {"error": error, "final": named_state(model)}


PROBES = {"api": probe_api, "naive": _probe_reduce("allreduce_naive"),
          "flat": _probe_reduce("allreduce_flat"), "overlap": probe_overlap,
          "buckets": probe_buckets}
