"""Checkers of notebook 06 (build your own DDP), one per graded stage of ``work/06_myddp.py``.

``check_api`` (``init``, ``partition_dataset``, ``broadcast_parameters``,
``DistributedOptimizer``), ``check_naive`` (``allreduce_naive``) and ``check_flat``
(``allreduce_flat``) are here; ``check_overlap`` (``OverlapDDP``) and ``check_buckets``
(``BucketDDP``) are in :mod:`.checks_overlap`. Every stage is probed in one launch per world
size: 2 ranks started like torchrun starts them (``RANK``, ``WORLD_SIZE``) and 3 ranks under
``mpiexec`` (``PMI_RANK``, ``PMI_SIZE``), kept per file content (:mod:`.launches`; what runs
in the ranks: :mod:`.probes`, :mod:`.probes_grad`), many cases per launch; ``init`` also runs
in simulated jobs of every launcher at 1 to 4 processes (:mod:`.probes_init`, one lone launch).

Numbers: after several SGD steps every rank's gradients (each step) and parameters equal
single-process training on the combined batch (:func:`.references.replay`; tolerance 2e-5 +
2e-4|x| in float32, 1e-12 + 1e-9|x| in float64: a float64 gradient that went through float32
fails), its BatchNorm running statistics equal its own sub-batches' (not synchronised, as in
DDP without SyncBatchNorm). Structure: the collectives of each step (naive: one per parameter
with a gradient; flat: one; buckets: one per bucket), whether communication starts during
backward and without blocking, the bucket packing and order, nothing inside ``no_sync()``.
On the wire (at grading: :func:`~exercise_utils.harness.observing`): each stage runs in launches
of its own, its ranks on the hosts of a mesh, and the bytes the kernel counted on all links
must lie within what the stage's calls put there (:mod:`.wire`; case ``"<stage>-wire"``):
communication the recorder in the ranks missed (a ProcessGroup method kept from before it
watched) shows there. Right files send 77-90% of the most with 2 ranks.
Every failure names the case of the contract (:mod:`.requirements`) it breaks.

Used in 06_build_your_own_ddp.
"""
import numpy as np

from ..contract import CheckFailure, fail
from ..harness import check
from ..compare import assert_close
from ..notebook_files import unimplemented
from ..notebook_files import unwritten as unwritten_message
from . import reference as ref
from . import references
from .checks_api import verify_closure_loss, verify_log, verify_init, verify_main_init
from .launches import TIMEOUT, raise_if_todo, stage_results
from .probes import BROADCAST_CASES, OPTIMIZER_CASES
from .probes_grad import REDUCE_CASES

TOLERANCE = {"float32": (2e-5, 2e-4), "float64": (1e-12, 1e-9)}


def tolerance(spec):
    return TOLERANCE["float64" if spec.endswith("64") else "float32"]


# ---------------------------------------------------------------- numbers
def verify_numbers(out, reference, rank, size, what, hint, case, spec, later_case=None):
    """Each step's gradients (sum-instead-of-average detected; steps after the first charged
    to ``later_case``), then the final parameters (dtype kept) and BatchNorm buffers."""
    params, buffers, grads = reference
    atol, rtol = tolerance(spec)
    for step, want in enumerate(grads):
        got_step = out["grads"][step] if step < len(out["grads"]) else {}
        charged = case if step == 0 else (later_case or case)
        for name, expected in want.items():
            got = got_step.get(name)
            if got is None:
                fail(charged, f"rank {rank}: after {what} with {size} ranks, {name} has no "
                              f"gradient in step {step}. {hint}")
            if np.allclose(got, expected, atol=atol, rtol=rtol) and got.dtype == expected.dtype:
                continue
            if got.dtype != expected.dtype:
                fail(charged, f"rank {rank}: the gradient of {name} is {got.dtype}, expected "
                              f"{expected.dtype} ({what}): keep the gradients' dtype")
            diff = float(np.max(np.abs(got - expected)))
            steps = "" if step == 0 else (f" in step {step} (step 0 was right: state left "
                                          "over from the previous step?)")
            if np.allclose(got, size * expected, atol=atol, rtol=rtol):
                fail(charged, f"rank {rank} differs by {diff:.1e} in the gradient of {name}"
                              f"{steps} after {what} with {size} ranks: it is {size} times the "
                              f"average: gradients summed, not averaged? Divide by world_size")
            fail(charged, f"rank {rank} differs by {diff:.1e} in the gradient of {name}{steps} "
                          f"after {what} with {size} ranks (tolerance {atol:g} + "
                          f"{rtol:g}*|expected|): every rank must hold the average over ranks "
                          f"of the local gradients. {hint}")
    final = out["final"]
    assert_close({k: final[k] for k in params}, params, f"parameters after {len(grads)} steps "
                 f"of {what} with {size} ranks must equal single-process SGD on the combined "
                 f"batch. {hint}", rank, atol, rtol, case=later_case or case, dtype=True)
    assert_close({k: final[k] for k in buffers[rank]}, buffers[rank], f"BatchNorm buffers: "
                 f"each rank's running statistics come from its own batches, starting from "
                 f"rank 0's (broadcast); {what} with {size} ranks", rank, atol, rtol,
                 case=later_case or case, dtype=True)


def spec_words(spec):
    return {"plain": "a TinyMLP, float32",
            "branch": "a BranchNet, float32"}.get(spec, (
                f"an EdgeNet in {'float64' if spec.endswith('64') else 'float32'}: tied, "
                f"frozen, transposed and 0-d parameters, BatchNorm"
                + (", a trainable layer the forward never uses" if "unused" in spec else "")))


def verify_broadcast_at_start(res, cls, size, case):
    want = res[0]["init"]
    for rank, out in enumerate(res):
        assert_close(out["after_init"], want, f"right after {cls}(model) every rank must hold "
                     f"rank 0's parameters and buffers: the ranks were seeded differently on "
                     f"purpose; broadcast them at construction (broadcast_parameters)", rank,
                     0, 0, case=case, dtype=True)


def collective_events(events):
    return [e for e in events if e[0] == "coll"]


# ---------------------------------------------------------------- stage 1
@check
def check_api(path, timeout=TIMEOUT):
    """Check ``init`` (every launcher, 1 to 4 processes, the backend and device, a second
    call), then ``partition_dataset``, ``broadcast_parameters`` and ``DistributedOptimizer``
    (2 ranks torchrun-style, 3 ranks under mpiexec); on the wire, the broadcasts and the
    check's own averaging (``api-wire``). Piece by piece, in the notebook's order (issue 39):
    every finished piece is judged (the ranks join the group themselves where ``init`` is not
    written yet); the pieces still raising NotImplementedError are named at the end, with
    those that passed."""
    todo = [] if verify_init(path, timeout) else ["init"]
    batches, passed = {}, ["init"] if not todo else []
    for size, where, res in stage_results(path, "api", timeout):
        raise_if_todo([{"todo": out.get("todo")} for out in res], path)   # (init: above)
        unwritten = {k: v for out in res for k, v in out.get("unwritten", {}).items()}
        todo = list(dict.fromkeys(todo + list(unwritten.values())))
        if not todo or todo[0] != "init":
            verify_main_init(res, size, where)
        if "partition" not in unwritten:
            _check_partition(res, size)
            batches[size] = [sorted(i for out in res for i in out["batches"][k])
                             for k in range(len(res[0]["batches"]))]
            _check_same_steps(batches)
            _check_seed(res)
        if "broadcast" not in unwritten:
            _check_broadcast(res, size)
        if not unwritten:
            _check_training(res, size)
    if todo:
        passed += [name for name, piece in API_PIECES if piece not in unwritten]
        later = [name for name in unimplemented(path) if name not in todo]
        raise CheckFailure("not implemented yet: " + unwritten_message(
            todo, path, later, passed="Finished and passing with 2 and 3 ranks: "
            f"{', '.join(passed)}." if passed else ""))


# the API's pieces after init, in the notebook's order: (name, the probe's piece)
API_PIECES = (("partition_dataset", "partition"), ("broadcast_parameters", "broadcast"),
              ("DistributedOptimizer", "train"))


def _check_training(res, size):
    """Training with DistributedOptimizer on partition_dataset's batches, every strategy."""
    x, y, _ = ref.dataset()
    for case, strategy, how in OPTIMIZER_CASES:
        runs = [out["train"][case] for out in res]
        verify_log(runs, case, strategy, how)
        steps = [[[(x[idx], y[idx])] for idx in per_step] for per_step in
                 zip(*[run["batches"] for run in runs])]
        reference = references.replay("edge", runs[0]["init"], steps)
        for rank, run in enumerate(runs):
            verify_numbers(run, reference, rank, size, f"training with DistributedOptimizer("
                           f"strategy={strategy!r}) on your partition_dataset's batches"
                           + (", step(closure)" if how == "closure" else ""),
                           "Broadcast rank 0's model first; step() must average once, "
                           "then call the local optimizer's step", case, "edge")
            if how == "closure":
                verify_closure_loss(run, rank)


def _check_broadcast(res, size):
    for i, (case, _, spec) in enumerate(BROADCAST_CASES):
        root = res[0]["broadcast"][i]["root"]
        want = res[root]["broadcast"][i]["before"]
        params = {n for n, _ in ref.make_model(spec).named_parameters()}
        ints = {k for k, v in want.items() if v.dtype.kind in "iu"}
        what = (f"after broadcast_parameters(model, root={root}) with {size} ranks and "
                f"{spec_words(spec)}, every rank must hold rank {root}'s parameters and buffers "
                f"(the ranks were seeded differently on purpose)")
        for rank, out in enumerate(res):
            b = out["broadcast"][i]
            part = lambda d, keys: {k: d[k] for k in keys}   # noqa: E731
            assert_close(part(b["after"], params), part(want, params), what, rank, 0, 0,
                         case=case, dtype=True)
            floats = set(want) - params - ints
            assert_close(part(b["after"], floats), part(want, floats), what + ": buffers too",
                         rank, 0, 0, case="bcast-buffers" if case == "bcast-values" else case,
                         dtype=True)
            assert_close(part(b["after"], ints), part(want, ints), what + " (integer buffers "
                         "exactly: BatchNorm's counter is above 2**24, never send it through a "
                         "float32 buffer)", rank, 0, 0, case="bcast-int-buffer", dtype=True)
            if not b["in_place"]:
                fail("bcast-in-place", f"rank {rank}: broadcast_parameters replaced the model's "
                     "tensors; copy into them in place (dist.broadcast(t, src=root)), or an "
                     "optimizer built before would update the old ones")


def _check_partition(res, size):
    per_rank, n_steps = ref.GLOBAL_BATCH // size, ref.DATA_SIZE // ref.GLOBAL_BATCH
    call = f"partition_dataset(dataset of {ref.DATA_SIZE}, batch_size={ref.GLOBAL_BATCH})"
    for rank, out in enumerate(res):
        if out["indivisible"] is not None:
            fail("partition-indivisible", f"rank {rank}: partition_dataset(dataset, batch_size="
                 f"{ref.GLOBAL_BATCH + 1}) with {size} ranks {out['indivisible']}; expected "
                 f"ValueError (not divisible)")
    seen = {}
    for rank, out in enumerate(res):
        sizes = [len(b) for b in out["batches"]]
        if out["per_rank"] != per_rank or sizes != [per_rank] * n_steps:
            fail("partition-sizes",
                 f"rank {rank}: {call} with {size} ranks returned per_rank_batch="
                 f"{out['per_rank']} and batches of {sizes}; expected {per_rank} and {n_steps} "
                 f"batches of {per_rank} on every rank ({ref.DATA_SIZE} // {ref.GLOBAL_BATCH}): "
                 f"the global batch stays batch_size, every rank runs the same number of steps, "
                 f"the incomplete last one dropped (a sampler that pads the shares with repeated "
                 f"examples yields one step too many)")
        for i in (i for b in out["batches"] for i in b):
            if i in seen:
                fail("partition-disjoint", f"{call} with {size} ranks: example {i} was given to "
                     f"rank {seen[i]} and to rank {rank}: the shares must be disjoint parts of "
                     "ONE shuffled order (the same seed on every rank)")
            seen[i] = rank
    steps = [sorted(i for out in res for i in out["batches"][k]) for k in range(n_steps)]
    if steps == [list(range(k * ref.GLOBAL_BATCH, (k + 1) * ref.GLOBAL_BATCH))
                 for k in range(n_steps)]:
        fail("partition-shuffled", f"{call} with {size} ranks: step k trains on the examples "
                                   f"k * {ref.GLOBAL_BATCH} to (k + 1) * {ref.GLOBAL_BATCH} - 1 "
                                   "of the dataset in its original order: shuffle (one order "
                                   "drawn from seed, the same on every rank)")


def _check_same_steps(steps):
    """Step k trains on the same global batch with 2 ranks as with 3 (the same positions of
    one shuffled order that depends only on the seed)."""
    (first, want), (size, got) = min(steps.items()), max(steps.items())
    for k, (a, b) in enumerate(zip(want, got)):
        if a != b:
            fail("partition-same-steps",
                 f"partition_dataset(dataset of {ref.DATA_SIZE}, batch_size={ref.GLOBAL_BATCH}, "
                 f"seed=0): step {k} trained on the examples {a} with {first} ranks, but on {b} "
                 f"with {size} ranks. Step k must train on the examples at positions "
                 f"k * batch_size to (k + 1) * batch_size - 1 of one shuffled order that depends "
                 f"only on the seed, whatever the number of ranks (DistributedSampler: rank r "
                 f"takes the positions r, r + world_size, ...); a contiguous block of the order "
                 f"per rank changes the steps when ranks are added")


def _check_seed(res):
    for rank, out in enumerate(res):
        if out["batches"] == out["seed1"]:
            fail("partition-seed",
                 f"rank {rank}: partition_dataset(dataset, batch_size={ref.GLOBAL_BATCH}, seed=0)"
                 f" and partition_dataset(..., seed=1) gave the same batches {out['batches'][:2]}"
                 f"...: the shuffle must be drawn from `seed` (DistributedSampler(..., seed=seed))"
                 f", another seed gives another order")


# ---------------------------------------------------------------- stages 2 and 3
@check
def check_naive(path, timeout=TIMEOUT):
    """Check ``allreduce_naive``: one all_reduce per parameter with a gradient; averages; on
    the wire, those all-reduces and nothing else (``naive-wire``)."""
    _check_reduce(path, timeout, "naive")


@check
def check_flat(path, timeout=TIMEOUT):
    """Check ``allreduce_flat``: one all_reduce of every gradient element; averages; on the
    wire, that all-reduce and nothing else (``flat-wire``)."""
    _check_reduce(path, timeout, "flat")


# every case of allreduce_naive and allreduce_flat, by (stage, what it holds)
_CASE = {("naive", "values"): "naive-values", ("naive", "edge-model"): "naive-edge-model",
         ("naive", "unused"): "naive-unused", ("naive", "float64"): "naive-float64",
         ("naive", "in-place"): "naive-in-place", ("naive", "no-grad"): "naive-no-grad",
         ("flat", "values"): "flat-values", ("flat", "edge-model"): "flat-edge-model",
         ("flat", "unused"): "flat-unused", ("flat", "float64"): "flat-float64",
         ("flat", "in-place"): "flat-in-place", ("flat", "no-grad"): "flat-no-grad"}


def _check_reduce(path, timeout, kind):
    function = f"allreduce_{kind}"
    for size, _, res in stage_results(path, kind, timeout):
        raise_if_todo(res, path)
        for suffix, spec in REDUCE_CASES:
            case, runs = _CASE[kind, suffix], [out[suffix] for out in res]
            what = f"{function} ({spec_words(spec)})"
            numels = [n for _, n in ref.grad_params(spec)]
            with_grad = {n for n, _ in ref.grad_params(spec)}
            without = sorted(n for n, _ in ref.make_model(spec).named_parameters()
                             if n not in with_grad)
            for rank, run in enumerate(runs):
                for step, events in enumerate(run["events"]):
                    _check_no_grad(kind, rank, what, run["none"][step], without)
                    _check_calls(kind, rank, what, collective_events(events), numels)
                    if run["moved"][step]:
                        fail(_CASE[kind, "in-place"], f"rank {rank}: {what} gave "
                             f"{run['moved'][step]} new gradient tensors or storage (p.grad = "
                             "..., p.grad.data = ...); write the averages into the existing "
                             "p.grad in place (p.grad.div_, p.grad.copy_)")
            reference = references.reference(spec, runs[0], size)
            for rank, run in enumerate(runs):
                verify_numbers(run, reference, rank, size, what, "Copy the reduced values back "
                               "into each p.grad" if kind == "flat" else "", case, spec)


def _check_no_grad(kind, rank, what, none, without):
    if none != without:
        fail(_CASE[kind, "no-grad"], f"rank {rank}: after {what} the parameters without a gradient "
             f"were {none}, expected {without}: a parameter whose grad is None (frozen, or "
             "unused in this backward) is skipped, its grad stays None (a zero gradient would "
             "cost bytes and let weight decay or momentum move it)")


def _check_calls(kind, rank, what, calls, numels):
    want = sorted(numels) if kind == "naive" else [sum(numels)]
    got = sorted(c[2] for c in calls) if kind == "naive" else [c[2] for c in calls]
    if any(c[1] != "all_reduce" for c in calls) or got != want:
        fail("naive-calls" if kind == "naive" else "flat-one-buffer",
             f"rank {rank}: {what}: {len(numels)} parameters have a gradient, and your "
             f"function made these collectives (name, elements): {[c[1:3] for c in calls]}; "
             "expected " + ("one all_reduce per parameter with a gradient (frozen ones, grad "
                            f"None, skipped; a tied one once): sizes {want}" if kind == "naive"
                            else f"exactly one all_reduce of one flat buffer holding all "
                                 f"{want[0]} gradient elements"))
