"""Checkers of notebook 01 (MPI parallel SGD).

Each ``check_*(path)`` (``check_convergence``: :mod:`.checks_convergence`, imported here for
the CHECK cell) runs the student file in fresh MPI processes through
:func:`exercise_utils.harness.run_ranks` (the probes of :mod:`.probes` run there, many cases
per launch), computes its own reference, and raises
:class:`~exercise_utils.contract.CheckFailure` (an ``AssertionError``) naming the case of the
contract (:mod:`.requirements`) that found the problem, with a message the student can act on.

Launches of 2 or more ranks are salted (``run_ranks(..., salts=salts)``: at grading and with
``DTFS_SALT=1``): each rank's inputs (:mod:`.inputs`) derive from a number only it and the judge
know, and the judge builds every expected value from the salts, never from a rank's report of
its inputs. Elsewhere ``salts`` stays empty and the inputs are the fixed ones.

Where links are observed (at grading) those launches also run one large case more and the bytes
all links carried, counted by the kernel outside the ranks, must be what the calls the contract
allows put there (:mod:`.wire`: ``scatter-wire``, ``bcast-wire``, ``sgd-wire``,
``average-wire``).

Used in 01_mpi_parallel_sgd.
"""
import numpy as np

from ..contract import fail
from ..harness import HANG_AFTER, check, run_ranks
from ..compare import assert_close, held_by, state_arrays
from ..integrity import VIOLATION
from . import probes, wire
from .checks_convergence import check_convergence, reference_converged  # noqa: F401
from .inputs import SGD_STEPS, average_model, bcast_model, hidden_of, scatter_data, sgd_batches
from .probes import (AVERAGE_CASES, BROADCAST_CASES, NO_GRAD, SCATTER_CASES, SGD_CASES,
                     bounds_cases, params_arrays, sgd_model, sgd_run)

TIMEOUT = HANG_AFTER     # seconds without progress before a launch is a hang (harness)
TIGHT = {"float32": (1e-5, 1e-4), "float64": (1e-12, 1e-10)}   # atol, rtol per dtype: float64
#                                   results must not have passed through float32 on the way


# ---------------------------------------------------------------- shards + scatter
def reference_bounds(n, size):
    """The reference shards: contiguous, rank order, the first n % size one sample larger."""
    base, extra = divmod(n, size)
    stops = np.cumsum([base + (r < extra) for r in range(size)], dtype=np.int64)
    return [[int(stop - base - (r < extra)), int(stop)] for r, stop in enumerate(stops)]


def _check_bounds(cases, results):
    """Every case's bounds, most basic violation first (a crash, the count, the tiling), then
    the sizes, then their order; the smallest failing case is the one named."""
    for (n, size), bounds in zip(cases, results):
        call = f"shard_bounds({n}, {size})"
        if isinstance(bounds, dict):
            fail("bounds-tile", f"{call} raised {bounds['raised']}; it must work for any size, "
                                f"also size > n_samples (empty shards) and n_samples = 0")
        if len(bounds) != size:
            fail("bounds-count", f"{call} returned {len(bounds)} shards; expected one (start, "
                                 f"stop) pair per rank ({size}), empty ones included")
        tiles = [a for a, _ in bounds] == [0] + [b for _, b in bounds[:-1]] and \
            bounds[-1][1] == n and all(a <= b for a, b in bounds)
        if not tiles:
            fail("bounds-tile", f"{call} returned {bounds}: the pairs must tile range({n}) in "
                                f"rank order (each starts where the previous one stopped, the "
                                f"first at 0, the last stops at {n}): no sample dropped or "
                                f"repeated")
    for (n, size), bounds in zip(cases, results):
        sizes = [b - a for a, b in bounds]
        if max(sizes) - min(sizes) > 1:
            fail("bounds-sizes", f"shard_bounds({n}, {size}) gives shard sizes {sizes}: sizes "
                                 f"may differ by at most one (spread the remainder over the "
                                 f"first ranks)")
    for (n, size), bounds in zip(cases, results):
        expected = reference_bounds(n, size)
        if bounds != expected:
            fail("bounds-larger-first", f"shard_bounds({n}, {size}) returned {bounds}; the first "
                                        f"{n % size} rank(s) get the one extra sample, like "
                                        f"numpy.array_split: {expected}")


@check
def check_shards(path, timeout=TIMEOUT):
    """Check ``shard_bounds`` (many sizes) and ``scatter_shards`` (world sizes 3 and 2, every
    root, float32 and float64, one or more feature dimensions, empty shards; the root's
    dataset salted)."""
    [bounds] = run_ranks(path, probes.probe_bounds, 1, "none", timeout=timeout,
                         case="bounds-tile", what="shard_bounds")
    _check_bounds(bounds_cases(), bounds)
    for size, cases in SCATTER_CASES.items():
        salts, links = {}, {}  # (at grading the root's dataset derives from a number only it knows)
        cases = cases + wire.cases("scatter")
        shards = run_ranks(path, probes.probe_scatter, size, "mpi", {"cases": cases}, timeout,
                           case="scatter-shard", what="scatter_shards", salts=salts, links=links)
        for i, (case, n, root, dtype, shape) in enumerate(cases):
            x, y = scatter_data(n, dtype, shape, salts.get(root, 0))
            call = (f"scatter_shards with {size} ranks, {n} samples of shape {shape} ({dtype}), "
                    f"root={root}")
            bounds = reference_bounds(n, size)
            ys = {q: y[a:b].numpy() for q, (a, b) in enumerate(bounds)}
            for rank, (a, b) in enumerate(bounds):
                _check_shard(case, call, rank, shards[rank][i], x[a:b].numpy(), ys)
                _check_received(call, rank, root, shards[rank][i]["received"],
                                shard=(b - a) * (int(np.prod(shape)) + 1), size=size)
        wire.check("scatter", links, size, f"scatter_shards with {size} ranks",
                   wire.scatter_envelope(size, cases))


def _check_shard(case, call, rank, got, xs, all_ys):
    ys = all_ys[rank]
    if got["types"] != [f"torch.{xs.dtype}", f"torch.{ys.dtype}"]:
        fail(case if case in ("scatter-empty", "scatter-float64") else "scatter-type", f"{call}: rank {rank} returned a shard of types {got['types']}; "
                             f"return slices of x and y: torch tensors of x's and y's dtypes "
                             f"(torch.{xs.dtype}, torch.{ys.dtype})")
    if got["y"].shape != ys.shape or not np.array_equal(got["y"], ys):
        fail(case, f"{call}: rank {rank} received samples {got['y'].tolist()}, expected "
                   f"{ys.tolist()}.{held_by(got['y'], all_ys, rank)}")
    assert_close(got["x"], xs, f"{call}: the x shard", rank, 0, 0, case=case)


def _check_received(call, rank, root, received, shard, size):
    """A rank other than root may receive its shard and a little bookkeeping (bounds, counts),
    never the whole dataset."""
    if rank != root and received > shard + 4 * size + 8:
        fail("scatter-received",
             f"{call}: rank {rank} received {received} numbers, but its shard holds only {shard}: "
             f"send every rank only its own shard (e.g. comm.scatter of the pieces on root), "
             f"never the whole dataset to be sliced there (a slice x[a:b] of a tensor is pickled "
             f"with all of x's storage: scatter copies, x[a:b].clone())")


# ---------------------------------------------------------------- broadcast
@check
def check_broadcast(path, timeout=TIMEOUT):
    """Check ``broadcast_parameters``: every rank ends with root's parameters and buffers
    (float32 and float64 models; tied, frozen, transposed and 0-d parameters; BatchNorm's
    statistics and its int64 counter), every root, in place. Every rank's model is salted:
    the root's is built here from its salt, never taken from its report."""
    for size, cases in BROADCAST_CASES.items():
        salts, links = {}, {}  # (at grading each rank's model derives from a number only it knows)
        cases = cases + wire.cases("broadcast")
        res = run_ranks(path, probes.probe_broadcast, size, "mpi", {"cases": cases}, timeout,
                        case="bcast-values", what="broadcast_parameters", salts=salts,
                        links=links)
        for i, (case, root, dtype) in enumerate(cases):
            root_before = state_arrays(bcast_model(root, dtype, salts.get(root, 0),
                                                   hidden_of(case)))
            for rank, (_, after, same) in enumerate(r[i] for r in res):
                what = (f"after broadcast_parameters(comm, model, root={root}) with {size} ranks "
                        f"and a {dtype} model, every rank must hold rank {root}'s parameters and "
                        f"buffers")
                ints = {k for k, v in root_before.items() if v.dtype.kind in "iu"}
                assert_close({k: v for k, v in after.items() if k not in ints},
                             {k: v for k, v in root_before.items() if k not in ints}, what,
                             rank, 0, 0, case=case, dtype=True)
                assert_close({k: after[k] for k in ints}, {k: root_before[k] for k in ints},
                             what + " (integer buffers exactly: never through a float32 buffer)",
                             rank, 0, 0, case="bcast-int-buffer", dtype=True)
                if not same:
                    fail("bcast-in-place",
                         f"rank {rank}: broadcast_parameters replaced the model's tensors instead "
                         f"of copying into them; an optimizer built before the call would still "
                         f"update the old tensors. Copy in place (e.g. Bcast into t.numpy()).")
        wire.check("broadcast", links, size, f"broadcast_parameters with {size} ranks",
                   wire.broadcast_envelope(size, cases))


# ---------------------------------------------------------------- gradient averaging
@check
def check_allreduce_sgd(path, timeout=TIMEOUT):
    """Check ``average_gradients``: equals single-process SGD on the whole batch (float32 and
    float64; frozen, unused, tied, transposed and 0-d parameters; parameters frozen and
    unfrozen from step to step, ``sgd-varying``), one Allreduce a step. Each rank's batches are
    salted (the reference and the likely causes train on the salts')."""
    for size in (2, 3):
        salts, links = {}, {}  # (at grading each rank's rows derive from a number only it knows)
        cases = SGD_CASES + tuple(wire.cases("sgd"))
        res = run_ranks(path, probes.probe_sgd, size, "mpi", {"cases": cases}, timeout,
                        case="sgd-values", what="average_gradients", salts=salts, links=links)
        for i, (case, dtype) in enumerate(cases):
            x, y = sgd_batches(size, dtype, salts)
            wide = hidden_of(case)
            expected = sgd_run(sgd_model(dtype, wide), x, y, vary=probes.vary_of(case))
            numels = probes.step_numels(sgd_model(dtype, wide), case)
            for rank, (state, calls, elements, nones, hidden, sent) in enumerate(
                    r[i] for r in res):
                if hidden:
                    fail("sgd-one-allreduce",
                         f"{VIOLATION}: rank {rank} communicated through MPI.COMM_WORLD itself "
                         f"({hidden}) instead of the `comm` average_gradients was given, where "
                         f"the check counts the calls. Use the comm argument.")
                if nones[0] != NO_GRAD and not probes.vary_of(case):
                    fail("sgd-no-grad",
                         f"rank {rank}: after average_gradients the parameters without a "
                         f"gradient were {nones[0]}, expected {NO_GRAD} (frozen and unused "
                         f"parameters have p.grad None: skip them, do not give them one)")
                if probes.vary_of(case):
                    _check_varying(rank, size, nones, sent, numels, probes.step_no_grad(case))
                _check_one_allreduce(rank, calls, elements, numels)
                atol, rtol = TIGHT[dtype]
                assert_close(state, expected, f"{dtype} parameters after {SGD_STEPS} SGD steps "
                             f"with {size} ranks must equal single-process SGD on the "
                             f"concatenated batch: average (sum / size) the gradients of every "
                             f"rank, in the gradients' own dtype", rank, atol, rtol, case=case,
                             start=state_arrays(sgd_model(dtype, wide)), size=size,
                             mistakes=_mistakes(dtype, size, salts, wide, case))
        wire.check("sgd", links, size, f"average_gradients with {size} ranks",
                   wire.sgd_envelope(size, cases))


def _mistakes(dtype, size, salts, hidden, case=None):
    """The likely causes replayed on a mismatch: SGD on summed and on twice-divided gradients
    (on the batches of ``salts``, the model ``hidden`` wide, as ``case`` varies it)."""
    return {summed(size): lambda: _scaled_sgd(dtype, size, size, salts, hidden, case),
            halved(size): lambda: _scaled_sgd(dtype, size, 1 / size, salts, hidden, case)}


def summed(size):
    """The likely cause named when parameters match SGD on summed gradients."""
    return (f"the parameters are those of SGD on the SUM of the {size} ranks' gradients: "
            f"summed instead of averaged? Divide the sum by the world size.")


def halved(size):
    """The likely cause named when parameters match SGD on the average divided by ``size``."""
    return (f"the parameters are those of SGD on 1/{size} of the average gradient: divided by "
            f"the world size twice (before and after the Allreduce?). Divide the sum once.")


def _scaled_sgd(dtype, size, factor, salts=None, hidden=8, case=None):
    """Single-process SGD with the gradient multiplied by ``factor`` (``size``: a sum of
    averages; ``1 / size``: an average divided again), on the batches of ``salts``."""
    model = sgd_model(dtype, hidden)
    x, y = sgd_batches(size, dtype, salts)

    def scale():
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(factor)
    return sgd_run(model, x, y, scale, probes.vary_of(case))


VARYING = ("Which parameters have a gradient may change from one step to the next (a layer "
           "frozen or unfrozen, a branch the forward skips): look at `p.grad` at every call.")


def _check_varying(rank, size, nones, sent, numels, want):
    """``sgd-varying``: per call, the parameters left without a gradient and the elements the
    Allreduce carried are those of that step (:data:`.probes.VARY_FROZEN`)."""
    for step, (none, got, numel, expected) in enumerate(zip(nones, sent, numels, want)):
        where = (f"rank {rank}, {size} ranks, step {step + 1} of a run in which other "
                 f"parameters are frozen in every step (without a gradient in this step: "
                 f"{expected})")
        if sorted(none) != expected:
            fail("sgd-varying", f"{where}: after average_gradients the parameters without a "
                                f"gradient were {sorted(none)}. The notebook: {VARYING} Leave "
                                f"a .grad that is None as None; average every other one")
        if got != numel:
            fail("sgd-varying", f"{where}: the Allreduce carried {got} elements; the parameters "
                                f"with a gradient in this step hold {numel}. The notebook: "
                                f"{VARYING} A list of parameters (or a buffer laid out for "
                                f"them) kept from an earlier call misses or invents some")


def _check_one_allreduce(rank, calls, elements, numels):
    others = {k: v for k, v in calls.items() if k != "Allreduce"}
    numel = numels[0]
    if calls.get("Allreduce", 0) != SGD_STEPS or others:
        per_step = {k: v / SGD_STEPS for k, v in calls.items()}
        fail("sgd-one-allreduce",
             f"rank {rank}: expected exactly one comm.Allreduce per step (on one flat buffer "
             f"holding all {numel} gradient elements) and no other communication; your code "
             f"made these calls per step: {per_step or 'none (use the comm argument)'}")
    if elements["Allreduce"] != sum(numels):
        fail("sgd-one-allreduce",
             f"rank {rank}: each Allreduce carried {elements['Allreduce'] // SGD_STEPS} elements; "
             f"the flat buffer must hold every gradient element ({numel}: the parameters whose "
             f"p.grad is not None, a tied one once)")


# ---------------------------------------------------------------- model averaging
@check
def check_model_averaging(path, timeout=TIMEOUT):
    """Check ``average_weights``: every rank ends with the mean of all ranks' parameters
    (float32 and float64 models with BatchNorm buffers, frozen and tied parameters; every
    root), in place. Every rank's model is salted: the mean is of the models built here from
    the salts, never of the ranks' reports."""
    for size, cases in AVERAGE_CASES.items():
        salts, links = {}, {}  # (at grading each rank's model derives from a number only it knows)
        cases = cases + wire.cases("average")
        res = run_ranks(path, probes.probe_average, size, "mpi", {"cases": cases}, timeout,
                        case="average-values", what="average_weights", salts=salts,
                        links=links)
        for i, (case, root, dtype) in enumerate(cases):
            runs = [r[i] for r in res]
            befores = [params_arrays(average_model(r, dtype, salts.get(r, 0), hidden_of(case)))
                       for r in range(size)]
            mean = {k: np.mean([before[k] for before in befores], axis=0) for k in befores[0]}
            for rank, (_, after, same) in enumerate(runs):
                atol, rtol = TIGHT[dtype]
                assert_close(after, mean, f"after average_weights with {size} ranks (root={root}"
                             f", a {dtype} model) every rank must hold the mean of all {size} "
                             f"ranks' parameters, frozen ones included", rank, atol, rtol,
                             case=case, dtype=True)
                if not same:
                    fail("average-in-place",
                         f"rank {rank}: average_weights replaced the model's tensors instead of "
                         f"copying the average into them; an optimizer or another reference to "
                         f"the parameters would still see the old ones. Copy in place "
                         f"(tensor.copy_(...) under torch.no_grad(), or model.load_state_dict).")
        wire.check("average", links, size, f"average_weights with {size} ranks",
                   wire.average_envelope(size, cases))
