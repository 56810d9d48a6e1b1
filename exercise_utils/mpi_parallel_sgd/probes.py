"""What runs inside the MPI ranks that notebook 01's checkers start, and the inputs they share.

Each ``probe_*(student, ctx, ...)`` is called by :func:`exercise_utils.harness.run_ranks` in a
fresh process under ``mpiexec`` with the imported student module and ``ctx.comm``; it calls the
student's functions on fixed inputs and returns what came out (no verdict: that is
:mod:`.checks`). :class:`CountingComm` wraps the communicator to count every communication
call and the elements it carried.

Used in 01_mpi_parallel_sgd.
"""
import sys
from collections import Counter
from contextlib import contextmanager

import numpy as np

from ..harness import state_arrays

# torch (and the models, which import it) are imported by the probes that use them, not here:
# a rank of the convergence check never needs torch, and importing it costs ~2 s of CPU per
# rank (a third of what grading notebook 01 costs per submission).

COLLECTIVES = ("Allreduce", "allreduce", "Reduce", "reduce", "Bcast", "bcast", "Gather",
               "gather", "Allgather", "allgather", "Scatter", "scatter", "Send", "send",
               "Recv", "recv", "Sendrecv", "sendrecv", "Isend", "isend", "Irecv", "irecv",
               "Iallreduce", "Reduce_scatter", "Alltoall", "alltoall", "Barrier", "barrier")


DERIVED = ("Dup", "Clone", "Split", "Split_type", "Create", "Create_group", "Idup")


class CountingComm:
    """Wraps an MPI communicator; counts every communication call and the elements sent.

    Communicators derived from it (``Dup``, ``Split``, ...) are counted into the same tallies.
    """

    def __init__(self, comm, calls=None, elements=None):
        self._comm = comm
        self.calls = Counter() if calls is None else calls
        self.elements = Counter() if elements is None else elements

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if name in DERIVED:
            return lambda *a, **k: CountingComm(attr(*a, **k), self.calls, self.elements)
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
    """Elements of an MPI buffer argument: an array or a tensor (mpi4py 4 takes any object with
    the buffer or DLPack protocol), or ``[buffer, datatype, ...]``."""
    if isinstance(buf, (list, tuple)):
        buf = buf[0]
    numel = getattr(buf, "numel", None)         # a torch tensor: size() would be a torch.Size
    if callable(numel):
        return int(numel())
    size = getattr(buf, "size", None)
    return int(size() if callable(size) else size or 0)


# ---------------------------------------------------------------- shards + scatter
SHARD_CASES = [(n, s) for n in (11, 13, 10, 61, 60, 5, 2, 1, 0) for s in (3, 2, 4, 5, 7, 1)]


def _student_bounds(student, cases):
    return [[tuple(int(v) for v in b) for b in student.shard_bounds(n, s)] for n, s in cases]


# where an uppercase call writes what it receives: (position, keyword) of its receive buffer
RECEIVE_BUFFERS = {"Bcast": (0, "buf"), "Recv": (0, "buf"), "Irecv": (0, "buf"),
                   "Scatter": (1, "recvbuf"), "Scatterv": (1, "recvbuf"),
                   "Allgather": (1, "recvbuf"), "Allgatherv": (1, "recvbuf"),
                   "Allreduce": (1, "recvbuf"), "Alltoall": (1, "recvbuf"),
                   "Alltoallv": (1, "recvbuf"), "Sendrecv": (3, "recvbuf")}


class ReceiveCounter:
    """Wraps an MPI communicator; counts the array elements this rank receives: the numbers in
    the arrays and tensors a lowercase call returns, or the receive buffer of an uppercase one."""

    def __init__(self, comm):
        self._comm, self.received = comm, 0

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if name not in COLLECTIVES and name not in RECEIVE_BUFFERS:
            return attr

        def counted(*args, **kwargs):
            from mpi4py import MPI          # only in worker processes, never in the kernel
            result = attr(*args, **kwargs)
            if name in RECEIVE_BUFFERS:
                pos, key = RECEIVE_BUFFERS[name]
                buf = kwargs.get(key, args[pos] if len(args) > pos else None)
                self.received += 0 if buf is None or buf is MPI.IN_PLACE else _numel(buf)
            elif name[0].islower():
                self.received += _elements_in(result)
            return result
        return counted


def _elements_in(obj):
    """Array and tensor elements in a (nested) Python object."""
    if isinstance(obj, (list, tuple)):
        return sum(_elements_in(o) for o in obj)
    if isinstance(obj, dict):
        return sum(_elements_in(o) for o in obj.values())
    torch = sys.modules.get("torch")            # a tensor exists only if torch was imported
    tensor = () if torch is None else (torch.Tensor,)
    return _numel(obj) if isinstance(obj, (np.ndarray, *tensor)) else 0


def probe_scatter(student, ctx, n, root):
    """Returns the student's bounds (rank 0), this rank's shard and the elements it received."""
    import torch
    bounds = _student_bounds(student, SHARD_CASES) if ctx.rank == 0 else None
    x = y = None
    if ctx.rank == root:
        x = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)
        y = torch.arange(n)
    comm = ReceiveCounter(ctx.comm)
    xs, ys = student.scatter_shards(comm, x, y, root=root)
    return bounds, np.asarray(xs), np.asarray(ys), comm.received


# ---------------------------------------------------------------- broadcast
def probe_broadcast(student, ctx, root):
    import torch
    from ..models import BNNet
    torch.manual_seed(100 + ctx.rank)
    model = BNNet()
    for _ in range(ctx.rank + 1):                     # rank-specific BatchNorm buffers, and
        model(torch.randn(8, 10))                     # num_batches_tracked (int64) too
    before = state_arrays(model)
    ptrs = [t.data_ptr() for t in model.state_dict().values()]
    student.broadcast_parameters(ctx.comm, model, root=root)
    same = ptrs == [t.data_ptr() for t in model.state_dict().values()]
    return before, state_arrays(model), same


# ---------------------------------------------------------------- gradient averaging
SGD_STEPS, LOCAL_BATCH, LR = 4, 4, 0.05


def sgd_model():
    import torch
    from ..models import MPINet
    torch.manual_seed(0)
    model = MPINet()
    model.conv1.bias.requires_grad_(False)            # a frozen parameter: no gradient
    return model


def sgd_batches(size):
    import torch
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(SGD_STEPS, LOCAL_BATCH * size, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (SGD_STEPS, LOCAL_BATCH * size), generator=g)
    return x, y


def sgd_run(model, x, y, after_backward=None):
    import torch
    import torch.nn.functional as F
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=0.9)
    for xb, yb in zip(x, y):
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        if after_backward:
            after_backward()
        opt.step()
    return state_arrays(model)


@contextmanager
def world_counted(student):
    """Count what the student's code sends through ``MPI.COMM_WORLD`` itself (not the
    communicator it was given): the module attribute and any name the student file bound to
    it are replaced by a :class:`CountingComm` until the block ends. Yields it."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    counted = CountingComm(world)
    bound = [k for k, v in vars(student).items() if v is world]
    MPI.COMM_WORLD = counted
    for k in bound:
        setattr(student, k, counted)
    try:
        yield counted
    finally:
        MPI.COMM_WORLD = world
        for k in bound:
            setattr(student, k, world)


def probe_sgd(student, ctx):
    """Returns the state after SGD, the calls and elements on the given communicator, and the
    calls made through ``MPI.COMM_WORLD`` directly (outside the check's sight otherwise)."""
    model, comm = sgd_model(), CountingComm(ctx.comm)
    x, y = sgd_batches(ctx.size)
    part = slice(ctx.rank * LOCAL_BATCH, (ctx.rank + 1) * LOCAL_BATCH)
    with world_counted(student) as world:
        state = sgd_run(model, x[:, part], y[:, part],
                        lambda: student.average_gradients(comm, model))
    return state, dict(comm.calls), dict(comm.elements), dict(world.calls)


# ---------------------------------------------------------------- model averaging
def probe_average(student, ctx, root):
    import torch
    from ..models import TinyMLP
    torch.manual_seed(7 + ctx.rank)
    model = TinyMLP()
    before = state_arrays(model)
    ptrs = [t.data_ptr() for t in model.state_dict().values()]
    student.average_weights(ctx.comm, model, root=root)
    same = ptrs == [t.data_ptr() for t in model.state_dict().values()]
    return before, state_arrays(model), same


# ---------------------------------------------------------------- convergence
CONVERGED_CASES = [((None, 1.0, 0.01), False), ((1.0, 0.995, 0.01), True),
                   ((1.0, 0.9, 0.01), False), ((2.0, 1.99, 0.01), True),
                   ((1.0, 1.5, 0.01), False), ((0.5, 0.5, 0.0), True),
                   ((0.0, 0.0, 0.01), True),       # a loss of 0.0 is not "no loss yet"
                   ((1.0, 0.75, 0.25), True)]      # relative to prev_loss, not to loss
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
