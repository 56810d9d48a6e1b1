"""What notebook 03's gradient averaging and SyncBatchNorm launches may put on the wire (the
judge's: no probe imports this module, so at grading no rank can read it).

Where links are observed (grading; :func:`exercise_utils.harness.observing`) every launch of
``check_average_gradients`` and ``check_sync_batchnorm`` runs each rank as a host of a mesh and
the judge reads the bytes of every link from the kernel's counters, outside the ranks: all links
together must carry what the calls the notebook asks for put there (the core's model,
:func:`exercise_utils.wire.envelope`), from the least a right file sends to the most, plus the
set-up of the launch's groups (the harness's and the probe's ``dist.new_group``) and the
harness's closing barrier (:data:`exercise_utils.wire.SETUP`). Each launch then holds one large
case more (:data:`.probes.AVG_WIRE_SPLIT`'s wide model, :data:`.probes_batchnorm.BN_WIRE`), so
that traffic hidden beside the calls stands far above the headers of the many small ones.

* :func:`avg_wire_envelope`: per step of every case, an all_reduce of every gradient (one call
  per parameter at most, whatever the grouping: the least counts the gradients' bytes once)
  and the sample count's (at most 8 bytes, in a call of its own at most);
* :func:`bn_wire_envelope`: per training forward of every layer the differentiable all_reduce
  of the count, the sum and the sum of squares (at least the 2 C sums in the input's dtype;
  at most 3 calls of C float64 values each: counts per channel and float64 statistics are
  allowed), and as much again in backward (the differentiable all_reduce's own backward);
  one forward more where eval mode normalises with the batch's statistics (no running ones).

Inside a group the calls span its ranks only (a rank alone sends nothing).

Used in 03_torch_distributed_collectives (by :mod:`.checks` and :mod:`.checks_batchnorm`).
"""
from .. import wire
from . import probes
from .probes import AVG_GROUPS, avg_batches, avg_model, avg_run
from .probes_batchnorm import BN_STEPS

COUNT_BYTES = 8          # the sample count N: one float64 at most
STATS_CALLS = 3          # all_reduces one BatchNorm forward may make (count, sum, sum of squares)
ITEM = {"float32": 4, "float64": 8}


def _add(total, calls, least_calls, size):
    """Add to ``total`` (``[least, most]``) the bounds of ``calls`` (the most) and
    ``least_calls`` (the least) over a group of ``size`` ranks, set-up not included."""
    if size > 1:
        total[0] += wire.envelope(least_calls, size, setup=0)[0]
        total[1] += wire.envelope(calls, size, setup=0)[1]


def _gradient_bytes(kind, dtype, splits):
    """Per step, bytes of every gradient the model of a case has in that step (frozen and
    unused parameters have none; in ``avg-varying`` which have one changes from step to
    step), from the judge's own run."""
    if not probes.vary_of(kind):        # the same every step: one step says it
        grads, _ = avg_run(avg_model(kind, dtype), avg_batches(splits[:1], kind, dtype))
        return [[g.nbytes for g in grads.values()]] * len(splits)
    steps = []
    avg_run(avg_model(kind, dtype), avg_batches(splits, kind, dtype), vary=probes.vary_of(kind),
            steps=steps)
    return [[g.nbytes for g in step.values()] for step in steps]


def avg_wire_envelope(size, cases):
    """``(least, most)`` bytes all links of an ``average_gradients`` launch with ``size``
    ranks carry over ``cases`` (:func:`.probes.avg_cases`); see the module docstring."""
    total = [0, 0]
    for _, kind, dtype, splits, grouped in cases:
        grads = [("all_reduce", n) for step in _gradient_bytes(kind, dtype, splits)
                 for n in step]
        allowed = grads + [("all_reduce", COUNT_BYTES)] * len(splits)
        for ranks in AVG_GROUPS[size] if grouped else [range(size)]:
            _add(total, allowed, grads, len(ranks))
    return total[0], total[1] + wire.SETUP


def bn_wire_envelope(size, cases):
    """``(least, most)`` bytes all links of a ``DistributedBatchNorm`` launch with ``size``
    ranks carry over ``cases`` (:func:`.probes_batchnorm.bn_cases`); see the module
    docstring."""
    total = [0, 0]
    for case in cases:
        channels = case["channels"]
        passes = 2 * BN_STEPS + (0 if case.get("track", True) else 1)
        least = [("all_reduce", 2 * channels * ITEM[case["dtype"]])] * passes
        most = [("all_reduce", channels * 8)] * (STATS_CALLS * passes)
        for ranks in case.get("group") or [range(size)]:
            _add(total, most, least, len(ranks))
    return total[0], total[1] + wire.SETUP


def check_avg_wire(links, size, cases):
    """Fail ``avg-wire`` when the bytes the network counted (``links``, read outside the
    ranks; empty where not observed) lie outside :func:`avg_wire_envelope`."""
    wire.check(links, avg_wire_envelope(size, cases), "avg-wire",
               f"average_gradients with {size} ranks, {len(cases)} runs of SGD",
               "one all_reduce of every gradient per step and the sample count's (the "
               "notebook: scale by n_r, all-reduce (one all_reduce can also carry n_r itself, "
               "to get N), divide by N)")


def check_bn_wire(links, size, cases):
    """Fail ``bn-wire`` when the bytes the network counted (``links``, read outside the
    ranks; empty where not observed) lie outside :func:`bn_wire_envelope`."""
    wire.check(links, bn_wire_envelope(size, cases), "bn-wire",
               f"DistributedBatchNorm with {size} ranks, {len(cases)} layers of "
               f"{BN_STEPS} training steps each",
               "per forward one differentiable all_reduce of the per-channel count, sum and "
               "sum of squares (or up to three), and in backward its all_reduce of their "
               "gradients (the statistics travel, never the batch)")
