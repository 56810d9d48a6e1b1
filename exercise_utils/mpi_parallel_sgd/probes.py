"""What runs inside the MPI ranks that notebook 01's checkers start, and the inputs they share.

Each ``probe_*(student, ctx, ...)`` is called by :func:`exercise_utils.harness.run_ranks` in a
fresh process under ``mpiexec`` with the imported student module and ``ctx.comm``; it calls the
student's functions on the inputs of :mod:`.inputs` and returns what came out (no verdict: that
is :mod:`.checks`). In a launch of 2 or more ranks every input a rank is given derives from its
own ``ctx.salt`` (at grading a number only it and the judge know; 0 elsewhere, where the inputs
are fixed): the root's dataset, every rank's model, each rank's batches and loss sum. The other
ranks' inputs a rank could build here are not theirs; the judge builds them from the salts.
:class:`CountingComm` wraps the communicator to count every communication call and the
elements it carried.

Used in 01_mpi_parallel_sgd.
"""
import sys
from collections import Counter
from contextlib import contextmanager

import numpy as np

from ..compare import state_arrays
from .inputs import (GLOBAL, HIDDEN, LOCAL_BATCH, SGD_STEPS, average_model, bcast_model,
                     edge_model, global_inputs, hidden_of, scatter_data, sgd_batches)

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
def bounds_cases():
    """The (n_samples, size) pairs ``shard_bounds`` is asked for: every n up to 13 with every
    size up to 7 (empty shards, size > n, n = 0, size 1), then larger and random ones."""
    import random
    rng = random.Random(11)
    cases = [(n, s) for n in range(14) for s in range(1, 8)]
    cases += [(60, 7), (61, 7), (97, 96), (100, 64), (1_000_003, 64), (5, 12)]
    cases += [(rng.randrange(0, 5000), rng.randrange(1, 40)) for _ in range(40)]
    return cases


def _student_bounds(student, cases):
    out = []
    for n, s in cases:
        try:
            out.append([[int(v) for v in b] for b in student.shard_bounds(n, s)])
        except NotImplementedError:
            raise                  # the blank exercise: "not implemented yet", not a case
        except Exception as exc:  # noqa: BLE001 - reported per case, not as a crash
            out.append({"raised": f"{type(exc).__name__}: {exc}"})
    return out


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
    """Array and tensor elements in a (nested) Python object, as the process holds them: a
    tensor's whole storage (a pickled slice ``x[a:b]`` arrives with all of ``x``'s storage
    under it, the whole dataset where ``x`` was; an array pickles only its own elements)."""
    if isinstance(obj, (list, tuple)):
        return sum(_elements_in(o) for o in obj)
    if isinstance(obj, dict):
        return sum(_elements_in(o) for o in obj.values())
    torch = sys.modules.get("torch")            # a tensor exists only if torch was imported
    if torch is not None and isinstance(obj, torch.Tensor):
        held = obj.untyped_storage().nbytes() // max(1, obj.element_size())
        return max(_numel(obj), held)
    return _numel(obj) if isinstance(obj, np.ndarray) else 0


# each scatter: (case, samples, root, x dtype, shape of one sample); per world size
SCATTER_CASES = {
    3: [("scatter-shard", 11, 0, "float32", (3,)), ("scatter-root", 10, 2, "float32", (3,)),
        ("scatter-float64", 8, 0, "float64", (2, 2)), ("scatter-empty", 2, 1, "float32", (3,)),
        # enough samples that the labels alone, sent whole, outweigh the bookkeeping allowed
        ("scatter-shard", 60, 1, "float32", (3,))],
    2: [("scatter-root", 7, 1, "float32", (3,)), ("scatter-float64", 9, 0, "float64", ())],
}


def probe_bounds(student, ctx):
    """The student's bounds for every case of :func:`bounds_cases` (a lone process, no MPI)."""
    ctx.case("bounds-tile")
    return _student_bounds(student, bounds_cases())


def probe_scatter(student, ctx, cases):
    """For each scatter case: this rank's shard (arrays, types, dtypes) and the elements it
    received. The root's dataset derives from its salt."""
    shards = []
    for case, n, root, dtype, shape in cases:
        ctx.case(case)
        x, y = scatter_data(n, dtype, shape, ctx.salt) if ctx.rank == root else (None, None)
        comm = ReceiveCounter(ctx.comm)
        xs, ys = student.scatter_shards(comm, x, y, root=root)
        shards.append({"x": np.asarray(xs), "y": np.asarray(ys), "received": comm.received,
                       "types": [_kind(xs), _kind(ys)]})
    return shards


def _kind(value):
    """'torch.float32' for a tensor, 'numpy.float64' for an array, else the type's name."""
    dtype = getattr(value, "dtype", None)
    module = type(value).__module__.split(".")[0]
    return f"{module}.{str(dtype).replace('torch.', '')}" if dtype is not None else \
        type(value).__name__


# ---------------------------------------------------------------- broadcast
# per world size: (case, root, dtype) of each broadcast
BROADCAST_CASES = {3: [("bcast-values", 0, "float32"), ("bcast-root", 2, "float32"),
                       ("bcast-float64", 0, "float64")],
                   2: [("bcast-root", 1, "float32"), ("bcast-float64", 1, "float64")]}


def probe_broadcast(student, ctx, cases):
    """For each case: this rank's state before and after, and whether every tensor of the
    state_dict is still the same memory (updated in place). Every rank's model derives from
    its salt (the judge builds the root's)."""
    out = []
    for case, root, dtype in cases:
        ctx.case(case)
        model = bcast_model(ctx.rank, dtype, ctx.salt, hidden_of(case))
        before = state_arrays(model)
        ptrs = [t.data_ptr() for t in model.state_dict().values()]
        student.broadcast_parameters(ctx.comm, model, root=root)
        same = ptrs == [t.data_ptr() for t in model.state_dict().values()]
        out.append((before, state_arrays(model), same))
    return out


# ---------------------------------------------------------------- gradient averaging
LR, DECAY = 0.05, 0.01
SGD_CASES = (("sgd-values", "float32"), ("sgd-float64", "float64"), ("sgd-varying", "float32"))
NO_GRAD = ["frozen", "unused.weight", "unused.bias"]   # EdgeNet's parameters without gradient
# sgd-varying: which parameters have a gradient changes from step to step. EdgeNet's parameters
# frozen (requires_grad False) in each step: in step 1 three (scale and inp.bias too), in step 2
# none (frozen, scale and inp.bias get a gradient: a list kept from the first call misses them),
# in step 3 scale again (its gradient None once more), in step 4 frozen as built.
VARY_FROZEN = ({"frozen", "scale", "inp.bias"}, set(), {"scale"}, {"frozen"})


def vary_grads(model, step):
    """Before step ``step`` (from 0) of ``sgd-varying``: freeze :data:`VARY_FROZEN`'s
    parameters of this step, unfreeze the others."""
    for name, p in model.named_parameters():
        p.requires_grad_(name not in VARY_FROZEN[step])


def vary_of(case):
    """The :func:`vary_grads` of ``case``, or None (which parameters have a gradient is the
    same every step)."""
    return vary_grads if case == "sgd-varying" else None


def step_no_grad(case):
    """Per step, the names of the parameters without a gradient after backward in ``case``."""
    if not vary_of(case):
        return [NO_GRAD] * SGD_STEPS
    return [sorted(VARY_FROZEN[step] | {"unused.weight", "unused.bias"}) for step in
            range(SGD_STEPS)]


def step_numels(model, case):
    """Per step, the gradient elements of ``case`` on ``model`` (the parameters with a
    gradient, a tied one once)."""
    if not vary_of(case):
        return [trained_numel(model)] * SGD_STEPS
    return [sum(p.numel() for n, p in model.named_parameters() if n not in none)
            for none in step_no_grad(case)]


def sgd_model(dtype="float32", hidden=HIDDEN):
    """The model every rank starts from: an :class:`~exercise_utils.models.EdgeNet` (``hidden``
    wide) in eval mode (BatchNorm on its running statistics, so that averaged gradients equal
    the gradient of the combined batch)."""
    model = edge_model(0, dtype, hidden=hidden)
    return model.eval()


def sgd_run(model, x, y, after_backward=None, vary=None):
    """SGD with momentum and weight decay (a gradient that should be None but is zero would
    decay its parameter) over the batches, ``vary(model, step)`` before each step
    (:func:`vary_grads`); returns the final state."""
    import torch
    import torch.nn.functional as F
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=DECAY)
    for step, (xb, yb) in enumerate(zip(x, y)):
        if vary:
            vary(model, step)
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        if after_backward:
            after_backward()
        opt.step()
    return state_arrays(model)


def trained_numel(model):
    """Gradient elements per step: the parameters that get a gradient (tied ones once)."""
    return sum(p.numel() for n, p in model.named_parameters() if n not in NO_GRAD)


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


def probe_sgd(student, ctx, cases=SGD_CASES):
    """For each of ``cases`` (``(case, dtype)``): the state after SGD, the calls and elements on
    the given communicator, per call the parameters left without a gradient and the elements
    the call sent, and the calls made through ``MPI.COMM_WORLD`` directly (outside the check's
    sight otherwise). This rank's rows of the batches derive from its salt (the other ranks'
    rows in ``x`` are not theirs)."""
    out = []
    part = slice(ctx.rank * LOCAL_BATCH, (ctx.rank + 1) * LOCAL_BATCH)
    for case, dtype in cases:
        ctx.case(case)
        model, comm = sgd_model(dtype, hidden_of(case)), CountingComm(ctx.comm)
        none, sent = [], []
        x, y = sgd_batches(ctx.size, dtype, {ctx.rank: ctx.salt})

        def average():
            before = sum(comm.elements.values())
            try:
                student.average_gradients(comm, model)
            except (AttributeError, TypeError) as exc:
                if "NoneType" not in str(exc):
                    raise
                raise type(exc)(f"{exc}. (If it comes from a gradient: a parameter whose p.grad "
                                f"is None must be left alone; which parameters have one may "
                                f"change from one call to the next: look at p.grad in every "
                                f"call.)") from exc
            none.append([n for n, p in model.named_parameters() if p.grad is None])
            sent.append(sum(comm.elements.values()) - before)
        with world_counted(student) as world:
            state = sgd_run(model, x[:, part], y[:, part], average, vary_of(case))
        out.append((state, dict(comm.calls), dict(comm.elements), none, dict(world.calls), sent))
    return out


# ---------------------------------------------------------------- model averaging
AVERAGE_CASES = {3: [("average-values", 0, "float32"), ("average-root", 2, "float32"),
                     ("average-float64", 0, "float64")],
                 2: [("average-root", 1, "float32"), ("average-float64", 1, "float64")]}


def probe_average(student, ctx, cases):
    """For each case: this rank's parameters before and after, and whether every tensor of the
    state_dict is still the same memory. Every rank's model derives from its salt (the judge
    builds them all)."""
    out = []
    for case, root, dtype in cases:
        ctx.case(case)
        model = average_model(ctx.rank, dtype, ctx.salt, hidden_of(case))
        before = params_arrays(model)
        ptrs = [t.data_ptr() for t in model.state_dict().values()]
        student.average_weights(ctx.comm, model, root=root)
        same = ptrs == [t.data_ptr() for t in model.state_dict().values()]
        out.append((before, params_arrays(model), same))
    return out


def params_arrays(model):
    """``{name: numpy copy}`` of every parameter (frozen ones included; buffers not)."""
    return {k: v.detach().numpy().copy() for k, v in model.named_parameters()}


# ---------------------------------------------------------------- convergence
def converged_cases():
    """(prev_loss, loss, rel_tol) triples for ``converged``: the first epoch, equality at the
    tolerance, a previous loss of 0.0, negative losses, a loss that rose, tolerance 0, and
    random ones around the threshold."""
    import random
    rng = random.Random(5)
    cases = [(None, 1.0, 0.01), (None, 0.0, 0.5), (1.0, 0.995, 0.01), (1.0, 0.9, 0.01),
             (2.0, 1.99, 0.01), (1.0, 1.5, 0.01), (0.5, 0.5, 0.0), (0.5, 0.4999, 0.0),
             (0.0, 0.0, 0.01), (0.0, 0.001, 0.01), (1.0, 0.75, 0.25), (1.0, 1.25, 0.25),
             (1.0, 1.25, 0.2), (-1.0, -0.995, 0.01), (-2.0, -1.5, 0.1), (-1.0, -1.25, 0.25),
             (4.0, 3.0, 0.25), (4.0, 5.0, 0.25), (3.0, 2.0, 1.0)]
    for _ in range(30):
        prev = rng.choice([-1, 1]) * rng.uniform(0.01, 10)
        tol = rng.choice([0.0, 0.001, 0.01, 0.1, 0.5])
        cases.append((prev, prev * (1 + rng.choice([-1, 1]) * tol * rng.uniform(0.5, 1.5)), tol))
    return cases


def type_name(value):
    """``bool``, ``NoneType``, ... for Python's own types; ``numpy.bool`` (numpy 2 calls its
    scalar ``bool`` too), ``numpy.float64`` ... for any other module's."""
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"


def probe_convergence(student, ctx):
    """Rank 0: ``converged`` on every case (the value, or what it raised). Every rank: what
    ``global_loss`` returned for this rank's share of each case (value and type); its loss sum
    derives from its salt."""
    ctx.case("converged-rule")
    decisions = []
    if ctx.rank == 0:
        for args in converged_cases():
            try:
                got = student.converged(*args)
                decisions.append([type_name(got), bool(got)])
            except Exception as exc:  # noqa: BLE001 - reported per case, not as a crash
                decisions.append({"raised": f"{type(exc).__name__}: {exc}"})
    losses = []
    for case in GLOBAL:
        ctx.case(case)
        sums, counts = global_inputs(case, ctx.size, {ctx.rank: ctx.salt})
        got = student.global_loss(ctx.comm, sums[ctx.rank], counts[ctx.rank])
        losses.append([type(got).__name__, float(got)])
    return decisions, losses
