"""Checkers of notebook 01 (MPI parallel SGD).

Each ``check_*(path)`` runs the student file in fresh MPI processes through
:func:`exercise_utils.harness.run_ranks`, computes its own reference, and raises
``AssertionError`` with a message the student can act on. The ``probe_*``
functions run inside those processes.

Used in 01_mpi_parallel_sgd.
"""
from collections import Counter

import numpy as np
import torch
import torch.nn.functional as F

from .config import quick
from .harness import assert_close, run_ranks, state_arrays
from .models import MPINet, BNNet, TinyMLP

COLLECTIVES = ("Allreduce", "allreduce", "Reduce", "reduce", "Bcast", "bcast", "Gather",
               "gather", "Allgather", "allgather", "Scatter", "scatter", "Send", "send",
               "Recv", "recv", "Sendrecv", "sendrecv", "Isend", "isend", "Irecv", "irecv",
               "Iallreduce", "Reduce_scatter", "Alltoall", "alltoall", "Barrier", "barrier")
MODULE = "exercise_utils.checks_mpi"
TIMEOUT = quick(90, 45)     # seconds a check may run before it is declared hung


class CountingComm:
    """Wraps an MPI communicator; counts every communication call and the elements sent."""

    def __init__(self, comm):
        self._comm, self.calls, self.elements = comm, Counter(), Counter()

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if name not in COLLECTIVES:
            return attr

        def counted(*args, **kwargs):
            from mpi4py import MPI          # only in worker processes, never in the kernel
            self.calls[name] += 1
            bufs = [a for a in args if a is not MPI.IN_PLACE]
            self.elements[name] += _numel(bufs[0]) if bufs and name[0].isupper() else 0
            return attr(*args, **kwargs)
        return counted


def _numel(buf):
    if isinstance(buf, (list, tuple)):
        buf = buf[0]
    size = getattr(buf, "size", None)
    return int(size() if callable(size) else size or 0)


# ---------------------------------------------------------------- shards + scatter
SHARD_CASES = [(n, s) for n in (11, 13, 10, 61, 60, 5, 2, 1, 0) for s in (3, 2, 4, 5, 7, 1)]


def _student_bounds(student, cases):
    return [[tuple(int(v) for v in b) for b in student.shard_bounds(n, s)] for n, s in cases]


def probe_scatter(student, ctx, n, root):
    bounds = _student_bounds(student, SHARD_CASES) if ctx.rank == 0 else None
    x = y = None
    if ctx.rank == root:
        x = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)
        y = torch.arange(n)
    xs, ys = student.scatter_shards(ctx.comm, x, y, root=root)
    return bounds, np.asarray(xs), np.asarray(ys)


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
        shards = run_ranks(path, f"{MODULE}:probe_scatter", size, "mpi",
                           {"n": n, "root": root}, timeout, what="shard_bounds / scatter_shards")
        for case, bounds in zip(SHARD_CASES, shards[0][0]):
            _check_bounds(*case, bounds)
        for rank, ((a, b), (_, xs, ys)) in enumerate(zip(_bounds(n, size), shards)):
            if not np.array_equal(ys, np.arange(a, b)):
                raise AssertionError(
                    f"scatter_shards with {size} ranks, {n} samples, root={root}: rank {rank} "
                    f"received samples {ys.tolist()}, expected {list(range(a, b))}")
            assert_close(xs, np.arange(n * 3).reshape(n, 3)[a:b], "the x shard", rank, 0, 0)


def _bounds(n, size):
    """The reference shards: contiguous, rank order, the first n % size one sample larger."""
    base, extra = divmod(n, size)
    stops = np.cumsum([base + (r < extra) for r in range(size)])
    return [(int(stop - base - (r < extra)), int(stop)) for r, stop in enumerate(stops)]


# ---------------------------------------------------------------- broadcast
def probe_broadcast(student, ctx, root):
    torch.manual_seed(100 + ctx.rank)
    model = BNNet()
    model(torch.randn(8, 10))                         # rank-specific BatchNorm buffers
    before = state_arrays(model)
    ptrs = [t.data_ptr() for t in model.state_dict().values()]
    student.broadcast_parameters(ctx.comm, model, root=root)
    same = ptrs == [t.data_ptr() for t in model.state_dict().values()]
    return before, state_arrays(model), same


def check_broadcast(path, timeout=TIMEOUT):
    """Check ``broadcast_parameters`` of ``path``: every rank ends with root's parameters and buffers."""
    for size, root in ((3, 0), (2, 1)):
        res = run_ranks(path, f"{MODULE}:probe_broadcast", size, "mpi", {"root": root},
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
SGD_STEPS, LOCAL_BATCH, LR = 4, 4, 0.05


def _sgd_model():
    torch.manual_seed(0)
    model = MPINet()
    model.conv1.bias.requires_grad_(False)            # a frozen parameter: no gradient
    return model


def _sgd_batches(size):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(SGD_STEPS, LOCAL_BATCH * size, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (SGD_STEPS, LOCAL_BATCH * size), generator=g)
    return x, y


def _sgd_run(model, x, y, after_backward=None):
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=0.9)
    for xb, yb in zip(x, y):
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        if after_backward:
            after_backward()
        opt.step()
    return state_arrays(model)


def probe_sgd(student, ctx):
    model, comm = _sgd_model(), CountingComm(ctx.comm)
    x, y = _sgd_batches(ctx.size)
    part = slice(ctx.rank * LOCAL_BATCH, (ctx.rank + 1) * LOCAL_BATCH)
    state = _sgd_run(model, x[:, part], y[:, part], lambda: student.average_gradients(comm, model))
    return state, dict(comm.calls), dict(comm.elements)


def check_allreduce_sgd(path, timeout=TIMEOUT):
    """Check ``average_gradients``: equals single-process SGD on the whole batch, one Allreduce a step."""
    for size in (2, 3):
        x, y = _sgd_batches(size)
        expected = _sgd_run(_sgd_model(), x, y)
        numel = sum(p.numel() for p in _sgd_model().parameters() if p.requires_grad)
        res = run_ranks(path, f"{MODULE}:probe_sgd", size, "mpi", timeout=timeout,
                        what="average_gradients")
        for rank, (state, calls, elements) in enumerate(res):
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
def probe_average(student, ctx, root):
    torch.manual_seed(7 + ctx.rank)
    model = TinyMLP()
    before = state_arrays(model)
    student.average_weights(ctx.comm, model, root=root)
    return before, state_arrays(model)


def check_model_averaging(path, timeout=TIMEOUT):
    """Check ``average_weights``: every rank ends with the mean of all ranks' parameters."""
    for size, root in ((3, 0), (2, 1)):
        res = run_ranks(path, f"{MODULE}:probe_average", size, "mpi", {"root": root}, timeout,
                        what="average_weights")
        mean = {k: np.mean([before[k] for before, _ in res], axis=0) for k in res[0][0]}
        for rank, (_, after) in enumerate(res):
            assert_close(after, mean, f"after average_weights with {size} ranks (root={root}) "
                         f"every rank must hold the mean of all {size} ranks' parameters", rank)


# ---------------------------------------------------------------- convergence
CONVERGED_CASES = [((None, 1.0, 0.01), False), ((1.0, 0.995, 0.01), True),
                   ((1.0, 0.9, 0.01), False), ((2.0, 1.99, 0.01), True),
                   ((1.0, 1.5, 0.01), False), ((0.5, 0.5, 0.0), True)]
LOSS_SUMS, COUNTS = [3.0, 10.0, 1.0], [10, 20, 5]


def probe_convergence(student, ctx):
    decisions = []
    for args, _ in CONVERGED_CASES:
        try:
            decisions.append(bool(student.converged(*args)))
        except Exception as exc:  # reported per case, not as a crash
            decisions.append({"raised": f"{type(exc).__name__}: {exc}"})
    loss = student.global_loss(ctx.comm, LOSS_SUMS[ctx.rank], COUNTS[ctx.rank])
    return decisions, float(loss)


def check_convergence(path, timeout=TIMEOUT):
    """Check ``converged`` (relative tolerance, first epoch) and ``global_loss`` (same on all ranks)."""
    for size in (3, 2):
        res = run_ranks(path, f"{MODULE}:probe_convergence", size, "mpi", timeout=timeout,
                        what="global_loss / converged")
        for (args, want), got in zip(CONVERGED_CASES, res[0][0]):
            if got != want:
                got = f"raised {got['raised']}" if isinstance(got, dict) else f"returned {got}"
                raise AssertionError(f"converged{args} {got}, expected {want}: stop "
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
