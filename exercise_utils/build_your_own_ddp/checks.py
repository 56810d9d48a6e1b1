"""Checkers of notebook 06 (build your own DDP), one per graded stage of ``work/06_myddp.py``.

``check_api`` (``init``, ``partition_dataset``, ``broadcast_parameters``,
``DistributedOptimizer``), ``check_naive`` (``allreduce_naive``) and ``check_flat``
(``allreduce_flat``) are here; ``check_overlap`` (``OverlapDDP``) and ``check_buckets``
(``BucketDDP``) are in :mod:`.checks_overlap`. Every stage is probed in one launch per world
size: 2 ranks started like torchrun starts them (``RANK``, ``WORLD_SIZE``) and 3 ranks under
``mpiexec`` (``PMI_RANK``, ``PMI_SIZE``); see :mod:`.probes`. The results are kept per file content,
so the five checks of an unchanged file cost two launches. When a launch fails (a crash or a
hang), the stage it was in keeps that error and the other stages run again without it, so one
broken stage costs only its own points.

Numbers: after several SGD steps every rank's parameters equal single-process training on
the combined batch (:func:`.reference.replay`; tolerance 2e-5 + 2e-4|x|),
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

from ..harness import HANG_AFTER, assert_close, run_ranks
from . import probes
from . import reference as ref

TIMEOUT = HANG_AFTER     # seconds without progress before a launch is a hang (harness)


GLOO_TIMEOUT = 20            # seconds a collective waits before gloo raises


WORLDS = ((2, "none", "torchrun-style environment: RANK, WORLD_SIZE"),
          (3, "mpi", "mpiexec: PMI_RANK, PMI_SIZE"))


ATOL, RTOL = 2e-5, 2e-4


_CACHE = {}                  # (file digest, world size) -> launch outcome


# ---------------------------------------------------------------- launching, caching
def stage_results(path, stage, timeout):
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
            todo = [s for s in probes.STAGES if s not in entry["results"] and s not in
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
            res = run_ranks(path, probes.probe, size, backend,
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
    order = [s.split(":")[0] for s in done.values() if s.split(":")[0] in probes.STAGES]
    where = min(order, key=probes.STAGES.index) if order else "api"
    return where, (f"\nRanks issued different collectives? When this happened the ranks were "
                   f"in stages {[done.get(r, '?') for r in range(size)]} (rank 0, 1, ...): "
                   "every rank must make the same collective calls, in the same order")


def _context(where):
    if where == "buckets:bn":
        return (f"\n(while checking BucketDDP(BNNet(), bucket_cap_mb={ref.BUCKET_CAPS['bn']} "
                f"/ 2**20), a {ref.BUCKET_CAPS['bn']}-byte cap: its fc1.weight has 640 bytes; a "
                f"parameter larger than the cap must get a bucket of its own)")
    return f"\n(while checking stage '{where.split(':')[0]}' of your file)"


def raise_if_todo(res, path):
    for out in res:
        todo = (out.get("init") or {}).get("todo") or out.get("todo")
        if todo:
            raise AssertionError(f"not implemented yet: {todo} in {path} still raises "
                                 f"NotImplementedError. Replace the `raise` line with your "
                                 f"code, then run the %%writefile cell again.")


# ---------------------------------------------------------------- numbers
def verify_numbers(out, reference, rank, size, what, hint):
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
    assert_close({k: final[k] for k in params}, params, f"parameters after {ref.STEPS} steps "
                 f"of {what} with {size} ranks must equal single-process SGD on the combined "
                 f"batch. {hint}", rank, ATOL, RTOL)
    assert_close({k: final[k] for k in buffers[rank]}, buffers[rank], f"BatchNorm buffers: "
                 f"each rank's running statistics come from its own batches, starting from "
                 f"rank 0's (broadcast); {what} with {size} ranks", rank, ATOL, RTOL)


def verify_broadcast_at_start(res, cls, size):
    want = res[0]["init"]
    for rank, out in enumerate(res):
        assert_close(out["after_init"], want, f"right after {cls}(model) every rank must hold "
                     f"rank 0's parameters and buffers: the ranks were seeded differently on "
                     f"purpose; broadcast them at construction (broadcast_parameters)", rank, 0, 0)


def collective_events(events):
    return [e for e in events if e[0] == "coll"]


# ---------------------------------------------------------------- stage 1
def check_api(path, timeout=TIMEOUT):
    """Check ``init``, ``partition_dataset``, ``broadcast_parameters`` and
    ``DistributedOptimizer`` (2 ranks torchrun-style, 3 ranks under mpiexec)."""
    for size, where, res in stage_results(path, "api", timeout):
        raise_if_todo(res, path)
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
        x, y, _ = ref.dataset()
        for strategy in ("naive", "flat"):
            runs = [out["train"][strategy] for out in res]
            _check_log(runs, strategy)
            steps = [[[(x[idx], y[idx])] for idx in per_step] for per_step in
                     zip(*[run["batches"] for run in runs])]
            reference = ref.replay("bn", runs[0]["init"], steps)
            for rank, run in enumerate(runs):
                verify_numbers(run, reference, rank, size, f"training with DistributedOptimizer("
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
    per_rank, n_steps = ref.GLOBAL_BATCH // size, ref.DATA_SIZE // ref.GLOBAL_BATCH
    call = f"partition_dataset(dataset of {ref.DATA_SIZE}, batch_size={ref.GLOBAL_BATCH})"
    seen = {}
    for rank, out in enumerate(res):
        if out["indivisible"] is not None:
            raise AssertionError(f"rank {rank}: partition_dataset(dataset, batch_size="
                                 f"{ref.GLOBAL_BATCH + 1}) with {size} ranks "
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
    for size, _, res in stage_results(path, kind, timeout):
        raise_if_todo(res, path)
        for name in ("tied", "bn"):
            numels = [n for _, n in ref.grad_params(name)]
            want = sorted(numels) if kind == "naive" else [sum(numels)]
            reference = ref.reference(name, res[0][name], size)
            for rank, out in enumerate(res):
                for events in out[name]["events"]:
                    calls = collective_events(events)
                    got = sorted(c[2] for c in calls) if kind == "naive" else [c[2] for c in calls]
                    if any(c[1] != "all_reduce" for c in calls) or got != want:
                        raise AssertionError(
                            f"rank {rank}: {function} on {type(ref.make_model(name)).__name__}"
                            f"'s {len(numels)} parameters with a gradient made these "
                            f"collectives (name, elements): {[c[1:3] for c in calls]}; expected "
                            + ("one all_reduce per parameter with a gradient (frozen ones, "
                               f"grad None, skipped; a tied one once): sizes {want}"
                               if kind == "naive" else f"exactly one all_reduce of one flat "
                               f"buffer holding all {want[0]} gradient elements"))
                verify_numbers(out[name], reference, rank, size, f"{function} ({name} model)",
                               "Copy the reduced values back into each p.grad" if kind == "flat"
                               else "")
