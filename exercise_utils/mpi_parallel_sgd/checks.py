"""Checkers of notebook 01 (MPI parallel SGD).

Each ``check_*(path)`` runs the student file in fresh MPI processes through
:func:`exercise_utils.harness.run_ranks` (the probes of :mod:`.probes` run there), computes its
own reference, and raises ``AssertionError`` with a message the student can act on.

Used in 01_mpi_parallel_sgd.
"""
import numpy as np

from ..harness import HANG_AFTER, assert_close, run_ranks
from ..integrity import VIOLATION
from . import probes
from .probes import (CONVERGED_CASES, COUNTS, LOSS_SUMS, SGD_STEPS, SHARD_CASES, sgd_batches,
                     sgd_model, sgd_run)

TIMEOUT = HANG_AFTER     # seconds without progress before a launch is a hang (harness)


# ---------------------------------------------------------------- shards + scatter
def _check_bounds(n, size, bounds):
    call = f"shard_bounds({n}, {size})"
    if len(bounds) != size:
        raise AssertionError(f"{call} returned {len(bounds)} shards; expected one per rank ({size})")
    expected = _bounds(n, size)
    covered = sum(max(0, b - a) for a, b in bounds)
    if covered != n:
        raise AssertionError(f"{call} covers {covered} of {n} samples: no sample may be dropped "
                             f"or repeated (got {bounds})")
    sizes = [b - a for a, b in bounds]
    if max(sizes) - min(sizes) > 1:
        raise AssertionError(f"{call} gives shard sizes {sizes}: sizes may differ by at most "
                             f"one (spread the remainder over the first ranks)")
    if bounds != expected:
        raise AssertionError(f"{call} returned {bounds}; expected contiguous shards in rank "
                             f"order with the larger ones first, like numpy.array_split: {expected}")


def check_shards(path, timeout=TIMEOUT):
    """Check ``shard_bounds`` and ``scatter_shards`` of ``path`` (world sizes 2 and 3)."""
    for size, n, root in ((3, 11, 0), (2, 7, 1)):
        shards = run_ranks(path, probes.probe_scatter, size, "mpi",
                           {"n": n, "root": root}, timeout, what="shard_bounds / scatter_shards")
        for case, bounds in zip(SHARD_CASES, shards[0][0]):
            _check_bounds(*case, bounds)
        for rank, ((a, b), (_, xs, ys, received)) in enumerate(zip(_bounds(n, size), shards)):
            call = f"scatter_shards with {size} ranks, {n} samples, root={root}"
            if not np.array_equal(ys, np.arange(a, b)):
                raise AssertionError(f"{call}: rank {rank} received samples {ys.tolist()}, "
                                     f"expected {list(range(a, b))}")
            assert_close(xs, np.arange(n * 3).reshape(n, 3)[a:b], "the x shard", rank, 0, 0)
            _check_received(call, rank, root, received, shard=(b - a) * 4, size=size, n=n)


def _check_received(call, rank, root, received, shard, size, n):
    """A rank other than root may receive its shard (4 numbers a sample: x has 3, y 1) and a
    little bookkeeping (bounds, counts), never the whole dataset."""
    if rank != root and received > shard + 2 * size + 2:
        raise AssertionError(
            f"{call}: rank {rank} received {received} numbers, but its shard holds only {shard} "
            f"(the whole dataset is {n * 4}): send every rank only its own shard (e.g. "
            f"comm.scatter of the pieces on root), never the whole dataset to be sliced there")


def _bounds(n, size):
    """The reference shards: contiguous, rank order, the first n % size one sample larger."""
    base, extra = divmod(n, size)
    stops = np.cumsum([base + (r < extra) for r in range(size)])
    return [(int(stop - base - (r < extra)), int(stop)) for r, stop in enumerate(stops)]


# ---------------------------------------------------------------- broadcast
def check_broadcast(path, timeout=TIMEOUT):
    """Check ``broadcast_parameters`` of ``path``: every rank ends with root's parameters and buffers."""
    for size, root in ((3, 0), (2, 1)):
        res = run_ranks(path, probes.probe_broadcast, size, "mpi", {"root": root},
                        timeout, what="broadcast_parameters")
        root_before = res[root][0]
        for rank, (before, after, same) in enumerate(res):
            assert_close(after, root_before, f"after broadcast_parameters(comm, model, root="
                         f"{root}) with {size} ranks every rank must hold rank {root}'s initial "
                         f"parameters and buffers", rank, 0, 0)
            if not same:
                raise AssertionError(
                    f"rank {rank}: broadcast_parameters replaced the model's tensors instead of "
                    f"copying into them; an optimizer built before the call would still update "
                    f"the old tensors. Copy in place (e.g. Bcast into p.data.numpy()).")


# ---------------------------------------------------------------- gradient averaging
def check_allreduce_sgd(path, timeout=TIMEOUT):
    """Check ``average_gradients``: equals single-process SGD on the whole batch, one Allreduce a step."""
    for size in (2, 3):
        x, y = sgd_batches(size)
        expected = sgd_run(sgd_model(), x, y)
        numel = sum(p.numel() for p in sgd_model().parameters() if p.requires_grad)
        res = run_ranks(path, probes.probe_sgd, size, "mpi", timeout=timeout,
                        what="average_gradients")
        for rank, (state, calls, elements, hidden) in enumerate(res):
            if hidden:
                raise AssertionError(
                    f"{VIOLATION}: rank {rank} communicated through MPI.COMM_WORLD itself "
                    f"({hidden}) instead of the `comm` average_gradients was given, where the "
                    f"check counts the calls. Use the comm argument.")
            assert_close(state, expected, f"parameters after {SGD_STEPS} SGD steps with {size} "
                         f"ranks must equal single-process SGD on the concatenated batch: "
                         f"average (sum / size) the gradients of every rank", rank)
            _check_one_allreduce(rank, calls, elements, numel)


def _check_one_allreduce(rank, calls, elements, numel):
    others = {k: v for k, v in calls.items() if k != "Allreduce"}
    if calls.get("Allreduce", 0) != SGD_STEPS or others:
        per_step = {k: v / SGD_STEPS for k, v in calls.items()}
        raise AssertionError(
            f"rank {rank}: expected exactly one comm.Allreduce per step (on one flat buffer "
            f"holding all {numel} gradient elements) and no other communication; your code "
            f"made these calls per step: {per_step or 'none (use the comm argument)'}")
    if elements["Allreduce"] != numel * SGD_STEPS:
        raise AssertionError(
            f"rank {rank}: each Allreduce carried {elements['Allreduce'] // SGD_STEPS} elements; "
            f"the flat buffer must hold every gradient element ({numel}, frozen parameters skipped)")


# ---------------------------------------------------------------- model averaging
def check_model_averaging(path, timeout=TIMEOUT):
    """Check ``average_weights``: every rank ends with the mean of all ranks' parameters."""
    for size, root in ((3, 0), (2, 1)):
        res = run_ranks(path, probes.probe_average, size, "mpi", {"root": root}, timeout,
                        what="average_weights")
        mean = {k: np.mean([before[k] for before, _, _ in res], axis=0) for k in res[0][0]}
        for rank, (_, after, same) in enumerate(res):
            assert_close(after, mean, f"after average_weights with {size} ranks (root={root}) "
                         f"every rank must hold the mean of all {size} ranks' parameters", rank)
            if not same:
                raise AssertionError(
                    f"rank {rank}: average_weights replaced the model's tensors instead of "
                    f"copying the average into them; an optimizer or another reference to the "
                    f"parameters would still see the old ones. Copy in place (tensor.copy_(...) "
                    f"under torch.no_grad(), or model.load_state_dict).")


# ---------------------------------------------------------------- convergence
def check_convergence(path, timeout=TIMEOUT):
    """Check ``converged`` (relative tolerance, first epoch) and ``global_loss`` (same on all ranks)."""
    for size in (3, 2):
        res = run_ranks(path, probes.probe_convergence, size, "mpi", timeout=timeout,
                        what="global_loss / converged")
        for (args, want), got in zip(CONVERGED_CASES, res[0][0]):
            if got != want:
                got = f"raised {got['raised']}" if isinstance(got, dict) else f"returned {got}"
                zero = (" (a previous loss of 0.0 is a loss: test `prev_loss is None`, not "
                        "`not prev_loss`)" if args[0] == 0.0 else "")
                raise AssertionError(f"converged{args} {got}, expected {want}{zero}: stop "
                                     f"when abs(prev_loss - loss) <= rel_tol * abs(prev_loss); "
                                     f"never on the first epoch (prev_loss is None)")
        losses = [loss for _, loss in res]
        expected = sum(LOSS_SUMS[:size]) / sum(COUNTS[:size])
        if max(losses) - min(losses) > 1e-9:
            raise AssertionError(
                f"global_loss differs between ranks ({losses}): ranks would take different stop "
                f"decisions, and the ranks that keep training would hang in Allreduce forever")
        if abs(losses[0] - expected) > 1e-9:
            raise AssertionError(
                f"global_loss returned {losses[0]:.6f} with {size} ranks; expected {expected:.6f} "
                f"= (sum of all loss sums) / (sum of all sample counts)")
