"""What a launch may put on the wire: the judge's bounds on the bytes a mesh's links carry.

At grading every launch's ranks run on the hosts of a mesh (:mod:`.hosts`) and the judge reads
the byte counter of every link from outside the ranks (:func:`.harness.run_ranks`'s
``links``): nothing a rank does to the recorders in its own memory changes them. A check that
states the communication its contract asks for lists it as calls, each once for the whole
group (``(kind, nbytes)``: a collective, or one point-to-point message), and
:func:`envelope` says the least and the most bytes all links together may then carry;
:func:`check` fails the case when the counters lie outside.

What one call puts on all links together, over ``n`` ranks (measured on the mesh, gloo and
MPICH over TCP alike, 768 kB tensors: ``tests/test_wire.py``; within 2.5%), with ``B`` its
tensor's bytes:

* all-reduce ``2 (n - 1) B``; a reduce-scatter as much (gloo all-reduces and keeps its part;
  ``B`` its input);
* broadcast, all-gather (``B`` the whole output), all-to-all ``(n - 1) B``;
* reduce between ``(n - 1) B`` and ``1.5 (n - 1) B`` (the root's neighbours forward partial
  sums: 1.5 with 2 ranks, 1.34 with 3);
* scatter, gather (``B`` the root's whole buffer) ``(n - 1) B / n``;
* a point-to-point message ``B``; a barrier a few kB at most.

On top: headers (up to :data:`OVERHEAD` of the data, and :data:`PER_MESSAGE` bytes for each
of a collective's ``2 n (n - 1)`` messages) and the group's set-up (:data:`SETUP`: an empty run
measured 5 to 14 kB with gloo, 37 to 75 kB with MPI).

Used by the checks that observe their launches on the wire (03, 06, 07, 08, 09, 10).
"""
from .contract import fail

OVERHEAD = 0.05          # headers in proportion to the data (measured 0.2-2.5%)
PER_MESSAGE = 800        # bytes per message of a collective (TCP/IP and gloo headers, acks)
SETUP = 256_000          # bytes on all links beyond the calls: set-up, barriers, the probe's own
# bytes on all links per call, as (least, most) multiples of B: f(n)
_ALL_REDUCE = (lambda n: 2 * (n - 1), lambda n: 2 * (n - 1))
_ONCE = (lambda n: n - 1, lambda n: n - 1)
_SPREAD = (lambda n: (n - 1) / n, lambda n: (n - 1) / n)
VOLUME = {"all_reduce": _ALL_REDUCE, "reduce_scatter": _ALL_REDUCE,
          "broadcast": _ONCE, "all_gather": _ONCE, "all_to_all": _ONCE,
          "reduce": (lambda n: n - 1, lambda n: 1.5 * (n - 1)),
          "scatter": _SPREAD, "gather": _SPREAD,
          "send": (lambda n: 1, lambda n: 1), "barrier": (lambda n: 0, lambda n: 0)}


# Headers per call of a small gloo collective (up to a few kB), bytes on all links together:
# measured on the mesh (40 calls of 1 to 2048 elements, twice) and 7% added. 2 ranks: all-reduce
# 2.86-3.08 kB (0.8 kB for one element), broadcast 383-394, all-gather 1.46-1.50 kB, gather 392,
# barrier 740-780; 3 ranks: all-reduce 6.3-9.7 kB, broadcast 800-812, all-gather 4.67-4.69 kB,
# gather 808, barrier 2.38-2.44 kB. Other sizes: 2 n (n - 1) messages of PER_MESSAGE. An
# all-reduce of one element (8 bytes at most) takes gloo's short way ("scalar").
HEADERS = {2: {"all_reduce": 3_300, "scalar": 900, "broadcast": 450, "all_gather": 1_650,
               "gather": 450, "scatter": 450, "barrier": 850},
           3: {"all_reduce": 10_400, "scalar": 1_750, "broadcast": 900, "all_gather": 5_100,
               "gather": 900, "scatter": 900, "barrier": 2_700}}
# Bytes beyond the calls of a gloo launch: the group's set-up, the probe's last barrier, its
# teardown (an empty launch measured 4.2-5.3 kB with 2 ranks, 11.3-11.8 kB with 3)
BASE = {2: 12_000, 3: 24_000}


def volume(kind, nbytes, size):
    """``(least, most)`` bytes one call ``kind`` of ``nbytes`` puts on all links over ``size``
    ranks (see the module docstring), headers and set-up not included."""
    low, high = VOLUME[kind]
    return low(size) * nbytes, high(size) * nbytes


def envelope(calls, size, setup=SETUP):
    """``(least, most)`` bytes all links of a launch of ``size`` ranks carry when its ranks
    make ``calls`` (``[(kind, nbytes)]``, each collective once for the whole group) and nothing
    else: the data, within :data:`OVERHEAD`, plus at most :data:`PER_MESSAGE` bytes per
    message of a collective and ``setup``."""
    least = most = 0.0
    messages = 0
    for kind, nbytes in calls:
        low, high = volume(kind, nbytes, size)
        least, most = least + low, most + high
        messages += 1 if kind == "send" else 2 * size * (size - 1)
    return (int(least * (1 - OVERHEAD)),
            int(most * (1 + OVERHEAD) + messages * PER_MESSAGE + setup))


def header(kind, nbytes, size):
    """Bytes of headers one call ``kind`` of ``nbytes`` puts on all links over ``size`` ranks,
    at most (:data:`HEADERS`)."""
    if kind == "all_reduce" and nbytes <= 8:
        kind = "scalar"
    return HEADERS.get(size, {}).get(kind, 2 * size * (size - 1) * PER_MESSAGE)


def small_calls(least_calls, most_calls, size, base=None):
    """``(least, most)`` bytes on all links of a gloo launch of small calls, whose headers
    outweigh their data: the least the data of ``least_calls`` (no set-up), the most the data
    of ``most_calls`` with :data:`OVERHEAD`, their headers as measured (:func:`header`) and
    ``base`` (default: :data:`BASE`'s for ``size``, else :data:`SETUP`)."""
    least, _ = envelope(least_calls, size, setup=0)
    data = sum(volume(kind, nbytes, size)[1] for kind, nbytes in most_calls)
    heads = sum(header(kind, nbytes, size) for kind, nbytes in most_calls)
    base = BASE.get(size, SETUP) if base is None else base
    return least, int(data * (1 + OVERHEAD) + heads + base)


def check(links, bounds, case, what, asked):
    """Fail ``case`` when the bytes all ``links`` carried (``{(i, j): bytes}``, observed by the
    judge; empty or None where they were not) lie outside ``bounds`` (``(least, most)``).

    Args:
        what: the launch, for the message ("average_gradients with 3 ranks").
        asked: what the notebook asks its ranks to send, in words ("one all_reduce of every
            gradient per step").
    """
    if not links:
        return
    sent, (least, most) = sum(links.values()), bounds
    if least <= sent <= most:
        return
    if sent > most:
        why = ("more than that: data sent beside the calls the check records (through a "
               "ProcessGroup, a communicator or a handle of your own?), or sent twice")
    else:
        why = ("less than that: the calls the check recorded did not all carry what they "
               "seem to (results computed without the other ranks' data?)")
    fail(case, f"{what}: the network counted {sent:,} bytes on all links between the ranks; "
               f"{asked} puts between {least:,} and {most:,} bytes there (headers and set-up "
               f"included). Your ranks sent {why}.")
