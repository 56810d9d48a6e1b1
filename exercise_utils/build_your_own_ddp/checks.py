"""Checkers of notebook 06 (build your own DDP), one per graded stage of ``work/06_myddp.py``.

``check_api`` (``init``, ``partition_dataset``, ``broadcast_parameters``,
``DistributedOptimizer``), ``check_naive`` (``allreduce_naive``) and ``check_flat``
(``allreduce_flat``) are here; ``check_overlap`` (``OverlapDDP``) and ``check_buckets``
(``BucketDDP``) are in :mod:`.checks_overlap`. Every stage is probed in one launch per world
size: 2 ranks started like torchrun starts them (``RANK``, ``WORLD_SIZE``) and 3 ranks under
``mpiexec`` (``PMI_RANK``, ``PMI_SIZE``), kept per file content (:mod:`.launches`; what runs
in the ranks: :mod:`.probes`).

Numbers: after several SGD steps every rank's parameters equal single-process training on
the combined batch (:func:`.reference.replay`; tolerance 2e-5 + 2e-4|x|),
its BatchNorm running statistics equal its own sub-batches' (not synchronised, as in DDP
without SyncBatchNorm). Structure: the collectives of each step (naive: one per parameter
with a gradient; flat: one; buckets: one per bucket), whether communication starts during
backward and without blocking, the bucket packing and order, nothing inside ``no_sync()``.

Used in 06_build_your_own_ddp.
"""
import numpy as np

from ..harness import assert_close
from . import reference as ref
from .launches import TIMEOUT, raise_if_todo, stage_results

ATOL, RTOL = 2e-5, 2e-4


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
    batches = {}                 # world size -> the global batch of each step (seed 0)
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
        batches[size] = [sorted(i for out in res for i in out["batches"][k])
                         for k in range(len(res[0]["batches"]))]
        _check_same_steps(batches)
        _check_seed(res)
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


def _check_same_steps(steps):
    """Step k trains on the same global batch with 2 ranks as with 3 (the same positions of
    one shuffled order that depends only on the seed)."""
    (first, want), (size, got) = min(steps.items()), max(steps.items())
    for k, (a, b) in enumerate(zip(want, got)):
        if a != b:
            raise AssertionError(
                f"partition_dataset(dataset of {ref.DATA_SIZE}, batch_size={ref.GLOBAL_BATCH}, "
                f"seed=0): step {k} trained on the examples {a} with {first} ranks, but on {b} "
                f"with {size} ranks. Step k must train on the examples at positions "
                f"k * batch_size to (k + 1) * batch_size - 1 of one shuffled order that depends "
                f"only on the seed, whatever the number of ranks (DistributedSampler: rank r "
                f"takes the positions r, r + world_size, ...); a contiguous block of the order "
                f"per rank changes the steps when ranks are added")


def _check_seed(res):
    for rank, out in enumerate(res):
        if "train" in out and out["batches"] == out["train"]["naive"]["batches"]:
            raise AssertionError(
                f"rank {rank}: partition_dataset(dataset, batch_size={ref.GLOBAL_BATCH}, seed=0)"
                f" and partition_dataset(..., seed=1) gave the same batches {out['batches'][:2]}"
                f"...: the shuffle must be drawn from `seed` (DistributedSampler(..., seed=seed))"
                f", another seed gives another order")


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
