"""What notebook 01's launches may put on the wire (the judge's; no probe imports it).

Where links are observed (at grading: :func:`exercise_utils.harness.observing`) every launch's
ranks run as the hosts of a mesh and MPICH talks over TCP between them: the judge reads the
bytes of every link from the kernel's counters, outside the ranks, whatever they did to the
counters in their own memory. Notebook 01's tensors are tiny (EdgeNet, datasets of a few
samples), and setting MPI up costs 30 to 90 kB a launch (about 1 to 2 kB more per small call,
varying by 20 kB between runs): so every launch of the scatter, broadcast, SGD and averaging
checks (2 and 3 ranks) runs one large case more there (:data:`CASES`: a scatter of 4.9 MB, an
EdgeNet of hidden width 256 in float64, 200k parameters), and all links together must carry,
from the least a correct file sends to the most, with ``n`` ranks (:mod:`exercise_utils.wire`'s
volumes: an Allreduce ``2 (n - 1) B``, a Bcast ``(n - 1) B``, a Reduce ``(n - 1) B`` to
``1.5 (n - 1) B``):

* ``scatter-wire``: every rank but root receives its shard of x and y, nothing more: the
  shards' bytes (Scatter, Scatterv, a scatter of the pieces, Send/Recv alike);
* ``bcast-wire``: root's state_dict once to every other rank, ``(n - 1)`` times its bytes
  (a tied tensor once) up to ``(n - 1)`` times every key's at 8 bytes an element or more (a
  flat float64 buffer, a pickled state_dict);
* ``sgd-wire``: per step one Allreduce of the trained gradient, ``2 (n - 1) G``;
* ``average-wire``: from one Allreduce of the parameters (``2 (n - 1) P``; a Gather to root
  and a Bcast back as much) up to a Reduce and a Bcast of every key of the state_dict at 8
  bytes an element (``2.5 (n - 1)`` times it);

each plus :data:`exercise_utils.wire.OVERHEAD` of headers, :data:`CALL_SLACK` per call and peer
(counted generously: a call per tensor and a few) and the launch's set-up
(:data:`exercise_utils.wire.SETUP`). Measured on the mesh (2 and 3 ranks), the right files of
``tests/right/01_*`` sent 1.07 to 1.08 times the least and 0.87 of the most (scatter), 1.09 to
1.45 and 0.66 to 0.88 (broadcast), 1.06 and 0.93 to 0.94 (SGD), 1.07 to 1.77 and 0.53 to 0.89
(averaging). The cheats of ``tests/cheats/wire/01_*`` land above the most: the whole dataset
sent to every rank through a handle of ``MPI.COMM_WORLD`` beside a counted scatter at 3.4
times (a scatter of the views ``x[a:b]``, whose pickles carry all of x, at 2.6), every rank's
state_dict all-gathered at 2.6, every gradient all-gathered beside the counted Allreduce at
1.9, every rank's parameters all-gathered beside a gather and a broadcast at 1.34.

Used in 01_mpi_parallel_sgd (by :mod:`.checks`).
"""
import numpy as np

from .. import wire
from ..contract import fail
from ..harness import observing, wire_outside
from . import probes
from .inputs import average_model, bcast_model, hidden_of
from .probes import sgd_model

CALL_SLACK = 2_000       # bytes per call and per peer beyond its data: MPICH's headers and
#                          acknowledgements (measured 0.8 kB a call with 2 ranks, 1.7 with 3)
# the large case each launch runs where links are observed (a "-wire" case: inputs.hidden_of)
CASES = {"scatter": ("scatter-wire", 301, 1, "float64", (32, 64)),
         "broadcast": ("bcast-wire", 1, "float64"), "sgd": ("sgd-wire", "float64"),
         "average": ("average-wire", 1, "float64")}
ITEM = {"float32": 4, "float64": 8}
LABEL = 8                # bytes of a y (int64)


def cases(exercise):
    """``[the large case of exercise]`` where links are observed, else ``[]``."""
    return [CASES[exercise]] if observing() else []


def _bounds(least, most, calls, size):
    """``(least, most)`` bytes on all links: ``least`` and ``most`` as ``[(kind, bytes)]``
    (:func:`exercise_utils.wire.volume`), ``calls`` calls of slack."""
    low = sum(wire.volume(kind, nbytes, size)[0] for kind, nbytes in least)
    high = sum(wire.volume(kind, nbytes, size)[1] for kind, nbytes in most)
    return (int(low * (1 - wire.OVERHEAD)),
            int(high * (1 + wire.OVERHEAD) + calls * CALL_SLACK * (size - 1) + wire.SETUP))


def _state_bytes(model):
    """(bytes of the state_dict's distinct tensors, of every key at 8 bytes an element or
    more, keys)."""
    state = model.state_dict()
    distinct = {t.data_ptr(): t.numel() * t.element_size() for t in state.values()}
    widest = sum(t.numel() * max(t.element_size(), 8) for t in state.values())
    return sum(distinct.values()), widest, len(state)


def scatter_envelope(size, runs):
    """``(least, most)`` for the scatters ``runs`` (``(case, n, root, dtype, shape)``): the
    shards of every rank but root, x's and y's."""
    shards, calls = [], 0
    for _, n, root, dtype, shape in runs:
        base, extra = divmod(n, size)
        rows = sum(base + (r < extra) for r in range(size) if r != root)
        shards.append(("send", rows * (int(np.prod(shape)) * ITEM[dtype] + LABEL)))
        calls += 2 * size + 2            # x and y to each rank, and their shapes and dtypes
    return _bounds(shards, shards, calls, size)


def broadcast_envelope(size, runs):
    """``(least, most)`` for the broadcasts ``runs`` (``(case, root, dtype)``)."""
    least, most, calls = [], [], 0
    for case, _, dtype in runs:
        distinct, widest, keys = _state_bytes(bcast_model(0, dtype, hidden=hidden_of(case)))
        least.append(("broadcast", distinct))
        most.append(("broadcast", widest))
        calls += keys + 4
    return _bounds(least, most, calls, size)


def sgd_envelope(size, runs):
    """``(least, most)`` for the SGD runs ``runs`` (``(case, dtype)``): one Allreduce of the
    trained gradient per step."""
    calls = [("all_reduce", numel * ITEM[dtype]) for case, dtype in runs
             for numel in probes.step_numels(sgd_model(dtype, hidden_of(case)), case)]
    return _bounds(calls, calls, len(calls) + 2 * len(runs), size)


def average_envelope(size, runs):
    """``(least, most)`` for the averages ``runs`` (``(case, root, dtype)``)."""
    least, most, calls = [], [], 0
    for case, _, dtype in runs:
        model = average_model(0, dtype, hidden=hidden_of(case))
        _, widest, keys = _state_bytes(model)
        least.append(("all_reduce", sum(p.numel() * p.element_size()
                                        for p in model.parameters())))
        most += [("reduce", widest), ("broadcast", widest)]
        calls += 2 * keys + 4
    return _bounds(least, most, calls, size)


ASKED = {
    "scatter": ("sending each rank only its own shard of x and y (root keeps its own)",
                "a rank received more than its shard: the whole dataset, or a piece whose "
                "pickle carries it (a pickled view x[a:b] holds all of x's storage: send "
                "x[a:b].clone(), or use the buffer API, Scatterv)"),
    "broadcast": ("sending root's state_dict once to every other rank (every tensor once, or "
                  "one flat buffer)",
                  "more than root's state went out: every rank's state to every rank (an "
                  "allgather?), or the same tensors twice"),
    "sgd": ("one comm.Allreduce of the flat gradient buffer per step",
            "data went beside the one Allreduce the check counts (through a communicator or a "
            "handle of MPI.COMM_WORLD it does not see?): send the gradients once, nothing else"),
    "average": ("gathering every rank's parameters on root and sending the average back (or "
                "one Allreduce of them)",
                "more than that went out: every rank's parameters to every rank, or several "
                "times"),
}
CASE = {"scatter": "scatter-wire", "broadcast": "bcast-wire", "sgd": "sgd-wire",
        "average": "average-wire"}


def check(exercise, links, size, what, bounds):
    """Fail ``<exercise>-wire`` where the bytes all ``links`` carried (observed by the judge;
    empty elsewhere) lie outside ``bounds``. ``what``: the launch ("average_weights with 3
    ranks")."""
    found = wire_outside(links, bounds)
    if found is None:
        return
    sent, least, most = found
    asked, more = ASKED[exercise]
    why = (more if sent > most else "less than that: results computed without the other "
           "ranks' data?")
    fail(CASE[exercise],
         f"{what}: the network counted {sent:,} bytes on all links between the ranks over the "
         f"check's calls; {asked} puts {least:,} to {most:,} bytes there (headers and MPI's "
         f"set-up included). The bytes come from the kernel's counters of each link, read "
         f"outside the ranks: {why}.")
