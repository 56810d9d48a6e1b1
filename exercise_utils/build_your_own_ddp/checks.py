"""Checkers of notebook 06 (build your own DDP), one per graded stage of ``work/06_myddp.py``.

``check_api`` (``init``, ``partition_dataset``, ``broadcast_parameters``,
``DistributedOptimizer``), ``check_naive`` (``allreduce_naive``), ``check_flat``
(``allreduce_flat``), ``check_overlap`` (``OverlapDDP``) and ``check_buckets``
(``BucketDDP``). Every stage is probed in one launch per world size: 2 ranks started like
torchrun starts them (``RANK``, ``WORLD_SIZE``) and 3 ranks under ``mpiexec`` (``PMI_RANK``,
``PMI_SIZE``); see :mod:`exercise_utils.myddp_probe`. The results are kept per file content,
so the five checks of an unchanged file cost two launches. When a launch fails (a crash or a
hang), the stage it was in keeps that error and the other stages run again without it, so one
broken stage costs only its own points.

Numbers: after several SGD steps every rank's parameters equal single-process training on
the combined batch (:func:`~exercise_utils.myddp_probe.replay`; tolerance 2e-5 + 2e-4|x|),
its BatchNorm running statistics equal its own sub-batches' (not synchronised, as in DDP
without SyncBatchNorm). Structure: the collectives of each step (naive: one per parameter
with a gradient; flat: one; buckets: one per bucket), whether communication starts during
backward and without blocking, the bucket packing and order, nothing inside ``no_sync()``.

Used in 06_build_your_own_ddp.
"""
import hashlib
import re
import tempfile
from pathlib import Path

import numpy as np

from . import myddp_probe as mp
from .config import quick
from .harness import assert_close, run_ranks

TIMEOUT = quick(90, 45)      # seconds per launch before it is declared hung
GLOO_TIMEOUT = 20            # seconds a collective waits before gloo raises
WORLDS = ((2, "none", "torchrun-style environment: RANK, WORLD_SIZE"),
          (3, "mpi", "mpiexec: PMI_RANK, PMI_SIZE"))
ATOL, RTOL = 2e-5, 2e-4
_CACHE = {}                  # (file digest, world size) -> launch outcome


# ---------------------------------------------------------------- launching, caching
def _results(path, stage, timeout):
    """Yield ``(size, where, per-rank results of stage)`` for 2 then 3 ranks."""
    path = Path(path)
    if not path.is_file():
        raise AssertionError(f"{path} does not exist: run the %%writefile cell that creates "
                             "it first.")
    digest, failed = hashlib.sha256(path.read_bytes()).hexdigest(), set()
    for size, backend, where in WORLDS:
        entry = _CACHE.setdefault((digest, size), {"results": {}, "errors": {}})
        while stage not in entry["results"]:
            if stage in entry["errors"]:
                error = entry["errors"][stage]
                if " hung: " in error:       # maybe a busy machine: try again next time
                    del entry["errors"][stage]
                raise AssertionError(error)
            todo = [s for s in mp.STAGES if s not in entry["results"] and s not in
                    entry["errors"] and (s == stage or s not in failed)]
            results, errors = _launch(path, size, backend, todo, stage, timeout)
            entry["results"].update(results)
            entry["errors"].update(errors)
        failed |= set(entry["errors"])       # a stage that failed with 2 ranks: not again
        yield size, where, entry["results"][stage]


def _launch(path, size, backend, stages, wanted, timeout):
    """One launch probing ``stages``: ({stage: per-rank results}, {} ) or, when it failed,
    ({}, {the stage that failed: message}) so that the other stages run again without it."""
    with tempfile.TemporaryDirectory(prefix="dtfs-myddp-") as progress:
        try:
            res = run_ranks(path, "exercise_utils.myddp_probe:probe", size, backend,
                            dict(stages=stages, progress=progress,
                                 gloo_timeout=min(GLOO_TIMEOUT, timeout / 2)), timeout,
                            what=f"06_myddp.py with {size} ranks")
        except AssertionError as err:
            where, note = _where_failed(progress, str(err), size)
            failed = where.split(":")[0] if where.split(":")[0] in stages else wanted
            return {}, {failed: f"{err}{note}{_context(where)}"}
    return {s: [r[s] for r in res] for s in stages}, {}


def _where_failed(folder, message, size):
    """Where the launch failed: the stage of the rank that raised, unless its error is a
    consequence of another rank's (a lost connection, a timeout, a hang): then the
    earliest stage any rank was in, where the ranks' collectives began to differ."""
    files = {r: Path(folder) / f"rank{r}" for r in range(size)}
    done = {r: f.read_text() for r, f in files.items() if f.exists()}
    match = re.match(r"rank (\d+) raised", message)
    if match and int(match.group(1)) in done and not re.search(
            r"Connection (reset|closed)|[Tt]imed out|Broken pipe|hung: ", message):
        return done[int(match.group(1))], ""
    order = [s.split(":")[0] for s in done.values() if s.split(":")[0] in mp.STAGES]
    where = min(order, key=mp.STAGES.index) if order else "api"
    return where, (f"\nRanks issued different collectives? When this happened the ranks were "
                   f"in stages {[done.get(r, '?') for r in range(size)]} (rank 0, 1, ...): "
                   "every rank must make the same collective calls, in the same order")


def _context(where):
    if where == "buckets:bn":
        return (f"\n(while checking BucketDDP(BNNet(), bucket_cap_mb={mp.BUCKET_CAPS['bn']} "
                f"/ 2**20), a {mp.BUCKET_CAPS['bn']}-byte cap: its fc1.weight has 640 bytes; a "
                f"parameter larger than the cap must get a bucket of its own)")
    return f"\n(while checking stage '{where.split(':')[0]}' of your file)"


def _todo(res, path):
    for out in res:
        todo = (out.get("init") or {}).get("todo") or out.get("todo")
        if todo:
            raise AssertionError(f"not implemented yet: {todo} in {path} still raises "
                                 f"NotImplementedError. Replace the `raise` line with your "
                                 f"code, then run the %%writefile cell again.")


# ---------------------------------------------------------------- numbers
def _check_numbers(out, reference, rank, size, what, hint):
    """Gradients of the first step (sum-instead-of-average detected), then the final state."""
    params, buffers, grads = reference
    if out.get("grads") is not None:
        for name, want in grads.items():
            got = out["grads"].get(name)
            if got is None or np.allclose(got, want, atol=ATOL, rtol=RTOL):
                continue
            diff = float(np.max(np.abs(got - want)))
            if np.allclose(got, size * want, atol=ATOL, rtol=RTOL):
                raise AssertionError(
                    f"rank {rank} differs by {diff:.1e} in the gradient of {name} after {what} "
                    f"with {size} ranks: it is {size} times the average: gradients summed, not "
                    f"averaged? Divide by world_size")
            raise AssertionError(
                f"rank {rank} differs by {diff:.1e} in the gradient of {name} after {what} "
                f"with {size} ranks: every rank must hold the average over ranks of the local "
                f"gradients. {hint}")
    final = out["final"]
    assert_close({k: final[k] for k in params}, params, f"parameters after {mp.STEPS} steps "
                 f"of {what} with {size} ranks must equal single-process SGD on the combined "
                 f"batch. {hint}", rank, ATOL, RTOL)
    assert_close({k: final[k] for k in buffers[rank]}, buffers[rank], f"BatchNorm buffers: "
                 f"each rank's running statistics come from its own batches, starting from "
                 f"rank 0's (broadcast); {what} with {size} ranks", rank, ATOL, RTOL)


def _check_broadcast_at_start(res, cls, size):
    want = res[0]["init"]
    for rank, out in enumerate(res):
        assert_close(out["after_init"], want, f"right after {cls}(model) every rank must hold "
                     f"rank 0's parameters and buffers: the ranks were seeded differently on "
                     f"purpose; broadcast them at construction (broadcast_parameters)", rank, 0, 0)


def _collectives(events):
    return [e for e in events if e[0] == "coll"]


# ---------------------------------------------------------------- stage 1
def check_api(path, timeout=TIMEOUT):
    """Check ``init``, ``partition_dataset``, ``broadcast_parameters`` and
    ``DistributedOptimizer`` (2 ranks torchrun-style, 3 ranks under mpiexec)."""
    for size, where, res in _results(path, "api", timeout):
        _todo(res, path)
        for rank, out in enumerate(res):
            init = out["init"]
            want = [rank, size, "cpu"]
            if init["returned"] != want or not init["initialized"] or init["group"] != want[:2]:
                raise AssertionError(
                    f"rank {rank} of {size} ({where}): init(backend='gloo') returned "
                    f"{tuple(init['returned'])}, process group initialised: {init['initialized']}"
                    f" (rank, size {init['group']}); expected {tuple(want)} and an initialised "
                    f"gloo group: read the rank and size from the launcher's variables")
        _check_broadcast(res, size)
        _check_partition(res, size)
        x, y, _ = mp.dataset()
        for strategy in ("naive", "flat"):
            runs = [out["train"][strategy] for out in res]
            _check_log(runs, strategy)
            steps = [[[(x[idx], y[idx])] for idx in per_step] for per_step in
                     zip(*[run["batches"] for run in runs])]
            reference = mp.replay("bn", runs[0]["init"], steps)
            for rank, run in enumerate(runs):
                _check_numbers(run, reference, rank, size, f"training with DistributedOptimizer("
                               f"strategy='{strategy}') on your partition_dataset's batches",
                               "Broadcast rank 0's model first; step() must average once, "
                               "then call the local optimizer's step")


def _check_broadcast(res, size):
    root = res[0]["broadcast"]["root"]
    for rank, out in enumerate(res):
        b = out["broadcast"]
        assert_close(b["after"], res[root]["broadcast"]["before"], f"after broadcast_parameters("
                     f"model, root={root}) with {size} ranks every rank must hold rank {root}'s "
                     f"parameters and buffers; the ranks were seeded differently on purpose: "
                     f"broadcast each parameter and buffer from root", rank, 0, 0)
        if not b["in_place"]:
            raise AssertionError(f"rank {rank}: broadcast_parameters replaced the model's "
                                 "tensors; copy into them in place (dist.broadcast(p, src=root))"
                                 ", or an optimizer built before would update the old ones")


def _check_partition(res, size):
    per_rank, n_steps = mp.GLOBAL_BATCH // size, mp.DATA_SIZE // mp.GLOBAL_BATCH
    call = f"partition_dataset(dataset of {mp.DATA_SIZE}, batch_size={mp.GLOBAL_BATCH})"
    seen = {}
    for rank, out in enumerate(res):
        if out["indivisible"] is not None:
            raise AssertionError(f"rank {rank}: partition_dataset(dataset, batch_size="
                                 f"{mp.GLOBAL_BATCH + 1}) with {size} ranks "
                                 f"{out['indivisible']}; expected ValueError (not divisible)")
        sizes = [len(b) for b in out["batches"]]
        if out["per_rank"] != per_rank or sizes != [per_rank] * n_steps:
            raise AssertionError(
                f"rank {rank}: {call} with {size} ranks returned per_rank_batch="
                f"{out['per_rank']} and batches of {sizes}; expected {per_rank} and {n_steps} "
                f"batches of {per_rank} on every rank: the global batch stays batch_size, "
                f"every rank runs the same number of steps, the incomplete last one dropped")
        for i in (i for b in out["batches"] for i in b):
            if i in seen:
                raise AssertionError(f"{call} with {size} ranks: example {i} was given to rank "
                                     f"{seen[i]} and to rank {rank}: the shares must be disjoint "
                                     "parts of ONE shuffled order (the same seed on every rank)")
            seen[i] = rank
    order = [i for out in res for b in out["batches"] for i in b]
    if order == sorted(order):
        raise AssertionError(f"{call}: the examples come in their original order: shuffle")


def _check_log(runs, strategy):
    want = ["optimizer.zero_grad", "backward", f"{strategy} of 6 gradients", "optimizer.step"]
    for rank, run in enumerate(runs):
        steps = len(run["batches"])
        if run["log"] != want * steps:
            raise AssertionError(
                f"rank {rank}: with DistributedOptimizer(opt, model, strategy='{strategy}') "
                f"the calls per step were {run['log'][:6]}...; expected {want} every step: "
                f"zero_grad passes through, step() calls the strategy's function "
                f"(_reduce_function) once on the model's parameters, then optimizer.step()")


# ---------------------------------------------------------------- stages 2 and 3
def check_naive(path, timeout=TIMEOUT):
    """Check ``allreduce_naive``: one all_reduce per parameter with a gradient; averages."""
    _check_reduce(path, timeout, "naive")


def check_flat(path, timeout=TIMEOUT):
    """Check ``allreduce_flat``: one all_reduce of every gradient element; averages."""
    _check_reduce(path, timeout, "flat")


def _check_reduce(path, timeout, kind):
    function = f"allreduce_{kind}"
    for size, _, res in _results(path, kind, timeout):
        _todo(res, path)
        for name in ("tied", "bn"):
            numels = [n for _, n in mp.grad_params(name)]
            want = sorted(numels) if kind == "naive" else [sum(numels)]
            reference = mp.reference(name, res[0][name], size)
            for rank, out in enumerate(res):
                for events in out[name]["events"]:
                    calls = _collectives(events)
                    got = sorted(c[2] for c in calls) if kind == "naive" else [c[2] for c in calls]
                    if any(c[1] != "all_reduce" for c in calls) or got != want:
                        raise AssertionError(
                            f"rank {rank}: {function} on {type(mp.make_model(name)).__name__}"
                            f"'s {len(numels)} parameters with a gradient made these "
                            f"collectives (name, elements): {[c[1:3] for c in calls]}; expected "
                            + ("one all_reduce per parameter with a gradient (frozen ones, "
                               f"grad None, skipped; a tied one once): sizes {want}"
                               if kind == "naive" else f"exactly one all_reduce of one flat "
                               f"buffer holding all {want[0]} gradient elements"))
                _check_numbers(out[name], reference, rank, size, f"{function} ({name} model)",
                               "Copy the reduced values back into each p.grad" if kind == "flat"
                               else "")


# ---------------------------------------------------------------- stage 4
def check_overlap(path, timeout=TIMEOUT):
    """Check ``OverlapDDP``: broadcast at construction, async all_reduce per parameter
    started during backward, waited for only in ``finish_gradient_synchronization``."""
    for size, _, res in _results(path, "overlap", timeout):
        _todo(res, path)
        for name in ("tied", "bn"):
            runs = [out[name] for out in res]
            _check_broadcast_at_start(runs, "OverlapDDP", size)
            n = len(mp.grad_params(name))
            for rank, run in enumerate(runs):
                for events in run["events"]:
                    _check_overlap_step(events, rank, n)
                _check_numbers(run, mp.reference(name, runs[0], size), rank, size,
                               f"OverlapDDP training ({name} model)",
                               "finish_gradient_synchronization must wait for every handle, "
                               "then divide by world_size")


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
    for size, _, res in _results(path, "buckets", timeout):
        _todo(res, path)
        for name in ("tied", "bn"):
            runs = [out[name] for out in res]
            want = mp.expected_buckets(name)
            for rank, run in enumerate(runs):
                _check_packing(run["buckets"], want, name, rank)
            _check_broadcast_at_start(runs, "BucketDDP", size)
            sizes = dict(mp.grad_params(name))
            for rank, run in enumerate(runs):
                for step, events in enumerate(run["events"]):
                    if step == 0:
                        cut = events.index(("no_sync_end",))
                        inside = _collectives(events[:cut])
                        if inside:
                            raise AssertionError(
                                f"rank {rank}: a backward inside BucketDDP.no_sync() launched "
                                f"{[c[1:3] for c in inside]}: no communication there, the "
                                "gradients only accumulate (the next backward reduces them)")
                        events = events[cut:]
                    _check_bucket_step(events, run["buckets"], sizes, rank)
                _check_numbers(run, mp.reference(name, runs[0], size, True), rank, size,
                               f"BucketDDP training ({name} model, first step accumulated "
                               "over two backward passes, one inside no_sync)",
                               "finish_gradient_synchronization must wait, divide by "
                               "world_size and copy each bucket back into the gradients")


def _check_packing(got, want, name, rank):
    flat, order = [p for b in got for p in b], [p for b in want for p in b]
    what = (f"rank {rank}: with a {mp.BUCKET_CAPS[name]}-byte cap (bucket_cap_mb="
            f"{mp.BUCKET_CAPS[name]} / 2**20) the buckets of "
            f"{type(mp.make_model(name)).__name__} are {got}")
    if sorted(flat) != sorted(order):
        raise AssertionError(f"{what}; it must hold each parameter that requires a gradient "
                             f"exactly once (frozen ones skipped, a tied one once): {order}")
    if flat != order:
        raise AssertionError(f"{what}; expected reverse registration order {order} (the order "
                             "backward produces the gradients, so the first bucket fills first)")
    sizes = dict(mp.grad_params(name))
    over = [b for b in got if len(b) > 1 and 4 * sum(sizes[p] for p in b) > mp.BUCKET_CAPS[name]]
    if len(got) != len(want) or any(not b for b in got) or over:
        raise AssertionError(f"{what}; expected {want}: fill each bucket up to the cap, start a "
                             "new one when the next parameter would exceed it, no empty bucket")


def _check_bucket_step(events, buckets, sizes, rank):
    calls = [(i, e) for i, e in enumerate(events) if e[0] == "coll"]
    ready = {e[1]: i for i, e in enumerate(events) if e[0] == "ready"}
    done = sorted(range(len(buckets)), key=lambda b: max(ready.get(p, -1) for p in buckets[b]))
    numels = [sum(sizes[p] for p in buckets[b]) for b in done]
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
