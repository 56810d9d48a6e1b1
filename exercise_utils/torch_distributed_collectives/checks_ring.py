"""Checker of notebook 03's ring all-reduce exercise (``work/03_ring_allreduce.py``).

:func:`check_ring_allreduce` runs the student's ``ring_all_reduce`` in fresh gloo
processes (world sizes 2, 3 and 4, one launch each) on many tensors: lengths that do
not divide by the world size, lengths below it, 2-D and 3-D shapes, float and integer
dtypes, different contents on every rank. It checks the numbers (exact for integers),
that the tensor is reduced in place and returned, and the structure of a ring: while
the student's code runs, the probe (:func:`.probes_ring.probe_ring`) records every
``torch.distributed`` call, so each rank must send ``2 * (world_size - 1)`` messages of at
most ``ceil(numel / world_size)`` elements, only to its right neighbour (receiving only from
its left one), and call no collective. With 4 ranks the ring also runs inside process groups
(``group=``) whose sums must cover their own ranks only.

Used in 03_torch_distributed_collectives.
"""
import math

import numpy as np

from ..harness import HANG_AFTER, run_ranks
from ..integrity import VIOLATION
from . import probes_ring
from .probes_ring import (GROUP_CASE0, GROUP_CASES, GROUPS, P2P, SENDS, group_of,
                          ring_cases, ring_input)

TIMEOUT = HANG_AFTER     # seconds without progress before a launch is a hang (harness)
WORLD_SIZES = (2, 3, 4)     # one launch each
HUNG_HINT = ("With gloo, a send starts only once the peer has posted the matching receive: if "
             "every rank sends first with dist.send and receives afterwards, all of them wait "
             "forever. Post the receive with r = dist.irecv(...), then the send with "
             "s = dist.isend(...), then r.wait() and s.wait(); and make every rank run the "
             "same number of steps.")
RING_HINT = ("a ring all-reduce is a reduce-scatter (world_size - 1 steps, each adding one "
             "received chunk) then an all-gather (world_size - 1 steps, each passing on one "
             "complete chunk), on the chunks torch.tensor_split(tensor.view(-1), world_size)")


def check_ring_allreduce(path, timeout=TIMEOUT):
    """Check ``ring_all_reduce`` of ``path``: sums, in place, chunked ring messages only.

    With 4 ranks it also runs the ring inside process groups (``group=``): rank 0 alone, and
    ranks 1-3, whose sums must cover their own group only (:data:`.probes_ring.GROUPS`).

    Args:
        path: the student file (``work/03_ring_allreduce.py``).
        timeout: seconds per launch before the ranks are declared hung.
    Raises:
        AssertionError: with what to change, naming the rank, the case and the numbers.
    """
    for size in WORLD_SIZES:
        cases = ring_cases(size)
        group_cases = GROUP_CASES if size in GROUPS else []
        try:
            res = run_ranks(path, probes_ring.probe_ring, size, "gloo",
                            {"cases": cases, "group_cases": group_cases}, timeout,
                            what=f"ring_all_reduce with {size} ranks")
        except AssertionError as err:
            if not any(text in str(err) for text in ("hung", "Timed out", "timeout")):
                raise
            raise AssertionError(f"{err}\n{HUNG_HINT}") from None
        for i, (shape, dtype) in enumerate(cases):
            expected = sum(ring_input(shape, dtype, r, i).double() for r in range(size)).numpy()
            for rank, got in enumerate(res):
                _check_values(got[i], expected, rank, list(range(size)), shape, dtype)
        for i, (shape, _) in enumerate(cases):
            for rank, got in enumerate(res):
                _check_structure(got[i]["calls"], rank, list(range(size)), math.prod(shape))
        for j, (shape, dtype) in enumerate(group_cases):
            for rank, got in enumerate(res):
                _check_group_case(got[len(cases) + j], rank, size, shape, dtype,
                                  GROUP_CASE0 + j)


def _check_group_case(got, rank, size, shape, dtype, case):
    ring = group_of(rank, size)
    _check_hidden(got["calls"], rank)
    expected = sum(ring_input(shape, dtype, r, case).double() for r in ring).numpy()
    _check_values(got, expected, rank, ring, shape, dtype, size)
    _check_structure(got["calls"], rank, ring, math.prod(shape))


def _where(ring, size=None):
    if size is None or ring == list(range(size)):
        return f"with {len(ring)} ranks"
    return f"with group=dist.new_group({ring}) ({len(ring)} of {size} ranks)"


def _neighbours(rank, ring):
    """(right, left) neighbours of ``rank`` in ``ring`` (global ranks in group-rank order)."""
    pos, n = ring.index(rank), len(ring)
    return ring[(pos + 1) % n], ring[(pos - 1) % n]


def _check_values(got, expected, rank, ring, shape, dtype, world=None):
    size = len(ring)
    case = f"a tensor of shape {tuple(shape)}, dtype {dtype}, {_where(ring, world)}"
    over = "all ranks" if world is None else f"the ranks of its group {ring}"
    value = got["value"].astype(np.float64)
    if dtype.startswith("int"):
        bad = value != expected
    else:
        tol = 1e-4 if dtype == "float32" else 1e-10
        bad = ~np.isclose(value, expected, rtol=tol, atol=tol)
    if not got["same"]:
        state = "holds the right sum" if not bad.any() else "does not hold the sum"
        raise AssertionError(
            f"rank {rank}: ring_all_reduce on {case} returned {got['returned']} and the "
            f"input tensor {state}: reduce into `tensor` itself, in place (the chunks of "
            f"tensor.view(-1) are views of it; recv and add_ write into them), and return it.")
    if not bad.any():
        return
    numel, flat = value.size, np.flatnonzero(bad)
    i = int(flat[0])
    msg = (f"rank {rank}: ring_all_reduce on {case} is wrong at {flat.size} of {numel} "
           f"elements (first at flat index {i}: got {value.flat[i]:g}, expected the sum over "
           f"{over} {expected.flat[i]:g}).")
    tail = numel - numel % size
    if numel % size and flat.min() >= tail:
        msg += (f" Only the last numel % world_size = {numel % size} elements are wrong: chunks "
                f"of numel // world_size elements leave the tail out. Split with "
                f"torch.tensor_split(tensor.view(-1), world_size), which handles any length.")
    sends = sum(1 for name, _, _ in got["calls"] if name in SENDS)
    if sends != 2 * (size - 1) and numel >= size:
        msg += (f" Rank {rank} sent {sends} message{'s' * (sends != 1)}; a ring all-reduce sends "
                f"2 * (world_size - 1) = {2 * (size - 1)}: {RING_HINT}.")
    msg += _peer_hint(got["calls"], rank, ring)
    raise AssertionError(msg)


def _peer_hint(calls, rank, ring):
    """What is wrong with the ranks this rank sent to and received from ("" if nothing)."""
    right, left = _neighbours(rank, ring)
    to = sorted({peer for name, _, peer in calls if name in SENDS and peer is not None})
    fro = sorted({peer for name, _, peer in calls if name not in SENDS and name in P2P
                  and peer is not None})
    if set(to) <= {right} and set(fro) <= {left}:
        return ""
    return (f" Rank {rank} sent to ranks {to} and received from ranks {fro}: in a ring every "
            f"rank sends only to its right neighbour (rank + 1) % world_size (global rank "
            f"{right}) and receives only from its left neighbour (rank - 1) % world_size "
            f"(global rank {left}).")


def _check_hidden(calls, rank):
    used = sorted({name for name, _, _ in calls if name not in P2P})
    hidden = [name for name in used if "." in name]
    if hidden:
        raise AssertionError(
            f"{VIOLATION}: rank {rank} reached {', '.join(hidden)} inside ring_all_reduce, "
            f"below torch.distributed's functions where the check records communication. "
            f"Build the ring only from dist.send / dist.recv (or isend / irecv), as {RING_HINT}.")
    if used:
        raise AssertionError(
            f"rank {rank} called dist.{', dist.'.join(used)} inside ring_all_reduce: build it "
            f"only from dist.send / dist.recv (or isend / irecv), as {RING_HINT}.")


def _check_structure(calls, rank, ring, numel):
    _check_hidden(calls, rank)
    size = len(ring)
    where = f"on {size} ranks" if ring == list(range(size)) else f"in its group {ring}"
    sends = [(n, peer) for name, n, peer in calls if name in SENDS]
    limit = -(-numel // size)
    big = max((n for n, _ in sends), default=0)
    if big > limit:
        raise AssertionError(
            f"rank {rank} sent a message of {big} elements for a tensor of {numel} elements "
            f"{where}: a ring sends chunks of about numel/world_size = {limit} elements; "
            f"see reduce-scatter then all-gather: {RING_HINT}.")
    if len(sends) != 2 * (size - 1) and (numel >= size or len(sends) > 2 * (size - 1)):
        raise AssertionError(
            f"rank {rank} sent {len(sends)} message{'s' * (len(sends) != 1)} for a tensor of "
            f"{numel} elements {where}; a ring all-reduce sends exactly "
            f"2 * (world_size - 1) = {2 * (size - 1)} messages: {RING_HINT}.")
    hint = _peer_hint(calls, rank, ring)
    if hint:
        raise AssertionError(f"rank {rank}, a tensor of {numel} elements {where}:{hint}")
