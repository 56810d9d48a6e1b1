"""What notebook 11's vocabulary-split, ring-attention, sequence-parallel and composed-step
launches may put on the wire (the judge's: no probe imports this module, so at grading no rank can read it).

Where links are observed (grading; :func:`exercise_utils.harness.observing`) every launch of
``check_vocab_parallel``, ``check_ring_attention``, ``check_sequence_parallel`` and
``check_composed_step`` runs each rank as a host of a mesh and the
judge reads the bytes of every link from the kernel's counters, outside the ranks: whatever the
ranks do to the recorders in their own memory, they must carry what the notebook asks for. Each
launch then holds wide float64 parts more (:data:`.inputs.SIZES` ``"wire"``, and the ring's
:data:`.inputs.RING_WIRE_CASE`), so that hidden traffic (the table or the logits gathered, a
block of keys sent to a rank that is not a ring neighbour) stands far above the set-up.

* :func:`vocab_envelope`, all links together (the core's model,
  :func:`exercise_utils.wire.envelope`), per tensor-parallel group: ``ReduceFromGroup`` alone,
  each embedding forward's all-reduce of its output, each loss's three all-reduces of ``N``
  numbers; over the world the probe's own calls (rank 0's number, a flag per embedding part)
  and the set-up;
* :func:`ring_envelope`, per directed link: from each rank to the next of its ring, every
  forward's ``c - 1`` blocks of keys and values (sent at most whole: a block's ``k`` and ``v``)
  and every backward's ``c`` blocks with their gradients (the last hop's keys and values may be
  left out: least), each number at most 8 bytes (a file may accumulate the gradients in
  float64); links between ranks that are not ring neighbours carry the set-up only;
* :func:`sp_envelope`, all links together, per tensor-parallel group: in each forward and
  each backward one all-gather and one reduce-scatter of the whole sequence's activations
  (gloo's reduce-scatter all-reduces: as many bytes), and ``sequence_parallel_grads``'s
  all-reduces of the replicated parameters' gradients; the probe's broadcast and the set-up;
  a wide block (:data:`.inputs.SP_SIZES` ``"wire"``) whose weights dwarf its activations;
* :func:`step_envelope`, all links together: per step of ``check_composed_step`` the
  tensor-parallel groups' all-reduces, the pipeline's messages, the data-parallel groups'
  all-reduces of the gradients (at most one per parameter) and of the loss, the loss over the
  pipeline groups; the groups each ``Mesh`` makes; a wide model's step on the first mesh
  (:data:`.inputs.GPT_WIRE_SIZES`) makes the gradients' all-reduces the bulk of the bytes.

Used in 11_bonus_composed (by :mod:`.checks`, :mod:`.checks_ring`, :mod:`.checks_sp` and
:mod:`.checks_step`).
"""
from .. import wire
from ..contract import fail
from . import inputs

ITEM = {"float32": 4, "float64": 8}
LINK_SETUP = 32_000      # bytes per link beyond the messages (set-up, the closing barrier)


def vocab_calls(t, wide):
    """The collectives (``(kind, bytes)``) one tensor-parallel group of ``t`` ranks makes in a
    launch of ``check_vocab_parallel`` (``wide``: with the wire parts)."""
    calls = [("all_reduce", 12 * 8)]                         # ReduceFromGroup on (3, 4) float64
    parts = [("float64", "small"), ("float32", "small")] + ([("float64", "wire")] if wide else [])
    for dtype, size in parts:
        _, d, rows, tokens = inputs.SIZES[size]
        outputs = [tokens[0] * tokens[1] * d] + ([tokens[1] * d] if size == "small" else [])
        calls += [("all_reduce", n * ITEM[dtype]) for n in outputs]
        calls += [("all_reduce", rows * ITEM[dtype])] * 3
    return calls


def _launch_envelope(size, groups, world, calls):
    """``(least, most)`` bytes all links of a launch of ``size`` ranks carry: the probe's own
    ``world`` calls over all of them (and the set-up), then over each of its tensor-parallel
    ``groups`` (None: the world) the calls ``calls(t)`` gives for a group of ``t``: ``(the
    fewest, the most)``."""
    groups = [tuple(range(size))] if groups is None else groups
    least, most = wire.envelope(world, size)
    for g in groups:
        fewest, every = calls(len(g))
        least += wire.envelope(fewest, len(g), setup=0)[0]
        most += wire.envelope(every, len(g), setup=0)[1]
    return least, most


def vocab_envelope(size, groups, wide):
    """``(least, most)`` bytes all links of a launch of ``size`` ranks carry, ``groups`` its
    tensor-parallel groups (None: the world)."""
    world = [("broadcast", 8)] + [("all_reduce", 8)] * (3 if wide else 2) + [("barrier", 0)]
    return _launch_envelope(size, groups, world, lambda t: (vocab_calls(t, wide),) * 2)


def check_vocab_wire(links, size, groups, launch):
    """Fail ``vp-wire`` when the bytes the network counted (``links``, read outside the ranks;
    empty where not observed) lie outside :func:`vocab_envelope`."""
    wire.check(links, vocab_envelope(size, groups, True), "vp-wire",
               f"check_vocab_parallel with {launch}",
               "per group one all_reduce in ReduceFromGroup, one of the output in each "
               "embedding forward and three of N numbers in each loss's forward, nothing else "
               "(the table and the logits never leave their ranks)")


def ring_envelope(size, rings, cases):
    """``{(i, j): (least, most)}`` bytes rank i may send to rank j over the ``rings`` of a
    launch (lists of global ranks) and its ``cases`` (:data:`.inputs.RING_CASES` rows)."""
    bounds = {(i, j): [0, 0] for i in range(size) for j in range(size) if i != j}
    for ring in rings:
        c = len(ring)
        if c == 1:
            continue
        for case in cases:
            _, dtype, kind, _, S = case
            item = ITEM[str(dtype).replace("torch.", "")]
            lengths = [len(p) for p in inputs.layout(kind, S, c)]
            block = [inputs.B * inputs.H * n * inputs.head_dim(case) for n in lengths]
            for me, rank in enumerate(ring):
                nxt = ring[(me + 1) % c]
                held = [(me - step) % c for step in range(c)]
                forward = sum(2 * block[src] for src in held[:-1])
                backward = sum(4 * block[src] for src in held)
                least = item * (forward + backward - 2 * block[held[-1]])
                most = 8 * (forward + backward)
                msgs = 4 * (2 * c - 1)                     # k, v apart; k, v, dk, dv apart
                link = bounds[rank, nxt]
                link[0] += least
                link[1] += most * (1 + wire.OVERHEAD) + msgs * wire.PER_MESSAGE
                back = bounds[nxt, rank]                   # the acknowledgements
                back[1] += most * wire.OVERHEAD + msgs * wire.PER_MESSAGE
    return {link: (int(lo * (1 - wire.OVERHEAD)), int(hi) + LINK_SETUP)
            for link, (lo, hi) in bounds.items()}


def check_ring_wire(links, size, rings, cases, launch):
    """Fail ``ring-wire`` when the bytes the network counted on a directed link (``links``, read
    outside the ranks; empty where not observed) lie outside :func:`ring_envelope`."""
    if not links:
        return
    for (i, j), (least, most) in sorted(ring_envelope(size, rings, cases).items()):
        sent = links.get((i, j), 0)
        if least <= sent <= most:
            continue
        neighbours = any(len(r) > 1 and i in r and r[(r.index(i) + 1) % len(r)] == j
                         for r in rings)
        carried = ("every block of keys and values it passes on, and their gradients in the "
                   "backward" if neighbours else "the set-up only: no ring makes rank "
                   f"{j} the next of rank {i}")
        why = ("more: data sent beside the messages the check records (through a "
               "ProcessGroup or a handle of your own?)" if sent > most else
               "less: the messages the check recorded did not all carry what they seem to")
        fail("ring-wire",
             f"with {launch}, the network counted {sent:,} bytes sent by rank {i} to rank {j}; "
             f"that link carries {carried}: {least:,} to {most:,} bytes (headers and set-up "
             f"included). Your ranks sent {why}; the bytes come from the kernel's counters of "
             f"each link, read outside the ranks. A rank sends only to the next rank of its "
             f"ring.")


# ------------------------------------------------------------------ sequence parallelism
def sp_calls(t, wide):
    """``(least calls, most calls)`` (``(kind, bytes)``) one tensor-parallel group of ``t``
    ranks makes in a launch of ``check_sequence_parallel`` (``wide``: with the wire part): per
    part an all-gather and a reduce-scatter of the whole sequence's activations each way, and
    the replicated parameters' gradients all-reduced (least: in one call; most: one call each)."""
    least, most = [], []
    for name, (dtype, size) in inputs.SP_PARTS.items():
        if size == "wire" and not wide:
            continue
        S, B, d, _ = inputs.SP_SIZES[size]
        whole = S * B * d * ITEM[dtype]
        moves = [("all_gather", whole), ("reduce_scatter", whole)] * 2
        least += moves + [("all_reduce", 3 * d * ITEM[dtype])]
        most += moves + [("all_reduce", d * ITEM[dtype])] * 3
    return least, most


def sp_envelope(size, groups, wide):
    """``(least, most)`` bytes all links of a launch of ``size`` ranks carry, ``groups`` its
    tensor-parallel groups (None: the world)."""
    return _launch_envelope(size, groups, [("broadcast", 8), ("barrier", 0)],
                            lambda t: sp_calls(t, wide))


def check_sp_wire(links, size, groups, launch):
    """Fail ``sp-wire`` when the bytes the network counted (``links``, read outside the ranks;
    empty where not observed) lie outside :func:`sp_envelope`."""
    wire.check(links, sp_envelope(size, groups, True), "sp-wire",
               f"check_sequence_parallel with {launch}",
               "per group, in each forward and each backward, one all-gather and one "
               "reduce-scatter of the sequence's activations, and the all-reduces of the "
               "replicated parameters' gradients, nothing else (the weights never leave their "
               "ranks)")


# ------------------------------------------------------------------ the composed step
GROUP_SETUP = 16_000     # bytes on all links per process group a Mesh makes (the store's keys)
# headers beyond the core's OVERHEAD: the gradients' all-reduces are tensors of 0.1 to 300 kB,
# whose TCP segments and acknowledgements weigh more than those of the core's 768 kB
# (measured: the solution and the right files put 1.07-1.19 times the data on the links)
STEP_HEADERS = 0.10


def _stage_params(sizes, p, pp, tp):
    """The sizes (numbers) of the parameters of stage ``p`` of ``pp`` on one of ``tp`` ranks."""
    V, d, _, h, L, S = sizes
    nb = L // pp + (1 if p < L % pp else 0)
    block = [d, d, 3 * d // tp * d, 3 * d // tp, d * (d // tp), d, d, d, h // tp * d, h // tp,
             d * (h // tp), d]
    return (([V // tp * d, S * d] if p == 0 else []) + block * nb
            + ([d, d, V // tp * d] if p == pp - 1 else []))


def step_calls(shape, sizes, item):
    """``{group size: (least calls, most calls)}``: the collectives and messages of one
    composed step on a ``(dp, pp, tp)`` mesh of a model of ``sizes``, numbers of ``item``
    bytes, every group's together (least: each call's data as the notebook names it; most: one
    all-reduce per parameter, the loss all-reduced over every data-parallel and pipeline
    group)."""
    dp, pp, tp = shape
    V, d, _, _, L, S = sizes
    b = inputs.GPT_BATCH // dp
    act, rows = b * S * d * item, b * S * item
    out = {}

    def add(n, least, most):
        lo, hi = out.setdefault(n, ([], []))
        lo += least
        hi += most
    sends = [("send", act)] * (2 * (pp - 1) * dp * tp)   # (a message: B on one link, any n)
    add(2, sends, sends)
    for p in range(pp):
        nb = L // pp + (1 if p < L % pp else 0)
        tp_calls = ([("all_reduce", act)] * (4 * nb + (p == 0) + (p == pp - 1))
                    + [("all_reduce", rows)] * (3 * (p == pp - 1)))
        add(tp, tp_calls * dp, tp_calls * dp)
        grads = _stage_params(sizes, p, pp, tp)
        add(dp, [("all_reduce", sum(grads) * item)] * tp,
            ([("all_reduce", n * item) for n in grads] + [("all_reduce", 8)]) * tp)
    add(pp, [("broadcast", 8)] * (dp * tp), [("all_reduce", 8)] * (dp * tp))
    return out


def step_envelope(size, shapes, wide):
    """``(least, most)`` bytes all links of a launch of ``check_composed_step`` carry: its
    meshes' groups made, on the first mesh two float64 steps, one float32 and (``wide``) the wide
    one, on the others two float64 steps; the probe's own broadcast and the set-up."""
    least, most = wire.envelope([("broadcast", 8)], size)
    for index, shape in enumerate(shapes):
        runs = [(inputs.GPT_SIZES, 8)] * 2 + ([(inputs.GPT_SIZES, 4)] if index == 0 else [])
        runs += [(inputs.GPT_WIRE_SIZES, 8)] if index == 0 and wide else []
        dp, pp, tp = shape
        most += GROUP_SETUP * (pp * tp + dp * tp + dp * pp)
        for sizes, item in runs:
            for n, (lo, hi) in step_calls(shape, sizes, item).items():
                if n > 1:
                    least += wire.envelope(lo, n, setup=0)[0]
                    most += wire.envelope(hi, n, setup=0)[1] + STEP_HEADERS * sum(
                        wire.volume(kind, nbytes, n)[1] for kind, nbytes in hi)
    return int(least), int(most)


def check_step_wire(links, size, shapes, launch):
    """Fail ``step-wire`` when the bytes the network counted (``links``, read outside the ranks;
    empty where not observed) lie outside :func:`step_envelope`."""
    wire.check(links, step_envelope(size, shapes, True), "step-wire",
               f"check_composed_step with {launch}",
               "each step's all-reduces over the tensor-parallel groups, the activations and "
               "their gradients between neighbouring stages, the gradients' all-reduces over "
               "the data-parallel groups and the loss, nothing else")
