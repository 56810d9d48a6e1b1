"""What notebook 10's tensor- and pipeline-parallel launches may put on the wire (the judge's: no
probe imports this module, so at grading no rank can read it).

Where links are observed (grading; :func:`exercise_utils.harness.observing`) every launch of
``check_tensor_parallel`` and ``check_pipeline`` runs each rank as a host of a mesh and the judge
reads the bytes of every link from the kernel's counters, outside the ranks: whatever the ranks
do to the recorders in their own memory, they must carry what the notebook asks for. Each
launch then holds wide inputs more (:data:`.nets.WIRE_BLOCKS`, :data:`.nets.PP_WIRE_RUNS`), so
that hidden traffic stands far above the set-up and the headers of the small calls.

* :func:`tp_wire_envelope`, all links together (the core's model,
  :func:`exercise_utils.wire.envelope`): per block one all-reduce of its output in forward and
  one of the input's gradient in backward, f and g alone (one each), the two row-parallel
  layers' forwards, plus what the probe sends itself (the broadcast of rank 0's number; the
  harness's closing barrier) and the set-up;
* :func:`pp_wire_envelope`, per directed link: from stage s to s + 1 each micro-batch's
  activation (after at most one header of :data:`HEADER_MOST` bytes) of each call, from s + 1
  to s its gradient, each link also the acknowledgements of what comes the other way
  (:data:`exercise_utils.wire.OVERHEAD` of it) and :data:`exercise_utils.wire.PER_MESSAGE`
  bytes per message either way; every link :data:`LINK_SETUP` bytes of set-up. Links between
  stages that are not neighbours carry that set-up only.

Used in 10_bonus_model_parallel (by :mod:`.checks` and :mod:`.checks_pp`).
"""
from .. import wire
from ..contract import fail
from .nets import D_MODEL, PP_LAYERS, PP_WIDTHS, rows_of

ITEM = {"float32": 4, "float64": 8}
HEADER_MOST = 1024       # bytes of the header before an activation (the given one: 10 int64)
LINK_SETUP = 32_000      # bytes per link beyond the messages: the group's set-up, the closing
#                          barrier (links between stages that are not neighbours: 1.8 to 2.7 kB
#                          measured for right files)
# what the probe of check_tensor_parallel runs beside the blocks (:mod:`.probes`): f and g
# alone on (3, 4) float64 tensors, row-parallel Linear(2 N, 3 N) forwards on 5 rows, float64
F_G_NUMEL, LAYER_ROWS, LAYER_OUT = 12, 5, 3


def tp_calls(size, run):
    """The collectives (``(kind, bytes)``) a launch of ``check_tensor_parallel`` with ``size``
    ranks makes over the blocks ``run`` (:func:`.nets.blocks`)."""
    calls = [("broadcast", 8)] + [("all_reduce", F_G_NUMEL * 8)] * 2
    calls += [("all_reduce", LAYER_ROWS * LAYER_OUT * size * 8)] * 2
    for name, _, dtype, _ in run:
        batch, seq = rows_of(name)
        calls += [("all_reduce", batch * seq * D_MODEL * ITEM[dtype])] * 2
    return calls + [("barrier", 0)]


def tp_wire_envelope(size, run):
    """``(least, most)`` bytes all links of the launch carry (see the module docstring)."""
    return wire.envelope(tp_calls(size, run), size)


def check_tp_wire(links, size, run):
    """Fail ``tp-wire`` when the bytes the network counted (``links``, read outside the ranks;
    empty where not observed) lie outside :func:`tp_wire_envelope`."""
    wire.check(links, tp_wire_envelope(size, run), "tp-wire",
               f"with {size} ranks, over {len(run)} parallel MLP and attention blocks",
               "per block one dist.all_reduce of the output in forward (g) and one of the "
               "input's gradient in backward (f), nothing else (the hidden activation never "
               "leaves the rank)")


def micro_rows(batch, m):
    """Rows of each micro-batch (``torch.tensor_split`` of ``batch`` rows into ``m``)."""
    return [batch // m + (1 if j < batch % m else 0) for j in range(m)]


def pp_wire_envelope(size, runs):
    """``{(i, j): (least, most)}`` bytes rank i may send to rank j over ``runs`` (the
    pipeline's, each ``pipeline_step`` called twice); see the module docstring."""
    bounds = {(i, j): [0, 0] for i in range(size) for j in range(size) if i != j}
    per = PP_LAYERS // size
    for _, dtype, _, m, batch in runs:
        for s in range(size - 1):
            for rows in micro_rows(batch, m):
                data = 2 * rows * PP_WIDTHS[(s + 1) * per] * ITEM[dtype]   # two calls
                ahead = data + 2 * HEADER_MOST
                messages = 2 * 3 * wire.PER_MESSAGE      # header, activation, gradient: twice
                down, up = bounds[s, s + 1], bounds[s + 1, s]
                down[0] += data
                up[0] += data
                down[1] += ahead * (1 + wire.OVERHEAD) + data * wire.OVERHEAD + messages
                up[1] += data * (1 + wire.OVERHEAD) + ahead * wire.OVERHEAD + messages
    return {link: (int(lo * (1 - wire.OVERHEAD)), int(hi) + LINK_SETUP)
            for link, (lo, hi) in bounds.items()}


def check_pp_wire(links, size, runs):
    """Fail ``pp-wire`` when the bytes the network counted on a directed link (``links``, read
    outside the ranks; empty where not observed) lie outside :func:`pp_wire_envelope`."""
    if not links:
        return
    for (i, j), (least, most) in sorted(pp_wire_envelope(size, runs).items()):
        sent = links.get((i, j), 0)
        if least <= sent <= most:
            continue
        role = ("the next stage" if j == i + 1 else "the previous stage" if j == i - 1
                else "not a neighbouring stage")
        carried = ("the set-up only" if abs(i - j) > 1 else
                   "the activations of every micro-batch (each after at most one header)"
                   if j == i + 1 else "the gradients of every micro-batch")
        why = ("more: data sent beside the messages the check records (through a "
               "ProcessGroup or a handle of your own?)" if sent > most else
               "less: the messages the check recorded did not all carry what they seem to")
        fail("pp-wire",
             f"with {size} ranks, the network counted {sent:,} bytes sent by stage {i} to "
             f"stage {j} ({role}) over the check's {len(runs)} runs of two pipeline_step "
             f"calls each; that link carries {carried}: {least:,} to {most:,} bytes (headers "
             f"and set-up included). Your ranks sent {why}; the bytes come from the kernel's "
             f"counters of each link, read outside the ranks. Stage s sends only its outputs "
             f"to s + 1 and its input's gradients to s - 1, nothing else, to nobody else.")
