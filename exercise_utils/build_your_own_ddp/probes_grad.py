"""What runs inside the ranks for notebook 06's gradient stages: ``allreduce_naive``,
``allreduce_flat`` (:func:`probe_reduce`), ``OverlapDDP`` (:func:`probe_overlap`) and
``BucketDDP`` (:func:`probe_buckets`), each on several models and patterns in one launch.

Every run trains ``STEPS`` SGD steps of a model of :mod:`.reference` and returns plain data:
the initial and final state, per step the recorded events (collectives, their ``wait()``, the
probe's marks: a parameter's gradient ready, the input's gradient, the end of backward, the end
of a ``no_sync()`` block) and the gradients after synchronisation. Each run announces its case
(``ctx.case``): a crash or a hang in it is charged there.

Used in 06_build_your_own_ddp (by :mod:`.probes`).
"""
import numpy as np
import torch
import torch.nn.functional as F

from .reference import (BUCKET_CAPS, LR, MOMENTUM, STEPS, UNUSED_AT, batch, grads_of,
                        named_state, seeded_model)

# (case suffix, model spec) of allreduce_naive / allreduce_flat: one dimension at a time
REDUCE_CASES = [("values", "plain"), ("edge-model", "edge"), ("unused", "edge-unused"),
                ("float64", "edge64")]
OVERLAP_CASES = [("overlap-values", "edge-unused"), ("overlap-float64", "edge-unused64")]
# (case, spec, what step 0 does before its synchronised backward)
BUCKET_CASES = [("buckets-values", "edge", None), ("buckets-float64", "edge64", None),
                ("buckets-no-sync", "edge", "no_sync"),
                ("buckets-nested-no-sync", "edge", "nested")]
MICROS = {None: None, "no_sync": [1, 0], "nested": [1, 2, 0]}   # step 0's micro-batches


# ---------------------------------------------------------------- naive and flat
def probe_reduce(function):
    """The probe of ``allreduce_naive`` or ``allreduce_flat``: ``{case suffix: run}``."""
    stage = function.split("_")[1]

    def run(student, ctx, rec, progress):
        return {suffix: _reduce_run(student, ctx, rec, function, f"{stage}-{suffix}", spec)
                for suffix, spec in REDUCE_CASES}
    return run


def _reduce_run(student, ctx, rec, function, case, spec):
    """SGD whose gradients the student's function averages, given ``model.parameters()``
    (those without a gradient included); the same start on every rank."""
    ctx.case(case)
    model = seeded_model(spec, 0)
    init, events, grads, none, moved = named_state(model), [], [], [], []
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        x, y = batch(spec, step, ctx.rank, salt=ctx.salt)
        F.cross_entropy(model(x), y).backward()
        ptrs = {n: p.grad.data_ptr() for n, p in model.named_parameters() if p.grad is not None}
        rec.take()
        getattr(student, function)(list(model.parameters()))
        events.append(rec.take())
        params = dict(model.named_parameters())
        none.append(sorted(n for n, p in params.items() if p.grad is None))
        moved.append(sorted(n for n, ptr in ptrs.items() if params[n].grad is None
                            or params[n].grad.data_ptr() != ptr))
        grads.append(grads_of(model))
        opt.step()
    return {"init": init, "final": named_state(model), "events": events, "grads": grads,
            "none": none, "moved": moved}


# ---------------------------------------------------------------- overlap and buckets
def probe_overlap(student, ctx, rec, progress):
    return {case: _train_ddp(student, ctx, rec, case, spec, student.OverlapDDP)[1]
            for case, spec in OVERLAP_CASES}


def probe_buckets(student, ctx, rec, progress):
    out = {}
    for case, spec, pattern in BUCKET_CASES:
        cap = BUCKET_CAPS[case] / 2 ** 20
        ddp, out[case] = _train_ddp(student, ctx, rec, case, spec,
                                    lambda m: student.BucketDDP(m, bucket_cap_mb=cap), pattern)
        names = {id(p): n for n, p in ddp.module.named_parameters()}
        out[case]["buckets"] = [[b if isinstance(b, str) else names.get(id(b), repr(b))
                                 for b in bucket] for bucket in ddp.buckets]
        del ddp
    out["unused"] = _train_unused(student, ctx)
    return out


def _train_ddp(student, ctx, rec, case, spec, make_ddp, pattern=None):
    """Train a model wrapped by ``make_ddp``; step 0 first runs ``pattern`` ("no_sync":
    micro-batch 1 inside ``no_sync()``; "nested": micro-batch 1 inside two nested
    ``no_sync()``, micro-batch 2 inside the outer one, then an idle
    ``finish_gradient_synchronization()``)."""
    ctx.case(case)
    model = seeded_model(spec, 100 + ctx.rank, ctx.salt)
    init = named_state(model)
    for pname, p in model.named_parameters():
        if p.requires_grad:      # registered before the student's hooks: they run first
            p.register_post_accumulate_grad_hook(lambda _, n=pname: rec.mark("ready", n))
    ddp = make_ddp(model)
    after_init, steps, grads, idle = named_state(model), [], [], None
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        rec.take()
        if step == 0 and pattern:
            idle = _accumulate(ctx, rec, ddp, spec, pattern, case)
        x, y = batch(spec, step, ctx.rank, salt=ctx.salt)
        x.requires_grad_(True)
        x.register_hook(lambda g: rec.mark("input_grad"))
        F.cross_entropy(ddp(x), y).backward()
        rec.mark("backward_done")
        ddp.finish_gradient_synchronization()
        steps.append(rec.take())
        grads.append(grads_of(model))
        opt.step()
    return ddp, {"init": init, "after_init": after_init, "final": named_state(model),
                 "events": steps, "grads": grads, "idle": idle}


def _backward(ddp, spec, ctx, micro):
    x, y = batch(spec, 0, ctx.rank, micro, ctx.salt)
    F.cross_entropy(ddp(x), y).backward()


def _accumulate(ctx, rec, ddp, spec, pattern, case):
    """Step 0's backward passes without synchronisation; for "nested", then an idle
    ``finish_gradient_synchronization()``: returns what it did (error, gradients changed)."""
    with ddp.no_sync():
        if pattern == "nested":
            with ddp.no_sync():
                _backward(ddp, spec, ctx, 1)
            _backward(ddp, spec, ctx, 2)
        else:
            _backward(ddp, spec, ctx, 1)
    rec.mark("no_sync_end")
    if pattern != "nested":
        return None
    ctx.case("buckets-idle-finish")
    before, error = grads_of(ddp.module), None
    try:
        ddp.finish_gradient_synchronization()
    except Exception as exc:  # noqa: BLE001 - reported by the checker
        error = f"{type(exc).__name__}: {exc}"
    after = grads_of(ddp.module)
    rec.mark("idle_end")
    ctx.case(case)
    changed = sorted(k for k in before if k not in after or not np.array_equal(before[k], after[k]))
    return {"error": error, "changed": changed}


def _train_unused(student, ctx):
    """BucketDDP(BranchNet), the branch skipped in step UNUSED_AT (its parameters get no
    gradient), used again in the step after: ``{"errors": [[step, type, message, is
    RuntimeError], ...], "init", "final", "grads", "stale"}``. No optimizer step follows an
    error (as in a training loop that catches it); the step after must train normally. Then
    (``"stale"``, :func:`_skip_stale`) the branch is skipped twice more while it still holds
    a gradient from before."""
    ctx.case("buckets-unused-error")
    model = seeded_model("branch", 100 + ctx.rank, ctx.salt)
    init = named_state(model)
    ddp = student.BucketDDP(model, bucket_cap_mb=BUCKET_CAPS["branch"] / 2 ** 20)
    opt, errors, grads = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM), [], {}
    for step in range(UNUSED_AT + 2):
        if step > UNUSED_AT:
            ctx.case("buckets-after-error")
        opt.zero_grad(set_to_none=True)
        model.use_branch = step != UNUSED_AT
        x, y = batch("branch", step, ctx.rank, salt=ctx.salt)
        F.cross_entropy(ddp(x), y).backward()
        try:
            ddp.finish_gradient_synchronization()
        except Exception as exc:  # noqa: BLE001 - reported by the checker
            errors.append([step, type(exc).__name__, str(exc), isinstance(exc, RuntimeError)])
            if step != UNUSED_AT:
                break
            continue
        grads[step] = grads_of(model)
        opt.step()
    final = named_state(model)
    stale = _skip_stale(ddp, model, opt, ctx) if len(grads) == 2 else {}
    ctx.case("buckets-unused-error")
    return {"errors": errors, "init": init, "final": final, "grads": grads, "stale": stale}


STALE = ("zeroed", "no_sync")        # what left the skipped branch a gradient (see below)


def _skip_stale(ddp, model, opt, ctx):
    """Two more backward passes that skip the branch while its parameters still hold a
    gradient from before (``p.grad`` is not None, yet none arrived in THIS backward):
    "zeroed", after ``zero_grad(set_to_none=False)``; "no_sync", after a backward inside
    ``no_sync()`` that used the branch. ``{pattern: [type, message, is RuntimeError] or
    None (returned normally)}``; no optimizer step."""
    ctx.case("buckets-unused-stale")
    out = {}
    for k, pattern in enumerate(STALE):
        opt.zero_grad(set_to_none=pattern != "zeroed")
        x, y = batch("branch", UNUSED_AT + 2 + k, ctx.rank, salt=ctx.salt)
        if pattern == "no_sync":
            model.use_branch = True
            with ddp.no_sync():
                F.cross_entropy(ddp(x), y).backward()
        model.use_branch = False
        F.cross_entropy(ddp(x), y).backward()
        try:
            ddp.finish_gradient_synchronization()
            out[pattern] = None
        except Exception as exc:  # noqa: BLE001 - reported by the checker
            out[pattern] = [type(exc).__name__, str(exc), isinstance(exc, RuntimeError)]
    model.use_branch = True
    return out
