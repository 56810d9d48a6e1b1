"""Checkers of notebook 06's stages that overlap communication with backward: ``check_overlap``
(``OverlapDDP``) and ``check_buckets`` (``BucketDDP``).

They share the launches of :mod:`.checks` (one per world size for every stage, kept per file
content). Besides the numbers (:func:`.checks.verify_numbers`: every step's gradients, float32
and float64 EdgeNets), they check the structure of each step from the recorded events: one
async all_reduce per parameter (overlap) or per bucket (buckets), started during backward as
soon as its gradients are ready, waited for only in ``finish_gradient_synchronization``; the
bucket packing (reverse registration order, the cap in MiB with a bucket exactly at it, bytes
of the parameters' dtype, frozen parameters skipped, a tied one once), nothing inside
``no_sync()`` (nested too), an idle ``finish_gradient_synchronization()`` that does nothing,
and a ``RuntimeError`` naming exactly the trainable parameters that got no gradient in a step
(a layer the forward skipped), after which the next step trains normally.

Used in 06_build_your_own_ddp.
"""
import re

import numpy as np

from ..contract import fail
from ..harness import check
from . import expected
from . import reference as ref
from . import references
from .checks import collective_events, spec_words, verify_broadcast_at_start, verify_numbers
from .launches import TIMEOUT, raise_if_todo, stage_results
from .probes_grad import BUCKET_CASES, MICROS, OVERLAP_CASES, STALE


@check
def check_overlap(path, timeout=TIMEOUT):
    """Check ``OverlapDDP``: broadcast at construction, async all_reduce per parameter
    started during backward, waited for only in ``finish_gradient_synchronization``; on the
    wire, those calls and nothing else (``overlap-wire``)."""
    for size, _, res in stage_results(path, "overlap", timeout):
        raise_if_todo(res, path)
        for case, spec in OVERLAP_CASES:
            runs = [out[case] for out in res]
            verify_broadcast_at_start(runs, "OverlapDDP", size, "overlap-broadcast")
            n = len(ref.grad_params(spec))
            for rank, run in enumerate(runs):
                for events in run["events"]:
                    _check_overlap_step(events, rank, n)
            reference = references.reference(spec, runs[0], size)
            for rank, run in enumerate(runs):
                verify_numbers(run, reference, rank, size, f"OverlapDDP training "
                               f"({spec_words(spec)})", "finish_gradient_synchronization must "
                               "wait for every handle started in this backward, divide by "
                               "world_size, and forget them (the next step starts afresh)",
                               case, spec, "overlap-second-step")


def _check_overlap_step(events, rank, n):
    kinds = [e[0] for e in events]
    calls = [(i, e) for i, e in enumerate(events) if e[0] == "coll"]
    if len(calls) != n or any(e[1] != "all_reduce" for _, e in calls):
        fail("overlap-calls", f"rank {rank}: OverlapDDP made {[e[1] for _, e in calls]} in one "
                              f"step; expected one all_reduce per parameter with a gradient "
                              f"({n})")
    if any(not e[3] for _, e in calls):
        fail("overlap-async", f"rank {rank}: OverlapDDP's all_reduce calls are blocking "
                              "(async_op=False): backward stops at each hook until that "
                              "gradient has travelled, so nothing overlaps. Pass async_op=True, "
                              "keep the handles, wait in finish_gradient_synchronization")
    end, last = kinds.index("backward_done"), kinds.index("input_grad")
    if calls[0][0] > last:
        fail("overlap-during-backward", f"rank {rank}: OverlapDDP started its first all_reduce "
                                        "after backward had finished: start each one in the "
                                        "parameter's post-accumulate-grad hook, while backward "
                                        "goes on")
    waits = [i for i, e in enumerate(events) if e[0] == "wait"]
    if any(i < end for i in waits):
        fail("overlap-async", f"rank {rank}: OverlapDDP waited for an all_reduce during "
                              "backward (handle.wait() in the hook blocks like a blocking "
                              "all_reduce): wait only in finish_gradient_synchronization")


# ---------------------------------------------------------------- stage 5
@check
def check_buckets(path, timeout=TIMEOUT):
    """Check ``BucketDDP``: packing (reverse order, cap, bytes, frozen skipped, tied once), one
    async all_reduce per bucket started when its last gradient is ready, ``no_sync`` (nested),
    an idle finish, the error for parameters without gradient (also where they still hold a
    gradient from before: ``zero_grad(set_to_none=False)``, ``no_sync()``) and the step after
    it; on the
    wire, the broadcast and the buckets' all-reduces and nothing else (``buckets-wire``)."""
    for size, _, res in stage_results(path, "buckets", timeout):
        raise_if_todo(res, path)
        for rank, out in enumerate(res):
            _check_packings({case: (spec, out[case]["buckets"])
                             for case, spec, _ in BUCKET_CASES}, rank)
        runs = {case: [out[case] for out in res] for case, _, _ in BUCKET_CASES}
        for case, spec, pattern in BUCKET_CASES:
            verify_broadcast_at_start(runs[case], "BucketDDP", size, "buckets-broadcast")
        steps = {case: [_step0(run["events"], run["idle"], rank, case, pattern)
                        for rank, run in enumerate(runs[case])]
                 for case, spec, pattern in BUCKET_CASES}
        for case, spec, pattern in BUCKET_CASES:       # the numbers, then how they travelled
            reference = references.reference(spec, runs[case][0], size, MICROS[pattern])
            for rank, run in enumerate(runs[case]):
                verify_numbers(run, reference, rank, size, f"BucketDDP training "
                               f"({spec_words(spec)}" + {
                                   None: ")", "no_sync": "; step 0 accumulated over a backward "
                                   "inside no_sync() and one outside)", "nested": "; step 0 "
                                   "accumulated over two backward passes inside nested no_sync()"
                                   " blocks and one outside)"}[pattern],
                               "finish_gradient_synchronization must wait, divide by "
                               "world_size and copy each bucket back into the gradients",
                               case, spec, "buckets-second-step")
        for case, spec, pattern in BUCKET_CASES:
            sizes = dict(ref.grad_params(spec))
            for rank, run in enumerate(runs[case]):
                for step, events in enumerate(steps[case][rank]):
                    charged = ("buckets-second-step" if step else
                               case if pattern else "buckets-calls")
                    _check_bucket_step(events, run["buckets"], sizes, rank, step, charged)
        _check_unused([out["unused"] for out in res], size)


def _step0(events, idle, rank, case, pattern):
    """Every step's events, step 0 from its synchronised backward on (checked first)."""
    if not pattern:
        return events
    return [_check_accumulation(events[0], idle, rank, case)] + events[1:]


def _check_accumulation(events, idle, rank, case):
    """Step 0 of a no_sync pattern: nothing sent inside no_sync() (nested: inside the outer
    block after the inner one ended), an idle finish that does nothing. Returns the events of
    the synchronised backward."""
    cut = events.index(("no_sync_end",))
    inside = collective_events(events[:cut])
    if inside:
        nested = " (after the inner of two nested no_sync() blocks ended, still inside the " \
                 "outer one)" if case == "buckets-nested-no-sync" else ""
        fail(case, f"rank {rank}: a backward inside BucketDDP.no_sync(){nested} launched "
                   f"{[c[1:3] for c in inside]}: no communication until the outermost no_sync() "
                   "ends, the gradients only accumulate (the next backward reduces them)")
    if idle is None:
        return events[cut:]
    end = events.index(("idle_end",))
    sent = collective_events(events[cut:end])
    if idle["error"] or idle["changed"] or sent:
        did = (f"raised {idle['error']}" if idle["error"] else
               f"launched {[c[1:3] for c in sent]}" if sent else
               f"changed the gradients of {idle['changed']}")
        fail("buckets-idle-finish", f"rank {rank}: finish_gradient_synchronization() called "
             f"right after no_sync() blocks (no gradient arrived since the last call) {did}; "
             "with nothing arrived it must do nothing: raise only when some gradients arrived "
             "but not all, divide only what was reduced")
    return events[end:]


def _check_unused(runs, size):
    """The step whose forward skipped a layer: finish_gradient_synchronization raised a
    RuntimeError naming exactly its parameters on every rank; the step after trains normally."""
    names, step, used = list(ref.UNUSED), ref.UNUSED_AT, [
        n for n, _ in ref.grad_params("branch") if n not in ref.UNUSED]
    what = (f"BucketDDP(BranchNet(), bucket_cap_mb={ref.BUCKET_CAPS['branch']} / 2**20) with "
            f"{size} ranks (buckets {_packed('branch', ref.BUCKET_CAPS['branch'])}): in step "
            f"{step} the "
            f"forward skipped the layer 'branch', so {names} got no gradient, and "
            f"finish_gradient_synchronization() ")
    for rank, run in enumerate(runs):
        early = [e for e in run["errors"] if e[0] < step]
        if early:
            fail("buckets-unused-error", f"rank {rank}: BucketDDP(BranchNet()): finish_gradient_"
                 f"synchronization() raised {early[0][1]}: {early[0][2]} in step {early[0][0]}, "
                 "where every trainable parameter got its gradient")
    if not any(e[0] == step for run in runs for e in run["errors"]):
        drift = max(float(np.max(np.abs(v - runs[0]["final"][k])))
                    for run in runs for k, v in run["final"].items())
        fail("buckets-unused-error",
             what + "returned normally" + (f": the replicas drifted apart (by {drift:.1e}): the "
                                           "bucket waiting for those gradients was never "
                                           "reduced, its other gradients stayed local"
                                           if drift > 0 else "")
             + f". It must raise RuntimeError naming {names} (every trainable parameter that "
             "got no gradient in that backward)")
    for rank, run in enumerate(runs):
        error = next((e for e in run["errors"] if e[0] == step), None)
        if error is None:
            fail("buckets-unused-error", f"rank {rank}: {what}returned normally, while other "
                 "ranks raised: every rank must raise RuntimeError naming them")
        _, kind, message, is_runtime = error
        named = [n for n in used if re.search(rf"\b{re.escape(n)}\b", message)]
        if not is_runtime or any(name not in message for name in names) or named:
            fail("buckets-unused-error", f"rank {rank}: {what}raised {kind}: {message!r}; "
                 f"expected a RuntimeError whose message names {names}, every parameter that "
                 "got no gradient, and no other" + (f" (it names {named}, which got theirs)"
                                                    if named else ""))
    _check_after_error(runs, size)


def _check_after_error(runs, size):
    """The step after the error (every parameter used again) trains like steps 0 and 2 of
    single-process SGD: the counters were reset before raising."""
    after = ref.UNUSED_AT + 1
    for rank, run in enumerate(runs):
        late = [e for e in run["errors"] if e[0] > ref.UNUSED_AT]
        if late:
            fail("buckets-after-error", f"rank {rank}: after finish_gradient_synchronization() "
                 f"had raised for the skipped layer, the next step (every parameter used) "
                 f"raised {late[0][1]}: {late[0][2]}: reset the counters before raising, so "
                 "that the next backward starts afresh")
    reference = references.reference("branch", runs[0], size, steps=[0, after])
    for rank, run in enumerate(runs):
        out = dict(run, grads=[run["grads"].get(0, {}), run["grads"].get(after, {})])
        verify_numbers(out, reference, rank, size, "BucketDDP(BranchNet()) training, the step "
                       "after the one that raised", "reset the counters before raising, so "
                       "that the next backward starts afresh", "buckets-unused-error", "branch",
                       "buckets-after-error")
    _check_stale(runs, size)


STALE_WHAT = {
    "zeroed": "after zero_grad(set_to_none=False) (every p.grad a zero tensor, not None)",
    "no_sync": "after a backward inside no_sync() that used the branch (its p.grad holds that "
               "accumulated gradient)"}


def _check_stale(runs, size):
    """The branch skipped while its parameters still hold a gradient from before (after
    ``zero_grad(set_to_none=False)``; after a backward inside ``no_sync()`` that used it):
    "got no gradient in that backward" is not ``p.grad is None``."""
    names, used = list(ref.UNUSED), [n for n, _ in ref.grad_params("branch")
                                     if n not in ref.UNUSED]
    for pattern in STALE:
        for rank, run in enumerate(runs):
            error = run["stale"].get(pattern)
            what = (f"rank {rank}: BucketDDP(BranchNet()) with {size} ranks, a backward that "
                    f"skipped the layer 'branch' {STALE_WHAT[pattern]}: "
                    "finish_gradient_synchronization() ")
            rule = (f"It must raise RuntimeError naming {names}: every trainable parameter "
                    "that got no gradient in that backward, whatever p.grad held before. Note "
                    "which parameters' hooks fired outside no_sync() since the last call; "
                    "p.grad is None says nothing about this backward")
            if error is None:
                fail("buckets-unused-stale", what + "returned normally: the bucket waiting for "
                     "those gradients was never reduced, its other gradients stayed local and "
                     "an optimizer step would let the replicas drift apart. " + rule)
            kind, message, is_runtime = error
            named = [n for n in used if re.search(rf"\b{re.escape(n)}\b", message)]
            if not is_runtime or any(name not in message for name in names) or named:
                fail("buckets-unused-stale", what + f"raised {kind}: {message!r}. " + rule
                     + (f" (and no other: it names {named}, which got theirs)" if named else ""))


RULES = [  # (case, what a mistaken rule packs, why it is wrong)
    ("buckets-float64", dict(element_size=4), "these are the buckets of 4 bytes per element, "
     "but a float64 parameter takes 8 (numel() * element_size())"),
    ("buckets-exact-cap", dict(over=lambda used, cap: used >= cap), "these are the buckets of "
     "a bucket closed when it REACHES the cap; a parameter joins unless that would take the "
     "bucket's bytes OVER the cap, so a bucket may hold exactly the cap"),
    ("buckets-cap-mib", dict(scale=1e6 / 2 ** 20), "these are the buckets of a cap of "
     "bucket_cap_mb * 10**6 bytes; bucket_cap_mb is in MiB, as in DistributedDataParallel: "
     "the cap is bucket_cap_mb * 1024 * 1024 bytes")]


def _packed(spec, cap, element_size=None, over=None, scale=1):
    extra = {"over": over} if over else {}
    return expected.expected_buckets(spec, cap * scale, element_size, **extra)


def _check_packings(runs, rank):
    """Every run's buckets (``{case: (spec, buckets)}``) against the rule; a mistaken rule is
    named when it explains the buckets of every run (the caps tell the rules apart)."""
    wrong = [(case, spec, got) for case, (spec, got) in runs.items()
             if got != _packed(spec, ref.BUCKET_CAPS[case])]
    if not wrong:
        return
    case, spec, got = wrong[0]
    want, cap = _packed(spec, ref.BUCKET_CAPS[case]), ref.BUCKET_CAPS[case]
    what = (f"rank {rank}: with a {cap}-byte cap (bucket_cap_mb={cap} / 2**20) the buckets of "
            f"{spec_words(spec)} are {got}")
    flat, order = [p for b in got for p in b], [p for b in want for p in b]
    if sorted(flat) != sorted(order):
        fail("buckets-packing", f"{what}; it must hold each parameter that requires a gradient "
                                f"exactly once (frozen ones skipped, a tied one once): {order}")
    if flat != order:
        fail("buckets-packing", f"{what}; expected reverse registration order {order} (the "
                                "order backward produces the gradients, so the first bucket "
                                "fills first)")
    for name, rule, why in RULES:
        if all(got == _packed(spec, ref.BUCKET_CAPS[c], **rule) for c, (spec, got) in
               runs.items()):
            fail(name, f"{what}; expected {want}: {why}")
    fail("buckets-float64" if spec.endswith("64") else "buckets-packing",
         f"{what}; expected {want}: fill each bucket up to the cap (bytes: numel() * "
         "element_size()), start a new one when the next parameter would take it over the "
         "cap, no empty bucket")


def _check_bucket_step(events, buckets, sizes, rank, step, case):
    calls = [(i, e) for i, e in enumerate(events) if e[0] == "coll"]
    ready = {e[1]: i for i, e in enumerate(events) if e[0] == "ready"}
    done = sorted(range(len(buckets)), key=lambda b: max(ready.get(p, -1) for p in buckets[b]))
    numels = [sum(sizes[p] for p in buckets[b]) for b in done]
    if not calls:
        fail(case, f"rank {rank}: BucketDDP made no all_reduce at all in step {step} ("
                   + ("the backward after no_sync()" if step == 0 else "after a complete "
                      "step") + f"), although every gradient arrived; expected one per bucket "
                   f"of {numels} elements. Each backward outside no_sync() counts every "
                   "bucket's gradients from zero: reset the counters in "
                   "finish_gradient_synchronization, and count nothing inside no_sync()")
    if [e[1] for _, e in calls] != ["all_reduce"] * len(buckets) or \
            sorted(e[2] for _, e in calls) != sorted(numels):
        fail(case, f"rank {rank}: BucketDDP made {[e[1:3] for _, e in calls]} in step {step} "
                   f"(collective, elements); expected one all_reduce per bucket of {numels} "
                   "elements, in the order the buckets fill")
    if any(not e[3] for _, e in calls):
        fail("buckets-async", f"rank {rank}: BucketDDP's all_reduce calls are blocking "
                              "(async_op=False): use async_op=True and wait in "
                              "finish_gradient_synchronization")
    end = [e[0] for e in events].index("backward_done")
    for (i, _), b in zip(calls, done):
        full = max(ready[p] for p in buckets[b])
        nxt = min([j for j in ready.values() if j > full] + [end])
        if not full < i < nxt:
            fail("buckets-during-backward", f"rank {rank}: the all_reduce of bucket "
                 f"{buckets[b]} did not start as soon as its last gradient was ready: start it "
                 "in the hook of that last gradient, during backward")
    if any(e[0] == "wait" and i < end for i, e in enumerate(events)):
        fail("buckets-async", f"rank {rank}: BucketDDP waited for an all_reduce during "
                              "backward: wait only in finish_gradient_synchronization")
