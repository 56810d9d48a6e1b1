"""Checkers of notebook 06's stages that overlap communication with backward: ``check_overlap``
(``OverlapDDP``) and ``check_buckets`` (``BucketDDP``).

They share the launches of :mod:`.checks` (one per world size for every stage, kept per file
content). Besides the numbers (:func:`.checks.verify_numbers`), they check the structure of
each step from the recorded events: one async all_reduce per parameter (overlap) or per
bucket (buckets), started during backward as soon as its gradients are ready, waited for only
in ``finish_gradient_synchronization``; the bucket packing (reverse registration order, the
cap, frozen parameters skipped, a tied one once), nothing inside ``no_sync()``, and a
``RuntimeError`` naming the trainable parameters that got no gradient in a step (a layer the
forward skipped) from ``finish_gradient_synchronization`` (else the replicas drift apart).

Used in 06_build_your_own_ddp.
"""
import numpy as np

from . import reference as ref
from .checks import collective_events, verify_broadcast_at_start, verify_numbers
from .launches import TIMEOUT, raise_if_todo, stage_results


def check_overlap(path, timeout=TIMEOUT):
    """Check ``OverlapDDP``: broadcast at construction, async all_reduce per parameter
    started during backward, waited for only in ``finish_gradient_synchronization``."""
    for size, _, res in stage_results(path, "overlap", timeout):
        raise_if_todo(res, path)
        for name in ("tied", "bn"):
            runs = [out[name] for out in res]
            verify_broadcast_at_start(runs, "OverlapDDP", size)
            n = len(ref.grad_params(name))
            for rank, run in enumerate(runs):
                for events in run["events"]:
                    _check_overlap_step(events, rank, n)
                verify_numbers(run, ref.reference(name, runs[0], size), rank, size,
                               f"OverlapDDP training ({name} model)",
                               "finish_gradient_synchronization must wait for every handle "
                               "started in this backward, divide by world_size, and forget "
                               "them (the next step starts afresh)")


def _check_overlap_step(events, rank, n):
    kinds = [e[0] for e in events]
    calls = [(i, e) for i, e in enumerate(events) if e[0] == "coll"]
    if len(calls) != n or any(e[1] != "all_reduce" for _, e in calls):
        raise AssertionError(f"rank {rank}: OverlapDDP made {[e[1] for _, e in calls]} in one "
                             f"step; expected one all_reduce per parameter with a gradient ({n})")
    if any(not e[3] for _, e in calls):
        raise AssertionError(f"rank {rank}: OverlapDDP's all_reduce calls are blocking "
                             "(async_op=False): backward stops at each hook until that "
                             "gradient has travelled, so nothing overlaps. Pass async_op=True, "
                             "keep the handles, wait in finish_gradient_synchronization")
    end, last = kinds.index("backward_done"), kinds.index("input_grad")
    if calls[0][0] > last:
        raise AssertionError(f"rank {rank}: OverlapDDP started its first all_reduce after "
                             "backward had finished: start each one in the parameter's "
                             "post-accumulate-grad hook, while backward goes on")
    waits = [i for i, e in enumerate(events) if e[0] == "wait"]
    if any(i < end for i in waits):
        raise AssertionError(f"rank {rank}: OverlapDDP waited for an all_reduce during "
                             "backward (handle.wait() in the hook blocks like a blocking "
                             "all_reduce): wait only in finish_gradient_synchronization")


# ---------------------------------------------------------------- stage 5
def check_buckets(path, timeout=TIMEOUT):
    """Check ``BucketDDP``: packing (reverse order, cap, frozen skipped, tied once), one
    async all_reduce per bucket started when its last gradient is ready, ``no_sync``."""
    for size, _, res in stage_results(path, "buckets", timeout):
        raise_if_todo(res, path)
        for name in ("tied", "bn"):
            runs = [out[name] for out in res]
            want = ref.expected_buckets(name)
            for rank, run in enumerate(runs):
                _check_packing(run["buckets"], want, name, rank)
            verify_broadcast_at_start(runs, "BucketDDP", size)
            sizes = dict(ref.grad_params(name))
            for rank, run in enumerate(runs):
                for step, events in enumerate(run["events"]):
                    if step == 0:
                        cut = events.index(("no_sync_end",))
                        inside = collective_events(events[:cut])
                        if inside:
                            raise AssertionError(
                                f"rank {rank}: a backward inside BucketDDP.no_sync() launched "
                                f"{[c[1:3] for c in inside]}: no communication there, the "
                                "gradients only accumulate (the next backward reduces them)")
                        events = events[cut:]
                    _check_bucket_step(events, run["buckets"], sizes, rank, step)
                verify_numbers(run, ref.reference(name, runs[0], size, True), rank, size,
                               f"BucketDDP training ({name} model, first step accumulated "
                               "over two backward passes, one inside no_sync)",
                               "finish_gradient_synchronization must wait, divide by "
                               "world_size and copy each bucket back into the gradients")
        _check_unused([out["unused"] for out in res], size)


def _check_unused(runs, size):
    """The step whose forward skipped a layer: finish_gradient_synchronization raised a
    RuntimeError naming its parameters on every rank (else: did the replicas drift?)."""
    names, step = list(ref.UNUSED), ref.UNUSED_AT
    what = (f"BucketDDP(BranchNet(), bucket_cap_mb={ref.BUCKET_CAPS['branch']} / 2**20) with "
            f"{size} ranks (buckets {ref.expected_buckets('branch')}): in step {step} the "
            f"forward skipped the layer 'branch', so {names} got no gradient, and "
            f"finish_gradient_synchronization() ")
    if all(run["error"] is None for run in runs):
        drift = max(float(np.max(np.abs(v - runs[0]["final"][k])))
                    for run in runs for k, v in run["final"].items())
        raise AssertionError(
            what + "returned normally" + (f": the replicas drifted apart (by {drift:.1e}): the "
                                          "bucket waiting for those gradients was never "
                                          "reduced, its other gradients stayed local"
                                          if drift > 0 else "")
            + f". It must raise RuntimeError naming {names} (every trainable parameter that "
            "got no gradient in that backward)")
    for rank, run in enumerate(runs):
        if run["error"] is None:
            raise AssertionError(f"rank {rank}: {what}returned normally, while other ranks "
                                 "raised: every rank must raise RuntimeError naming them")
        at, kind, message, is_runtime = run["error"]
        if at != step:
            raise AssertionError(f"rank {rank}: BucketDDP(BranchNet()): finish_gradient_"
                                 f"synchronization() raised {kind}: {message} in step {at}, "
                                 "where every trainable parameter got its gradient")
        if not is_runtime or any(name not in message for name in names):
            raise AssertionError(f"rank {rank}: {what}raised {kind}: {message!r}; expected a "
                                 f"RuntimeError whose message names {names}")


def _check_packing(got, want, name, rank):
    flat, order = [p for b in got for p in b], [p for b in want for p in b]
    what = (f"rank {rank}: with a {ref.BUCKET_CAPS[name]}-byte cap (bucket_cap_mb="
            f"{ref.BUCKET_CAPS[name]} / 2**20) the buckets of "
            f"{type(ref.make_model(name)).__name__} are {got}")
    if sorted(flat) != sorted(order):
        raise AssertionError(f"{what}; it must hold each parameter that requires a gradient "
                             f"exactly once (frozen ones skipped, a tied one once): {order}")
    if flat != order:
        raise AssertionError(f"{what}; expected reverse registration order {order} (the order "
                             "backward produces the gradients, so the first bucket fills first)")
    sizes = dict(ref.grad_params(name))
    over = [b for b in got if len(b) > 1 and 4 * sum(sizes[p] for p in b) > ref.BUCKET_CAPS[name]]
    if got != want and got == ref.expected_buckets(name, ref.BUCKET_CAPS[name] / 2**20 * 1e6):
        raise AssertionError(f"{what}; expected {want}: these are the buckets of a cap of "
                             f"bucket_cap_mb * 10**6 bytes; bucket_cap_mb is in MiB, as in "
                             f"DistributedDataParallel: the cap is bucket_cap_mb * 1024 * 1024 "
                             f"bytes")
    if len(got) != len(want) or any(not b for b in got) or over:
        raise AssertionError(f"{what}; expected {want}: fill each bucket up to the cap, start a "
                             "new one when the next parameter would exceed it, no empty bucket")


def _check_bucket_step(events, buckets, sizes, rank, step):
    calls = [(i, e) for i, e in enumerate(events) if e[0] == "coll"]
    ready = {e[1]: i for i, e in enumerate(events) if e[0] == "ready"}
    done = sorted(range(len(buckets)), key=lambda b: max(ready.get(p, -1) for p in buckets[b]))
    numels = [sum(sizes[p] for p in buckets[b]) for b in done]
    if not calls:
        raise AssertionError(
            f"rank {rank}: BucketDDP made no all_reduce at all in step {step} ("
            + ("the backward after one inside no_sync()" if step == 0 else "after a complete "
               "step") + f"), although every gradient arrived; expected one per bucket of "
            f"{numels} elements. Each backward outside no_sync() counts every bucket's "
            "gradients from zero: reset the counters in finish_gradient_synchronization, and "
            "count nothing inside no_sync()")
    if [e[1] for _, e in calls] != ["all_reduce"] * len(buckets) or \
            [e[2] for _, e in calls] != numels:
        raise AssertionError(f"rank {rank}: BucketDDP made {[e[1:3] for _, e in calls]} in one "
                             f"step (collective, elements); expected one all_reduce per bucket "
                             f"of {numels} elements, in the order the buckets fill")
    if any(not e[3] for _, e in calls):
        raise AssertionError(f"rank {rank}: BucketDDP's all_reduce calls are blocking "
                             "(async_op=False): use async_op=True and wait in "
                             "finish_gradient_synchronization")
    end = [e[0] for e in events].index("backward_done")
    for (i, _), b in zip(calls, done):
        full = max(ready[p] for p in buckets[b])
        nxt = min([j for j in ready.values() if j > full] + [end])
        if not full < i < nxt:
            raise AssertionError(f"rank {rank}: the all_reduce of bucket {buckets[b]} did not "
                                 "start as soon as its last gradient was ready: start it in "
                                 "the hook of that last gradient, during backward")
    if any(e[0] == "wait" and i < end for i, e in enumerate(events)):
        raise AssertionError(f"rank {rank}: BucketDDP waited for an all_reduce during backward:"
                             " wait only in finish_gradient_synchronization")
