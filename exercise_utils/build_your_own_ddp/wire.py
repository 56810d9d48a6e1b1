"""What notebook 06's launches may put on the wire (the judge's; no rank imports it, so at grading
the sandbox hides it from them).

Where links are observed (at grading, and with ``DTFS_OBSERVE=1`` as root:
:func:`exercise_utils.harness.observing`) every stage runs in launches of its own, rank r on
host r of a mesh, and the judge reads the bytes of every link from the kernel's counters,
outside the ranks: nothing a student file does to the recorder in its own process (a
ProcessGroup method kept from before the recorder watched, its call depth raised) changes them.
All links together must carry what the calls the notebook asks for in that launch put there,
plus the probe's own (:func:`stage_calls`), from the least a right file can send to the most
(:func:`bounds`); the ``"<stage>-wire"`` case fails otherwise (:func:`judge`).

The models are tiny (a few hundred elements): the headers of a call outweigh its data, so the
most counts each call's headers as measured for small gloo collectives on the mesh
(:data:`exercise_utils.wire.HEADERS`; the core otherwise counts ``2 n (n - 1)`` messages of
up to ``PER_MESSAGE`` bytes for every kind, eight times what a small broadcast costs). The data
and its overhead are the core's (:func:`exercise_utils.wire.volume`, ``OVERHEAD``).

Used in 06_build_your_own_ddp (by :mod:`.launches`).
"""
from .. import wire
from . import expected
from . import reference as ref
from .probes import BROADCAST_CASES, OPTIMIZER_CASES
from .probes_grad import BUCKET_CASES, OVERLAP_CASES, REDUCE_CASES, STALE

# Bytes beyond the calls: the core's gloo BASE; under mpiexec, with MPI's own set-up (90-98 kB
# measured), the core's SETUP
BASE = {("none", 2): wire.BASE[2], ("none", 3): wire.BASE[3]}
CASE = {"api": "api-wire", "naive": "naive-wire", "flat": "flat-wire",
        "overlap": "overlap-wire", "buckets": "buckets-wire"}


def bounds(least_calls, most_calls, size, backend):
    """``(least, most)`` bytes on all links of a launch of ``size`` ranks
    (:func:`exercise_utils.wire.small_calls`, with :data:`BASE`)."""
    return wire.small_calls(least_calls, most_calls, size, BASE.get((backend, size), wire.SETUP))


def _item(spec):
    return 8 if spec.endswith("64") else 4


def grad_calls(spec, per_parameter=True):
    """One step's all-reduces of ``spec``'s gradients: one per parameter with a gradient, or
    one of all of them."""
    sizes = [numel * _item(spec) for _, numel in ref.grad_params(spec)]
    return [("all_reduce", n) for n in sizes] if per_parameter else [("all_reduce", sum(sizes))]


def broadcast_calls(spec):
    """``(least, most)`` calls of ``broadcast_parameters`` on ``spec``'s model: at least every
    parameter and buffer once, in its dtype, in one buffer; at most one broadcast per entry of
    the state dict (a tied weight twice), each in 8-byte elements (one float64 buffer)."""
    model = ref.make_model(spec)
    tensors = list(model.parameters()) + list(model.buffers())
    return ([("broadcast", sum(t.numel() * t.element_size() for t in tensors))],
            [("broadcast", t.numel() * 8) for t in model.state_dict().values()])


def bucket_calls(spec, cap):
    """One step's all-reduces of BucketDDP's buckets (the notebook's packing) of ``spec``."""
    item = _item(spec)
    sizes = dict(ref.grad_params(spec))
    return [("all_reduce", sum(sizes[n] for n in bucket) * item)
            for bucket in expected.expected_buckets(spec, cap)]


def stage_calls(stage, steps=ref.STEPS):
    """``(least, most)`` calls of one launch of ``stage`` (what the notebook asks the student's
    code to send, and what the probe sends itself; see :mod:`.probes` and
    :mod:`.probes_grad`), each collective once for the whole group."""
    least, most = [], []

    def both(calls):
        least.extend(calls)
        most.extend(calls)

    def broadcast(spec):
        low, high = broadcast_calls(spec)
        least.extend(low)
        most.extend(high)
    if stage == "api":
        for _, _, spec in BROADCAST_CASES:
            broadcast(spec)
        both([("all_reduce", 4)])                       # the probe: the batches fit?
        for _ in OPTIMIZER_CASES:                       # the probe's own averaging
            broadcast("edge")
            both(grad_calls("edge") * (ref.DATA_SIZE // ref.GLOBAL_BATCH))
    elif stage in ("naive", "flat"):
        for _, spec in REDUCE_CASES:
            both(grad_calls(spec, stage == "naive") * steps)
    elif stage == "overlap":
        for _, spec in OVERLAP_CASES:
            broadcast(spec)
            both(grad_calls(spec) * steps)
    elif stage == "buckets":
        for case, spec, _ in BUCKET_CASES:
            broadcast(spec)
            both(bucket_calls(spec, ref.BUCKET_CAPS[case]) * steps)
        broadcast("branch")
        every = bucket_calls("branch", ref.BUCKET_CAPS["branch"])
        both(every * 2)                 # the steps before and after the one without the branch
        most.extend(every * (1 + len(STALE)))   # (in that one, and in the backward passes
        #                                 that skip it with stale gradients, only the complete
        #                                 buckets are reduced)
    return least, most


ASKED = {"api": "what the check runs (broadcast_parameters on 8 models; the check's own "
                "averaging in 5 runs of DistributedOptimizer, 3 steps each)",
         "naive": "one all_reduce per parameter with a gradient per step (4 models, 3 steps "
                  "each)",
         "flat": "one all_reduce of one flat buffer per step (4 models, 3 steps each)",
         "overlap": "broadcast_parameters at construction and one all_reduce per parameter "
                    "with a gradient per step (2 models, 3 steps each)",
         "buckets": "broadcast_parameters at construction and one all_reduce per bucket per "
                    "backward (5 models, 3 steps each)"}
FUNCTION = {"api": "the API", "naive": "allreduce_naive", "flat": "allreduce_flat",
            "overlap": "OverlapDDP", "buckets": "BucketDDP"}


def judge(links, stage, size, backend):
    """Fail ``stage``'s wire case where the bytes all ``links`` carried in its launch with
    ``size`` ranks (empty where they were not observed) lie outside :func:`bounds`."""
    if not links:
        return
    least, most = stage_calls(stage)
    wire.check(links, bounds(least, most, size, backend), CASE[stage],
               f"{FUNCTION[stage]} with {size} ranks", ASKED[stage])
