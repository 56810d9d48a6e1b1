"""Probe of notebook 07's checkers: runs inside every rank (see :mod:`.checks`).

Every run trains a model twice on every rank from the same start: with the student's
``ShardedOptimizer(params, optimizer_cls, ...)`` and with the unsharded ``torch.optim``
optimizer (the reference). The reference model's gradients are computed on each rank's own
batch and averaged over the ranks (the job of DDP, which ``ShardedOptimizer`` assumes done);
the student's model gets copies of them, so both optimizers see bitwise the same gradients.

Stage "sharded" (:mod:`.probes_runs`), one check case at a time (``ctx.case``):
``partition_parameters`` on the cases of :func:`partition_cases`; the baseline (``Net``,
float32, AdamW, the head added with ``add_param_group`` and its own hyper-parameters before
step ``ADD_AT``; the optimizer state MEASURED in every ``torch.optim.Optimizer`` the sharded
optimizer holds; the gradients after each ``zero_grad()``; the groups, full and local); then
one dimension changed at a time: float64, :class:`~exercise_utils.models.EdgeNet` (frozen,
unused, tied, transposed and 0-d parameters; ``zero_grad(set_to_none=False)``),
:class:`Switch` (a branch of the forward that has a gradient at one step and none at the next),
``step(closure)``,
a rank that owns no parameter, SGD as ``optimizer_cls``, a generator or dicts as ``params``, a
group given as one tensor, and a ``StepLR`` scheduler.

Stage "checkpoint" (:mod:`.probes_checkpoint`) continues from the baseline, float64,
EdgeNet and Switch runs: ``state_dict()`` before any consolidation, ``consolidate_state_dict``
to each rank in turn and again after more steps, ``load_state_dict`` of the unsharded
optimizer's and of the consolidated state dict, then more steps (and a consolidation again
after such a resume, on Switch).

The settings, models, batches and state readers both stages use are :mod:`.probes_base`'s;
this module holds the partition cases and the launch's entry point, :func:`probe`.

Used in 07_bonus_zero_sharding.
"""
import datetime
import gc
import random

import torch._dynamo  # noqa: F401 - the ranks' optimizers need it: imported once, before they fork
import torch.distributed as dist

from ..rankworker import not_implemented
from . import probes_checkpoint, probes_runs


# ---------------------------------------------------------------- partition_parameters
def partition_cases():
    """(case, numels, world_size, loads) for ``partition_parameters``: distinct sizes (no
    ties) with more ranks than parameters and no parameter at all among them; ties in sizes
    and in loads; loads given."""
    rng = random.Random(7)
    cases = [("partition-greedy", [1, 2, 10], 2, None), ("partition-greedy", [3, 5, 8, 2], 2, None),
             ("partition-greedy", [], 3, None), ("partition-greedy", [5], 1, None),
             ("partition-greedy", [3, 9], 4, None), ("partition-greedy", [1, 2, 3, 10], 2, None)]
    for _ in range(30):
        n = rng.randint(0, 12)
        cases.append(("partition-greedy", rng.sample(range(1, 2000), n), rng.randint(1, 6), None))
    cases += [("partition-ties", [4, 4, 4, 4], 3, None), ("partition-ties", [7] * 5, 2, None),
              ("partition-ties", [2, 3, 2, 3], 2, None), ("partition-ties", [1, 1, 10], 2, None),
              ("partition-ties", [0, 0, 0], 2, None), ("partition-ties", [6, 6], 4, None)]
    for _ in range(20):
        n = rng.randint(1, 10)
        cases.append(("partition-ties", [rng.randint(1, 3) for _ in range(n)],
                      rng.randint(1, 4), None))
    cases += [("partition-loads", [4, 4, 4, 4], 3, [0, 0, 5]),
              ("partition-loads", [3, 5, 5, 2, 8], 2, [6, 0]),
              ("partition-loads", [], 2, [3, 1]), ("partition-loads", [2], 3, [4, 4, 4])]
    for _ in range(20):
        size = rng.randint(1, 5)
        cases.append(("partition-loads", rng.sample(range(1, 500), rng.randint(1, 10)), size,
                      [rng.randint(0, 600) for _ in range(size)]))
    return cases


def partitions(student):
    """What ``partition_parameters`` returned (or raised) on each case, and ``loads`` after."""
    out = []
    for _, sizes, world_size, loads in partition_cases():
        given = None if loads is None else list(loads)
        try:
            got = student.partition_parameters(list(sizes), world_size, given)
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported per case by the checker
            out.append({"raised": f"{type(exc).__name__}: {exc}"})
            continue
        try:
            owners = [int(o) for o in got]
        except Exception:  # noqa: BLE001 - not a sequence of numbers
            owners = None
        out.append({"type": type(got).__name__, "owners": owners, "loads": given,
                    "items": sorted({type(o).__name__ for o in got}) if owners is not None
                    else [], "shown": repr(got)[:200]})
    return out


# ---------------------------------------------------------------- the launch's entry point
def probe(student, ctx, stages, gloo_timeout):
    """Run ``stages`` ("sharded", and "checkpoint" after it); ``{stage: result}``, a result
    being ``{"todo": function}`` where the student's code raised NotImplementedError (in
    ``partition_parameters``; where only ShardedOptimizer's code still raises it, "sharded"
    holds the partitions and ``"unwritten"``: that function)."""
    dist.init_process_group("gloo", rank=ctx.rank, world_size=ctx.size,
                            timeout=datetime.timedelta(seconds=gloo_timeout))
    results, objects = {}, None
    try:
        ctx.case("partition-greedy")
        sharded = {"partitions": partitions(student)}
    except NotImplementedError as exc:
        sharded = not_implemented(student, exc)
    else:           # piece by piece (issue 39): the partition is judged without the rest
        everyone = [None] * ctx.size
        dist.all_gather_object(everyone, sharded["partitions"])
        if all(p == everyone[0] for p in everyone):   # else the ranks disagree: the
            try:                                      # checker says so, no training
                runs, objects = probes_runs.run_all(student, ctx)
                sharded.update(runs)
            except NotImplementedError as exc:
                sharded["unwritten"] = not_implemented(student, exc)["todo"]
    results["sharded"] = sharded
    if "checkpoint" in stages:
        try:
            results["checkpoint"] = (
                probes_checkpoint.checkpoint(student, ctx, objects) if objects else
                sharded if "todo" in sharded else {"todo": sharded["unwritten"]}
                if "unwritten" in sharded else {"skipped": "partition_parameters gave "
                                                "different owners on different ranks"})
        except NotImplementedError as exc:
            results["checkpoint"] = not_implemented(student, exc)
    del objects
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return results
