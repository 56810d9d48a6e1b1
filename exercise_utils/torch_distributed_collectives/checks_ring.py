"""Checker of notebook 03's ring all-reduce exercise (``work/03_ring_allreduce.py``).

:func:`check_ring_allreduce` runs the student's ``ring_all_reduce`` in fresh gloo processes
(world sizes 3, 4 and 2, one launch each) on many tensors (:func:`.probes_ring.ring_cases`): a
baseline, then one dimension changed at a time: lengths that do not divide by the world size,
2-D and 3-D shapes, float64, int64 and int32 values beyond what float64 and float32 hold,
tensors smaller than the world (one element, none at all: shape (0, 3)). It checks the numbers
(exact for integers), that the tensor is reduced in place and returned, and the structure of a
ring: while the student's code runs, the probe (:func:`.probes_ring.probe_ring`) records every
``torch.distributed`` call, so each rank must send ``2 * (world_size - 1)`` messages of at most
``ceil(numel / world_size)`` elements, only to its right neighbour (receiving only from its
left one), and call no collective. With 4 ranks the ring also runs inside process groups of
non-consecutive ranks (``group=``: ranks 0, 2 and 3 beside rank 1 alone) whose sums must cover
their own ranks only.

Every failure is a :class:`~exercise_utils.contract.CheckFailure` naming the case of the
contract (:mod:`.requirements`): on the baseline each aspect has its own case (``ring-sum``,
``ring-in-place``, ``ring-p2p-only``, ``ring-messages``, ``ring-neighbours``); on any other
input, whatever fails is charged to that input's case (``ring-uneven``, ``ring-float64``, ...);
a hang is ``ring-deadlock``.

At grading (:func:`exercise_utils.harness.observing`) the launch with 3 ranks
(:data:`OBSERVED_SIZE`: the neighbours differ; a file that passes there has shown it can run a
ring) runs on a mesh of network namespaces and the judge reads the bytes of every directed link
from the kernel: with one large input more (:data:`WIRE_CASE`) each link must carry what a ring puts
there (:func:`wire_envelope`), else ``ring-wire`` fails, whatever the ranks did to the
recorders in their own memory. There each rank's inputs also derive from a number only it was
given (``ctx.salt``, in a folder no other rank's sandbox can read): a rank cannot rebuild the
others' tensors and sum them locally, it must receive them, on the links the judge counts.

Used in 03_torch_distributed_collectives.
"""
import math

import numpy as np

from ..contract import CheckFailure, fail
from ..harness import HANG_AFTER, check, observing, run_ranks
from ..integrity import VIOLATION
from ..recorder import P2P, SENDS
from . import probes_ring
from .probes_ring import GROUP_CASE0, GROUP_CASES, GROUPS, group_of, ring_cases, ring_sum

TIMEOUT = HANG_AFTER     # seconds without progress before a launch is a hang (harness)
WORLD_SIZES = (3, 4, 2)     # one launch each; 3 first (the neighbours differ), 4 with groups
HUNG_HINT = ("With gloo, a send starts only once the peer has posted the matching receive: if "
             "every rank sends first with dist.send and receives afterwards, all of them wait "
             "forever. Post the receive with r = dist.irecv(...), then the send with "
             "s = dist.isend(...), then r.wait() and s.wait(); and make every rank run the "
             "same number of steps.")
RING_HINT = ("a ring all-reduce is a reduce-scatter (world_size - 1 steps, each adding one "
             "received chunk) then an all-gather (world_size - 1 steps, each passing on one "
             "complete chunk), on the chunks torch.tensor_split(tensor.view(-1), world_size)")
BASELINE = "ring-sum"
# Where links are observed (grading; :func:`exercise_utils.harness.observing`): one large input
# more, so that what the ring puts on the wire stands far above what setting up the group costs.
WIRE_CASE = ("ring-wire", (1 << 20,), "float32")
OBSERVED_SIZE = 3       # the launch observed: each observed launch starts a fresh interpreter
#                         per rank on its own host (about 10 s on 2 cores), not the zygote's
WIRE_SLACK = 64_000     # bytes per link beyond the data: the group's set-up and barriers (an
#                         empty run measured 1-4 kB per link; tests/test_wire.py holds it)
MESSAGE_SLACK = 1_000   # bytes per message: TCP/IP and gloo headers, acknowledgements
WIRE_OVERHEAD = 0.05    # headers in proportion to the data (measured 0.2-1.4%)
# What each input case holds the ring to (the docstring's words), for the messages.
PROMISES = {
    "ring-sum": "Returns: ``tensor`` itself, holding the element-wise sum of every rank's input",
    "ring-uneven": "lengths need not divide evenly: torch.tensor_split gives the first "
                   "numel % world_size chunks one more element",
    "ring-shape": "any shape: work on the flattened view tensor.view(-1)",
    "ring-float64": "any dtype gloo can send: a float64 tensor is summed in float64",
    "ring-integer": "Integer tensors are summed exactly, in their own dtype: never through a "
                    "float buffer (float64 holds every integer only up to 2**53, float32 up to "
                    "2**24)",
    "ring-small": "lengths need not divide evenly; some chunks may be empty (a tensor smaller "
                  "than the world, or with no element at all)",
    "ring-group": "Sum over the ranks of ``group`` only; send/recv take global ranks: translate "
                  "the group rank r with dist.get_global_rank(group, r)",
}


@check
def check_ring_allreduce(path, timeout=TIMEOUT):
    """Check ``ring_all_reduce`` of ``path``: sums, in place, chunked ring messages only.

    With 4 ranks it also runs the ring inside process groups of non-consecutive ranks
    (``group=``), whose sums must cover their own group only (:data:`.probes_ring.GROUPS`).

    Args:
        path: the student file (``work/03_ring_allreduce.py``).
        timeout: seconds per launch before the ranks are declared hung.
    Raises:
        CheckFailure: with what to change, naming the rank, the case and the numbers.
    """
    for size in WORLD_SIZES:
        observed = observing() and size == OBSERVED_SIZE
        cases = ring_cases(size) + ([WIRE_CASE] if observed else [])
        group_cases = GROUP_CASES if size in GROUPS else []
        links, salts = {}, {}
        try:
            res = run_ranks(path, probes_ring.probe_ring, size, "gloo",
                            {"cases": cases, "group_cases": group_cases}, timeout,
                            what=f"ring_all_reduce with {size} ranks", case=BASELINE,
                            links=links if observed else None, salts=salts)
        except CheckFailure as err:
            if not any(text in str(err) for text in ("hung", "Timed out", "timeout")):
                raise
            fail("ring-deadlock", f"{err}\n{HUNG_HINT}")
        for i, (case, shape, dtype) in enumerate(cases):
            expected = ring_sum(shape, dtype, range(size), i, salts)
            for rank, got in enumerate(res):
                _check_case(case, got[i], expected, rank, list(range(size)), shape, dtype)
        for j, (case, shape, dtype) in enumerate(group_cases):
            for rank, got in enumerate(res):
                ring = group_of(rank, size)
                expected = ring_sum(shape, dtype, ring, GROUP_CASE0 + j, salts)
                _check_case(case, got[len(cases) + j], expected, rank, ring, shape, dtype, size)
        if links and observed:
            _check_wire(links, size, [(shape, dtype, list(range(size))) for _, shape, dtype
                                      in cases] +
                        [(shape, dtype, group) for _, shape, dtype in group_cases
                         for group in GROUPS[size] if len(group) > 1])


def wire_envelope(size, runs):
    """What a ring may put on each directed link over ``runs`` (``(shape, dtype, ranks)``,
    each a ring_all_reduce over ``ranks``): ``{(i, j): (least, most)}`` bytes. Rank i sends
    2 * (n - 1) chunks of tensor_split(numel, n) to its right neighbour: at least the data of
    the smallest chunks, at most that of the largest plus headers; every other link carries
    only headers, acknowledgements and the group's set-up."""
    least = {(i, j): 0 for i in range(size) for j in range(size) if i != j}
    most = {link: WIRE_SLACK for link in least}
    for shape, dtype, ranks in runs:
        n, numel = len(ranks), math.prod(shape)
        item = np.dtype(dtype).itemsize
        for pos, rank in enumerate(ranks):
            right, left = ranks[(pos + 1) % n], ranks[pos - 1]
            data_lo = 2 * (n - 1) * (numel // n) * item
            data_hi = 2 * (n - 1) * -(-numel // n) * item
            least[rank, right] += data_lo
            most[rank, right] += data_hi * (1 + WIRE_OVERHEAD) + 2 * (n - 1) * MESSAGE_SLACK
            # acknowledgements of what the left neighbour sends
            most[rank, left] += data_hi * WIRE_OVERHEAD + 2 * (n - 1) * MESSAGE_SLACK
    return {link: (least[link], int(most[link])) for link in least}


def _check_wire(links, size, runs):
    """The bytes the kernel counted on each link (the judge reads them outside the ranks:
    nothing in the ranks can change them) against :func:`wire_envelope`."""
    envelope = wire_envelope(size, runs)
    total = sum(math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype, _ in runs)
    for (i, j), (least, most) in sorted(envelope.items()):
        sent = links[i, j]
        if least <= sent <= most:
            continue
        neighbour = j == (i + 1) % size
        role = ("its right neighbour" if neighbour else
                "its left neighbour" if j == (i - 1) % size else "not a neighbour")
        fail("ring-wire",
             f"with {size} ranks, the network counted {sent:,} bytes sent by rank {i} to rank "
             f"{j} ({role}) over the check's {len(runs)} ring_all_reduce calls on "
             f"{total:,} bytes of tensors per rank; a ring puts {least:,} to {most:,} bytes "
             f"there (each rank sends 2 * (world_size - 1) chunks of numel / world_size "
             f"elements to its right neighbour, nothing else to anyone). The calls your code "
             f"made through torch.distributed did not show this traffic: the bytes come from "
             f"the kernel's counters of each link, read outside the ranks. "
             f"{RING_HINT[0].upper()}{RING_HINT[1:]}.")


def _check_case(case, got, expected, rank, ring, shape, dtype, world=None):
    """One input on one rank: in place, the numbers, then the ring's structure. On the
    baseline each aspect is its own case; on any other input all are charged to ``case``."""
    numel = math.prod(shape)
    _check_in_place(case if case != BASELINE else "ring-in-place", got, expected, rank, ring,
                    shape, dtype, world)
    _check_values(case, got, expected, rank, ring, shape, dtype, world)
    _check_structure(got["calls"], rank, ring, numel, case)


def _where(ring, size=None):
    if size is None or ring == list(range(size)):
        return f"with {len(ring)} ranks"
    return f"with group=dist.new_group({ring}) ({len(ring)} of {size} ranks)"


def _neighbours(rank, ring):
    """(right, left) neighbours of ``rank`` in ``ring`` (global ranks in group-rank order)."""
    pos, n = ring.index(rank), len(ring)
    return ring[(pos + 1) % n], ring[(pos - 1) % n]


def _describe(shape, dtype, ring, world):
    return f"a tensor of shape {tuple(shape)}, dtype {dtype}, {_where(ring, world)}"


def _wrong(got, expected, dtype):
    """The mask of wrong elements: exact for integers, float32 / float64 tolerances else."""
    if dtype.startswith("int"):
        return got["value"].astype(np.int64) != expected
    tol = 1e-4 if dtype == "float32" else 1e-10     # float64 must not pass through float32
    return ~np.isclose(got["value"].astype(np.float64), expected, rtol=tol, atol=tol)


def _promise(case):
    return f" The docstring: {PROMISES[case]}." if case in PROMISES else ""


def _check_in_place(case, got, expected, rank, ring, shape, dtype, world=None):
    if got["same"]:
        return
    state = "does not hold the sum" if _wrong(got, expected, dtype).any() else "holds the sum"
    fail(case, f"rank {rank}: ring_all_reduce on {_describe(shape, dtype, ring, world)} "
               f"returned {got['returned']} and the input tensor {state}: reduce into `tensor` "
               f"itself, in place (the chunks of tensor.view(-1) are views of it; recv and add_ "
               f"write into them), and return it (the docstring: Sum ``tensor`` over all ranks, "
               f"in place; Returns: ``tensor`` itself).")


def _check_values(case, got, expected, rank, ring, shape, dtype, world=None):
    size = len(ring)
    over = "all ranks" if world is None else f"the ranks of its group {ring}"
    bad = _wrong(got, expected, dtype)
    if not bad.any():
        return
    value = got["value"]
    numel, flat = value.size, np.flatnonzero(bad)
    i = int(flat[0])
    msg = (f"rank {rank}: ring_all_reduce on {_describe(shape, dtype, ring, world)} is wrong at "
           f"{flat.size} of {numel} elements (first at flat index {i}: got {value.flat[i]!r}, "
           f"expected the sum over {over} {expected.flat[i]!r}).")
    tail = numel - numel % size
    if numel % size and flat.min() >= tail:
        msg += (f" Only the last numel % world_size = {numel % size} elements are wrong: chunks "
                f"of numel // world_size elements leave the tail out. Split with "
                f"torch.tensor_split(tensor.view(-1), world_size), which handles any length.")
    if dtype.startswith("int") and np.abs(expected).max() > 2 ** 24:
        msg += (" The values are integers beyond 2**24 (int32) or 2**53 (int64): a float "
                "buffer rounds them; add the chunks in the tensor's own dtype.")
    sends = sum(1 for name, _, _ in got["calls"] if name in SENDS)
    if sends != 2 * (size - 1) and numel >= size:
        msg += (f" Rank {rank} sent {sends} message{'s' * (sends != 1)}; a ring all-reduce sends "
                f"2 * (world_size - 1) = {2 * (size - 1)}: {RING_HINT}.")
    msg += _peer_hint(got["calls"], rank, ring)
    fail(case, msg + _promise(case))


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


def _check_hidden(calls, rank, case):
    used = sorted({name for name, _, _ in calls if name not in P2P})
    hidden = [name for name in used if "." in name]
    if hidden:
        fail(case, f"{VIOLATION}: rank {rank} reached {', '.join(hidden)} inside "
                   f"ring_all_reduce, below torch.distributed's functions where the check "
                   f"records communication. Build the ring only from dist.send / dist.recv (or "
                   f"isend / irecv, or P2POp with batch_isend_irecv), as {RING_HINT}.")
    if used:
        fail(case, f"rank {rank} called dist.{', dist.'.join(used)} inside ring_all_reduce: "
                   f"only dist.send/dist.recv/dist.isend/dist.irecv may communicate (P2POp with "
                   f"batch_isend_irecv too: the docstring), as {RING_HINT}.")


def _check_structure(calls, rank, ring, numel, case):
    """The ring's messages; on the baseline each aspect is its own case."""
    aspect = (lambda name: name) if case == BASELINE else (lambda name: case)
    _check_hidden(calls, rank, aspect("ring-p2p-only"))
    size = len(ring)
    where = f"on {size} ranks" if ring == list(range(size)) else f"in its group {ring}"
    sends = [(n, peer) for name, n, peer in calls if name in SENDS]
    limit = -(-numel // size)
    big = max((n for n, _ in sends), default=0)
    if big > limit:
        fail(aspect("ring-messages"),
             f"rank {rank} sent a message of {big} elements for a tensor of {numel} elements "
             f"{where}: each rank sends 2 * (world_size - 1) messages of about numel / "
             f"world_size = {limit} elements (the docstring); {RING_HINT}.")
    if len(sends) != 2 * (size - 1) and (numel >= size or len(sends) > 2 * (size - 1)):
        fail(aspect("ring-messages"),
             f"rank {rank} sent {len(sends)} message{'s' * (len(sends) != 1)} for a tensor of "
             f"{numel} elements {where}; each rank sends exactly 2 * (world_size - 1) = "
             f"{2 * (size - 1)} messages (the docstring): {RING_HINT}.")
    hint = _peer_hint(calls, rank, ring)
    if hint:
        fail(aspect("ring-neighbours"), f"rank {rank}, a tensor of {numel} elements {where}:{hint}")
