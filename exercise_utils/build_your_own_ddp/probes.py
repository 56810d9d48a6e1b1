"""What runs inside the ranks of notebook 06's checks: one probe per stage.

:func:`probe` runs inside every rank started by :func:`exercise_utils.harness.run_ranks`
(2 ranks with torchrun's variables ``RANK``/``WORLD_SIZE``, 3 ranks under ``mpiexec``). It
joins the job with the student's ``init`` (or by itself when ``init`` is not written yet),
replaces every ``torch.distributed`` collective by a recording wrapper (which collective,
how many elements, ``async_op``, when its ``wait()`` came; collectives that reach the
ProcessGroup below them are kept per stage as ``hidden``: :mod:`.recorder`) and runs one
probe per graded stage: ``api`` (here), ``naive``, ``flat``, ``overlap``, ``buckets``
(:mod:`.probes_grad`). Each input case of a stage is announced with ``ctx.case`` (a crash or a
hang is charged to it). For the stages that broadcast (``api``, ``overlap``, ``buckets``) the
models come seeded differently on every rank, so a missing broadcast shows;
``allreduce_naive`` / ``allreduce_flat`` get the same start on every rank (they only average).
The models, batches and the replay the checker compares with are in :mod:`.reference`;
``init`` under every launcher and world size is probed on its own (:mod:`.probes_init`).

Used in 06_build_your_own_ddp (by :mod:`.checks` and :mod:`.checks_overlap`).
"""
import datetime
import gc
import os
from pathlib import Path

import torch
import torch._dynamo  # noqa: F401 - the ranks' optimizers need it: imported once, before they fork
import torch.distributed as dist
import torch.nn.functional as F

from ..rankworker import not_implemented
from ..recorder import Recorder
from . import probes_grad
from .reference import (DATA_SIZE, GLOBAL_BATCH, LR, MOMENTUM, dataset, grads_of,
                        named_state, seeded_model)

STAGES = ("api", "naive", "flat", "overlap", "buckets")

# (case, root: "last" or a rank, spec) of broadcast_parameters
BROADCAST_CASES = [("bcast-values", 0, "edge"), ("bcast-root", "last", "edge"),
                   ("bcast-float64", "middle", "edge64")]
# (case, strategy, how the loop calls the optimizer) of DistributedOptimizer, on "edge"
OPTIMIZER_CASES = [("dopt-naive", "naive", "loop"), ("dopt-flat", "flat", "loop"),
                   ("dopt-callable", "callable", "loop"), ("dopt-closure", "flat", "closure"),
                   ("dopt-zero-grad", "naive", "zero_grad")]


# ---------------------------------------------------------------- the probe
def probe(student, ctx, stages, progress, gloo_timeout, master=None):
    """Run the probes of ``stages``; return ``{stage: result}`` (``{"todo": function}``
    where the student's code raised NotImplementedError). Other errors propagate.
    ``master``: the rendezvous host where the launcher does not say it (``mpiexec`` on the
    hosts of a mesh: host 0's name), as one sets ``MASTER_ADDR`` for an MPI job."""
    if master and ctx.backend == "mpi":
        os.environ["MASTER_ADDR"] = master
    results, rec = {}, Recorder()
    _progress(progress, ctx.rank, "api:init")
    if "api" in stages:
        ctx.case("init-mpiexec" if ctx.backend == "mpi" else "init-torchrun")
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
            ctx.case(FIRST_CASE[stage])
            out = _try(student, lambda: PROBES[stage](student, ctx, rec, progress))
            results.setdefault(stage, {}).update(out, hidden=rec.take_hidden())
    finally:
        rec.uninstall()
    _progress(progress, ctx.rank, "done")
    ctx.case(None)
    gc.collect()        # free the hooks, handles and graphs that hold the group (gloo abort)
    dist.barrier()
    dist.destroy_process_group()
    return results


def _progress(folder, rank, what):
    """Note the stage this rank is in, for the judge's messages (in a folder of the judge's:
    on hosts, at grading, no rank sees it, and the judge goes by the failing case instead)."""
    try:
        (Path(folder) / f"rank{rank}").write_text(what)
    except OSError:
        pass


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


# ---------------------------------------------------------------- stage 1: the API
def probe_api(student, ctx, rec, progress):
    """The API, piece by piece (issue 39): ``broadcast_parameters``, ``partition_dataset`` and
    the training with ``DistributedOptimizer`` each run on their own; a piece that raises
    NotImplementedError is listed in ``out["unwritten"]`` (piece -> function) and the others
    still run (training needs the partition)."""
    out, todo = {}, {}
    data = torch.utils.data.TensorDataset(*dataset())

    def piece(name, fn):
        got = _try(student, fn)
        if isinstance(got, dict) and list(got) == ["todo"]:
            todo[name] = got["todo"]
            return None
        return got
    out["broadcast"] = piece("broadcast", lambda: [_broadcast(student, ctx, *case)
                                                   for case in BROADCAST_CASES])
    fits = piece("partition", lambda: _partition(student, ctx, rec, data, out))
    if fits:                    # no training on wrong batches: the checker reports them
        out["train"] = piece("train", lambda: {
            case: _train_api(student, ctx, data, case, strategy, how)
            for case, strategy, how in OPTIMIZER_CASES})
    out["unwritten"] = todo
    return out


def _partition(student, ctx, rec, data, out):
    """partition_dataset's cases into ``out``; whether every rank's batches have the sizes
    the training needs."""
    ctx.case("partition-indivisible")
    try:
        student.partition_dataset(data, GLOBAL_BATCH + 1)
        out["indivisible"] = "returned normally"
    except ValueError:
        out["indivisible"] = None
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported by the checker
        out["indivisible"] = f"raised {type(exc).__name__}: {exc}"
    ctx.case("partition-sizes")
    loader, per_rank = student.partition_dataset(data, GLOBAL_BATCH, seed=0)
    out["per_rank"], out["batches"] = int(per_rank), [b[2].tolist() for b in loader]
    sizes = [len(b) for b in out["batches"]]
    fits = torch.tensor([float(sizes == [GLOBAL_BATCH // ctx.size] * (DATA_SIZE // GLOBAL_BATCH))])
    rec.call("all_reduce", fits, op=dist.ReduceOp.MIN)
    if fits.item() < 1:
        return False
    ctx.case("partition-seed")
    loader, _ = student.partition_dataset(data, GLOBAL_BATCH, seed=1)
    out["seed1"] = [b[2].tolist() for b in loader]
    return True


def _broadcast(student, ctx, case, root, spec):
    ctx.case(case)
    root = {"last": ctx.size - 1, "middle": ctx.size // 2}.get(root, root)
    model = seeded_model(spec, 50 + ctx.rank, ctx.salt)
    tensors = list(model.parameters()) + list(model.buffers())
    before, ptrs = named_state(model), [t.data_ptr() for t in tensors]
    student.broadcast_parameters(model, root=root)
    return {"root": root, "before": before, "after": named_state(model),
            "in_place": ptrs == [t.data_ptr() for t in tensors]}


def _reference_reduce(ctx, log, kind):
    """The averaging the API's optimizer calls (the probe's own, so that a mistake in
    allreduce_naive / allreduce_flat never shows in the API's check)."""
    def reduce(params):
        with_grad = [p for p in params if p.grad is not None]
        log.append(f"{kind} of {len(with_grad)} gradients")
        for p in with_grad:
            dist.all_reduce(p.grad)          # the recorder's wrapper: counted, not checked
            p.grad.div_(ctx.size)
    return reduce


def _train_api(student, ctx, data, case, strategy, how):
    """Train with DistributedOptimizer on partition_dataset's batches; log the calls."""
    ctx.case(case)
    log = []
    saved = student.allreduce_naive, student.allreduce_flat
    student.allreduce_naive = _reference_reduce(ctx, log, "naive")
    student.allreduce_flat = _reference_reduce(ctx, log, "flat")
    if strategy == "callable":
        strategy = _reference_reduce(ctx, log, "callable")
    try:
        model = seeded_model("edge", 100 + ctx.rank, ctx.salt)
        init = named_state(model)
        student.broadcast_parameters(model, root=0)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        inner_step, inner_zero = opt.step, opt.zero_grad

        def zero_grad(set_to_none=True):
            log.append(f"optimizer.zero_grad(set_to_none={set_to_none})")
            return inner_zero(set_to_none=set_to_none)
        opt.step = lambda *a, **k: (log.append("optimizer.step"), inner_step(*a, **k))[1]
        opt.zero_grad = zero_grad
        dopt = student.DistributedOptimizer(opt, model, strategy=strategy)
        loader, _ = student.partition_dataset(data, GLOBAL_BATCH, seed=1)
        batches, losses, grads = [], [], []
        for step, (x, y, idx) in enumerate(loader):
            losses.append(_one_step(dopt, model, x, y, log, how, step))
            batches.append(idx.tolist())
            grads.append(grads_of(model))
    finally:
        student.allreduce_naive, student.allreduce_flat = saved
    return {"init": init, "batches": batches, "final": named_state(model), "log": log,
            "losses": losses, "grads": grads}


def _one_step(dopt, model, x, y, log, how, step):
    """One step as ``how`` says: "loop" (zero_grad, backward, step), "closure" (step(closure)
    with the gradients of the previous step still there: returns [what step returned, the
    closure's loss]), "zero_grad" (set_to_none=False, the default, False again: what the
    gradients are after each is logged)."""
    x = x.to(model.head.weight.dtype)
    computed = []

    def closure():
        log.append("closure")
        dopt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        log.append("backward")
        computed.append(float(loss))
        return loss
    if how == "closure":
        returned = dopt.step(closure)
        if isinstance(returned, (torch.Tensor, float)):
            returned = float(returned)
        return [returned if isinstance(returned, float) else repr(returned),
                computed[-1] if computed else None]
    if how == "zero_grad" and step != 1:
        dopt.zero_grad(set_to_none=False)
    else:
        dopt.zero_grad()
    if how == "zero_grad":
        kept = [p.grad for p in model.parameters() if p.grad is not None]
        log.append(f"then {len(kept)} gradients, all zero: {all(not g.any() for g in kept)}")
    F.cross_entropy(model(x), y).backward()
    log.append("backward")
    dopt.step()
    return None


FIRST_CASE = {"api": "bcast-values", "naive": "naive-values", "flat": "flat-values",
              "overlap": "overlap-values", "buckets": "buckets-packing"}
PROBES = {"api": probe_api, "naive": probes_grad.probe_reduce("allreduce_naive"),
          "flat": probes_grad.probe_reduce("allreduce_flat"),
          "overlap": probes_grad.probe_overlap, "buckets": probes_grad.probe_buckets}
