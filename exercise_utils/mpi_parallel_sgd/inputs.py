"""The inputs notebook 01's probes give the student's functions, built alike by the ranks and
by the judge, and salted.

Each builder takes a rank's ``salt`` (``ctx.salt`` in its probe; see
:func:`exercise_utils.harness.run_ranks`'s ``salts``): 0 outside grading, where every input is
the same fixed one for all time (the tests' expected messages rely on them); at grading (and
with ``DTFS_SALT=1``) a number only that rank and the judge know, so that a rank cannot
rebuild another rank's input here (only receive it through its collectives), and the judge
computes every expected value from the salts, never from what a rank says it was given:

* ``scatter_data``: the root's dataset (x moved by multiples of 1/64 drawn from its salt);
* ``bcast_model`` and ``average_model`` (:func:`edge_model`): every rank's model;
* ``sgd_batches``: each rank's rows of the global batch;
* ``global_inputs``: each rank's loss sum, where its count is > 0.

A case named ``<exercise>-wire`` (run only where the judge observes the links:
:mod:`.wire`) builds its models :data:`WIDE` wide (:func:`hidden_of`), so that what a launch
puts on the wire stands far above what setting MPI up costs.

Used in 01_mpi_parallel_sgd.
"""
import math
import random

import numpy as np

from ..rankworker import salted_generator

# torch is imported by the builders that use it, not here: a rank of the convergence check
# never needs it (importing it costs ~2 s of CPU per rank).


# ---------------------------------------------------------------- scatter
def scatter_data(n, dtype, shape, salt=0):
    """The dataset of a scatter case: x[i] holds the numbers i + 0.25, ... (with the root's
    ``salt``, each moved by a multiple of 1/64, below 64 in size, drawn from it); y = 0, 1,
    ... (the sample numbers, which the messages show)."""
    import torch
    width = int(np.prod(shape)) if shape else 1
    x = (torch.arange(n * width, dtype=torch.float64) / width + 0.25).reshape(n, *shape)
    if salt:
        g = salted_generator(101 * n + width, salt)
        x = x + torch.randint(-4096, 4096, x.shape, generator=g, dtype=torch.float64) / 64
    return x.to(getattr(torch, dtype)), torch.arange(n)


# ---------------------------------------------------------------- models
BIG_COUNT = 2 ** 24 + 1     # float32 cannot hold it: an integer buffer sent as float32 changes
HIDDEN, WIDE = 8, 256       # EdgeNet's hidden width: the checks' cases, a wire case (200k elements)


def hidden_of(case):
    """EdgeNet's hidden width in ``case``: :data:`WIDE` for a wire case (``"...-wire"``)."""
    return WIDE if case.endswith("-wire") else HIDDEN


def edge_model(seed, dtype="float32", batches=1, salt=0, hidden=HIDDEN):
    """An :class:`~exercise_utils.models.EdgeNet` from ``seed`` (tied, frozen, unused,
    transposed and 0-d parameters, BatchNorm buffers) with ``batches`` forward passes of
    running statistics behind it, and the frozen parameter and the integer buffer
    rank-specific too. With a ``salt``, everything derives from it as well: the weights, the
    statistics, the frozen, 0-d and BatchNorm parameters and the counter (still odd: float32
    rounds it). ``hidden``: its hidden width. Built on one thread: BatchNorm's statistics
    depend on the number of threads in the last bit, and the judge must build the ranks'
    models to the bit."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _edge_model(torch, seed, getattr(torch, dtype), batches, salt, hidden)
    finally:
        torch.set_num_threads(threads)


def _edge_model(torch, seed, kind, batches, salt, hidden):
    from ..models import EdgeNet
    torch.manual_seed(salted_generator(seed, salt).initial_seed())     # (the global RNG)
    model = EdgeNet(hidden=hidden, dtype=kind)
    for _ in range(batches):
        model(torch.randn(8, 6, dtype=kind))
    with torch.no_grad():
        model.frozen.add_(seed % 7 / 10)
        if salt:                    # (the parameters no random initialisation draws)
            for p in (model.frozen, model.scale, model.bn.weight, model.bn.bias):
                p.add_(torch.randn(p.shape, dtype=kind) / 10)
        model.bn.num_batches_tracked.fill_(BIG_COUNT + 2 * seed + 2 * (salt % 1_000_003))
    return model


def bcast_model(rank, dtype, salt=0, hidden=HIDDEN):
    """The model rank ``rank`` holds before ``broadcast_parameters`` (its ``salt``)."""
    return edge_model(100 + rank, dtype, batches=rank + 1, salt=salt, hidden=hidden)


def average_model(rank, dtype, salt=0, hidden=HIDDEN):
    """The model rank ``rank`` holds before ``average_weights`` (its ``salt``)."""
    return edge_model(7 + rank, dtype, batches=rank + 1, salt=salt, hidden=hidden)


# ---------------------------------------------------------------- gradient averaging
SGD_STEPS, LOCAL_BATCH = 4, 4


def sgd_batches(size, dtype="float32", salts=None):
    """The global batches ``(x, y)`` of every step (``x``: (steps, LOCAL_BATCH * size, 6)):
    rank r's rows are ``LOCAL_BATCH * r`` to ``LOCAL_BATCH * (r + 1)``, drawn from its salt
    (``salts``: ``{rank: salt}``; 0 for a rank not in it: then the rows of one fixed draw).
    A rank is given its own salt only: the other ranks' rows it draws are not theirs."""
    import torch
    kind = getattr(torch, dtype)
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(SGD_STEPS, LOCAL_BATCH * size, 6, generator=g, dtype=kind)
    y = torch.randint(0, 4, (SGD_STEPS, LOCAL_BATCH * size), generator=g)
    for r, salt in sorted((salts or {}).items()):
        if salt and r < size:
            g = salted_generator(4321 + 31 * r, salt)
            rows = slice(r * LOCAL_BATCH, (r + 1) * LOCAL_BATCH)
            x[:, rows] = torch.randn(SGD_STEPS, LOCAL_BATCH, 6, generator=g, dtype=kind)
            y[:, rows] = torch.randint(0, 4, (SGD_STEPS, LOCAL_BATCH), generator=g)
    return x, y


# ---------------------------------------------------------------- convergence
# per world size: each rank's (loss_sum, count); a rank with no samples, big and negative sums
GLOBAL_CASES = {3: [[3.0, 10.0, 1.0], [10, 20, 5]],
                2: [[123456.789, -0.5], [3, 7]]}
GLOBAL_EMPTY = {3: [[2.5, 0.0, 7.25], [5, 0, 9]], 2: [[0.0, 1e-3], [0, 1]]}
GLOBAL = {"global-value": GLOBAL_CASES, "global-empty-rank": GLOBAL_EMPTY}


def global_inputs(case, size, salts=None):
    """``(sums, counts)``: every rank's ``global_loss`` arguments in ``case`` with ``size``
    ranks. With a rank's salt (``salts``: ``{rank: salt}``) its loss sum moves away from zero
    by k / 256 (k < 2**20, drawn from the salt) where its count is > 0: sums of such numbers
    are exact in float64 in any order (a rank with no samples keeps 0.0)."""
    sums, counts = GLOBAL[case][size]
    out = list(sums)
    for r, (loss_sum, count) in enumerate(zip(sums, counts)):
        salt = (salts or {}).get(r, 0)
        if salt and count:
            k = random.Random(salt * 1009 + 7 * r + len(case)).randrange(1, 1 << 20)
            out[r] = loss_sum + math.copysign(k / 256, loss_sum)
    return out, counts
