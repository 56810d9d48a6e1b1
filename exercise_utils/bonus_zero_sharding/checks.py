"""Checkers of notebook 07 (ZeRO-1 optimizer-state sharding) for ``work/07_zero.py``.

``check_memory`` (pure arithmetic: ``bytes_per_device`` is called in this process, no launch)
compares the ZeRO paper's memory model for every stage with the checker's own formula,
including the paper's 7.5B-parameter model on 64 devices (120, 31.4, 16.6, 1.9 GB).

``check_sharded`` and ``check_checkpoint`` (in :mod:`.checks_checkpoint`) share one launch
per world size (2 and 3 gloo ranks; see :mod:`.probes`), kept per file content
(``stage_results``).
``check_sharded``: after 10 AdamW steps (weight decay 0.1; a group added with
``add_param_group`` before step 5, with its own learning rate and no weight decay) every rank's
parameters equal the unsharded ``torch.optim.AdamW``'s fed the same averaged gradients
(tolerance 1e-6); the optimizer state, MEASURED in every ``torch.optim.Optimizer`` the sharded
optimizer holds, covers each parameter on exactly one rank, every rank's share of the state
elements is within ``BALANCE`` of 1/world_size, and each parameter's state is on the rank
``partition_parameters`` gives it (group after group, each from the loads before it; the
function is also called on the cases ``probes.PARTITIONS``); ``zero_grad`` clears every
gradient; a ``StepLR`` accepts the sharded optimizer (a ``torch.optim.Optimizer``) and its lr
reaches the local optimizers: 5 steps under it equal AdamW's under the same scheduler. When the
combined launch fails (a crash or a hang), ``check_sharded`` runs its stage alone, so a broken
checkpoint costs only its own points.

Used in 07_bonus_zero_sharding.
"""
import hashlib
import math
from pathlib import Path

import numpy as np

from ..harness import HANG_AFTER, run_ranks
from . import probes

TIMEOUT = HANG_AFTER     # seconds without progress before a launch is a hang (harness)
GLOO_TIMEOUT = 15            # seconds a collective waits before gloo raises
WORLD_SIZES = (2, 3)
ATOL = RTOL = 1e-6           # both optimizers see bitwise the same gradients
BALANCE = 0.2                # each rank's state: within 20 % of (total / world size)
STAGES = ("sharded", "checkpoint")
_CACHE = {}                  # (file digest, world size) -> {"results": {}, "errors": {}}

PAPER = dict(num_params=7.5e9, num_devices=64)          # ZeRO paper, Figure 1
PAPER_GB = (120.0, 31.4, 16.6, 1.9)                      # stages 0..3, GB = 1e9 bytes
STAGE_NAMES = ("baseline (every device holds everything)",
               "stage 1, P_os: optimizer states partitioned",
               "stage 2, P_os+g: optimizer states and gradients partitioned",
               "stage 3, P_os+g+p: optimizer states, gradients and parameters partitioned")
MEMORY_CASES = [(7.5e9, 64, 12), (1_000_000, 4, 12), (123_457, 3, 12), (5_000, 1, 12),
                (2_000_000, 8, 8)]


def _not_implemented(todo, path):
    return AssertionError(f"not implemented yet: {todo} in {path} still raises "
                          f"NotImplementedError. Replace the `raise` line with your code, then "
                          f"run the %%writefile cell again.")


# ---------------------------------------------------------------- memory accounting
def expected_bytes(num_params, num_devices, stage, k=12):
    """The checker's own ZeRO memory model (2 bytes fp16 parameters, 2 fp16 gradients, K)."""
    p, g, o = 2 * num_params, 2 * num_params, k * num_params
    return [p + g + o, p + g + o / num_devices, p + (g + o) / num_devices,
            (p + g + o) / num_devices][stage]


def check_memory(path):
    """Check ``bytes_per_device`` (imported here: pure arithmetic, no processes)."""
    from ..rankworker import load_student
    path = Path(path)
    if not path.is_file():
        raise AssertionError(f"{path} does not exist: run the %%writefile cell that creates "
                             "it first.")
    student = load_student(path)
    for psi, n, k in MEMORY_CASES:
        for stage in range(4):
            call = f"bytes_per_device({psi:g}, {n}, stage={stage}, k={k})"
            try:
                got = student.bytes_per_device(psi, n, stage, k=k)
            except NotImplementedError:
                raise _not_implemented("bytes_per_device", path) from None
            want = expected_bytes(psi, n, stage, k)
            if not isinstance(got, (int, float)) or not math.isclose(got, want, rel_tol=1e-9):
                shown = (f"{got:.6g} bytes ({got / 1e9:.4g} GB)"
                         if isinstance(got, (int, float)) else repr(got))
                raise AssertionError(
                    f"{call} returned {shown}; expected {want:.6g} bytes ({want / 1e9:.4g} GB) "
                    f"for the {STAGE_NAMES[stage]}. Per parameter: 2 bytes fp16 parameters, 2 "
                    f"bytes fp16 gradients, K bytes optimizer state; divide by num_devices "
                    f"exactly the parts that stage partitions")
    got = [round(student.bytes_per_device(stage=s, **PAPER) / 1e9, 1) for s in range(4)]
    if tuple(got) != PAPER_GB:
        raise AssertionError(f"7.5B parameters on 64 devices gave {got} GB per device; the "
                             f"paper's Figure 1: {list(PAPER_GB)} (GB = 1e9 bytes)")
    try:
        student.bytes_per_device(1000, 2, stage=4)
    except ValueError:
        return
    except NotImplementedError:
        raise _not_implemented("bytes_per_device", path) from None
    raise AssertionError("bytes_per_device(1000, 2, stage=4) must raise ValueError: ZeRO has "
                         "stages 0 (baseline), 1, 2 and 3 only")


# ---------------------------------------------------------------- launching, caching
def _launch(path, size, stages, timeout):
    return run_ranks(path, probes.probe, size, "none",
                     dict(stages=list(stages), gloo_timeout=min(GLOO_TIMEOUT, timeout / 3)),
                     timeout, what=f"07_zero.py with {size} ranks")


def stage_results(path, stage, timeout):
    """Yield ``(size, per-rank results of stage)`` for 2 then 3 ranks (cached per content)."""
    path = Path(path)
    if not path.is_file():
        raise AssertionError(f"{path} does not exist: run the %%writefile cell that creates "
                             "it first.")
    digest, failed = hashlib.sha256(path.read_bytes()).hexdigest(), set()
    for size in WORLD_SIZES:
        entry = _CACHE.setdefault((digest, size), {"results": {}, "errors": {}})
        if stage not in entry["results"] and stage not in entry["errors"]:
            todo = [s for s in STAGES if s not in entry["results"]]
            if stage == "sharded" and {"checkpoint"} & (set(entry["errors"]) | failed):
                todo = ["sharded"]          # the checkpoint failed (here or with 2 ranks)
            try:
                res = _launch(path, size, todo, timeout)
                entry["results"].update({s: [r[s] for r in res] for s in todo})
            except AssertionError as err:
                # both stages failed together: the checkpoint's, surely; the training's only
                # if it fails alone too (then a crash in the checkpoint costs only its points)
                entry["errors"]["checkpoint" if len(todo) > 1 else todo[0]] = str(err)
                if stage == "sharded" and len(todo) > 1:
                    try:
                        res = _launch(path, size, ["sharded"], timeout)
                        entry["results"]["sharded"] = [r["sharded"] for r in res]
                    except AssertionError as err2:
                        entry["errors"]["sharded"] = str(err2)
        failed |= set(entry["errors"])
        if stage in entry["errors"]:
            error = entry["errors"][stage]
            if " hung: " in error:               # maybe a busy machine: try again next time
                _CACHE.pop((digest, size))
            raise AssertionError(error)
        res = entry["results"][stage]
        for out in res:
            if "todo" in out:
                raise _not_implemented(out["todo"], path)
        yield size, res


# ---------------------------------------------------------------- check_sharded
def greedy(numels, world_size, loads=None):
    """The partition the notebook asks for: largest first (ties: lower index), each to the
    least-loaded rank (ties: lower rank), starting from ``loads``."""
    loads, owners = list(loads or [0] * world_size), [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        owners[i] = min(range(world_size), key=lambda r: (loads[r], r))
        loads[owners[i]] += numels[i]
    return owners


def _check_partition(got):
    for (numels, size, loads), owners in zip(probes.PARTITIONS, got):
        want = greedy(numels, size, loads)
        if list(owners) != want:
            raise AssertionError(
                f"partition_parameters({numels}, {size}, loads={loads}) returned {owners}; "
                f"expected {want}: take the parameters largest first (ties: the lower index "
                f"first), give each to the rank with the fewest elements so far, counting "
                f"`loads` (ties: the lower rank)")


def _check_owners(held, size):
    """The state of each parameter is on the rank the partition of each group in turn gives
    (the head's group added with add_param_group, partitioned from the current loads)."""
    numels, loads, want = probes.numels(), [0] * size, {}
    for prefix in ("body.", "head."):
        names = [n for n in numels if n.startswith(prefix)]
        owners = greedy([numels[n] for n in names], size, loads)
        want.update(zip(names, owners))
        for n, r in zip(names, owners):
            loads[r] += numels[n]
    if held == want:
        return
    head = [n for n in numels if n.startswith("head.")]
    fresh = dict(zip(head, greedy([numels[n] for n in head], size)))
    if all(held[n] == want[n] for n in numels if n not in head) and \
            all(held[n] == fresh[n] for n in head):
        raise AssertionError(
            f"with {size} ranks the group added with add_param_group ({head}) went to ranks "
            f"{[held[n] for n in head]}, as if no rank owned anything yet; expected ranks "
            f"{[want[n] for n in head]}: partition a new group starting from the elements each "
            f"rank already owns (partition_parameters(..., loads=...))")
    raise AssertionError(
        f"with {size} ranks the optimizer state of each parameter is on ranks "
        f"{[held[n] for n in numels]} (parameters {list(numels)}); expected {list(want.values())}"
        f": the owners partition_parameters gives for the first group, then for the added one "
        f"starting from the current loads")
def _check_state(res, size):
    """Each parameter's state on exactly one rank; every rank's share about 1/size."""
    numels = probes.numels()
    holders = {name: [r for r, out in enumerate(res) if name in out["state"]] for name in numels}
    for rank, out in enumerate(res):
        other = out["state"].get("<other>")
        if other:
            raise AssertionError(f"rank {rank}: its optimizer holds state ({other} elements) for "
                                 "tensors that are not the model's parameters; build the local "
                                 "optimizer over the parameters themselves")
    for name, ranks in holders.items():
        if len(ranks) > 1:
            held = {r: len(res[r]["state"]) for r in ranks}
            raise AssertionError(
                f"with {size} ranks the optimizer state of {name} is kept on ranks {ranks} "
                f"(parameters with state per rank: {held} of {len(numels)}): each rank must "
                f"keep state only for its own shard. Build optimizer_cls over this rank's "
                f"parameters only, not over all of them")
        if not ranks:
            raise AssertionError(f"with {size} ranks no rank holds optimizer state for {name} "
                                 f"after {probes.STEPS} steps: every parameter must be owned (and "
                                 "updated) by exactly one rank")
    _check_balance(res, size, numels)
    _check_partition(res[0]["partitions"])
    _check_owners({name: ranks[0] for name, ranks in holders.items()}, size)


def _check_balance(res, size, numels):
    elements = [sum(out["state"].values()) for out in res]
    ideal = sum(elements) / size
    if max(elements) > (1 + BALANCE) * ideal or min(elements) < (1 - BALANCE) * ideal:
        raise AssertionError(
            f"unbalanced partition with {size} ranks: the ranks' optimizer states hold "
            f"{elements} elements (measured; 1/{size} of all would be {ideal:.0f} each, within "
            f"{BALANCE:.0%}). The parameter sizes are {list(numels.values())}: assign by size, "
            f"not by count (largest first, each to the rank with the fewest elements so far)")


def check_sharded(path, timeout=TIMEOUT):
    """Check ``partition_parameters``, ``ShardedOptimizer.__init__``, ``step``, ``zero_grad``
    and ``add_param_group`` with 2 and 3 ranks (one launch each, shared with
    ``check_checkpoint``)."""
    for size, res in stage_results(path, "sharded", timeout):
        for rank, out in enumerate(res):
            if out["stale_grads"]:
                raise AssertionError(
                    f"rank {rank}: after zero_grad() {out['stale_grads']} still have nonzero "
                    f"gradients: reset the gradients of ALL parameters (every rank computed "
                    f"all of them), not only this rank's shard")
        _check_state(res, size)
        for rank, out in enumerate(res):
            owned = set(out["state"])
            for name, want in out["ref"].items():
                got = out["final"][name]
                if np.allclose(got, want, atol=ATOL, rtol=RTOL):
                    continue
                diff = float(np.max(np.abs(got - want)))
                if name not in owned and np.array_equal(got, out["init"][name]):
                    raise AssertionError(
                        f"rank {rank} differs by {diff:.1e} in {name} after {probes.STEPS} AdamW "
                        f"steps with {size} ranks: this rank does not own {name} and it never "
                        f"changed: after the local step every rank must receive the updated "
                        f"parameters from their owners (dist.broadcast from the owner)")
                head = name.startswith("head.")
                raise AssertionError(
                    f"rank {rank} differs by {diff:.1e} in {name} after {probes.STEPS} AdamW steps "
                    f"with {size} ranks (weight decay {probes.WEIGHT_DECAY}; max abs difference, "
                    f"tolerance {ATOL:g}) from the unsharded torch.optim.AdamW given the same "
                    f"averaged gradients. "
                    + (f"{name} belongs to the group added before step {probes.ADD_AT} with "
                       f"add_param_group({{'params': ..., 'lr': {probes.HEAD['lr']}, "
                       f"'weight_decay': {probes.HEAD['weight_decay']}}}): its hyper-parameters "
                       f"must be kept" if head else
                       "Step the local optimizer over this rank's shard, then broadcast every "
                       "parameter from its owner"))
        _check_scheduler(res, size)


def _check_scheduler(res, size):
    """StepLR accepts the sharded optimizer; its lr changes, and reaches the local optimizer."""
    call = ("torch.optim.lr_scheduler.StepLR(ShardedOptimizer(..., lr={lr:g}), step_size="
            "{step_size}, gamma={gamma})").format(lr=probes.LR, **probes.SCHED)
    for rank, sched in enumerate(out["scheduler"] for out in res):
        if "error" in sched:
            raise AssertionError(
                f"rank {rank}: {call} raised {sched['error']}. ShardedOptimizer must be a "
                f"torch.optim.Optimizer (class ShardedOptimizer(torch.optim.Optimizer), with "
                f"Optimizer.__init__ called) so that learning-rate schedulers work with it")
        lrs, want = sched["lrs"], sched["ref_lrs"]
        if np.shape(lrs) != np.shape(want) or not np.allclose(lrs, want, rtol=1e-12, atol=0):
            raise AssertionError(
                f"rank {rank}: with {call} the lr of ShardedOptimizer.param_groups after each "
                f"scheduler step was {lrs}; AdamW's under the same scheduler: {want}. "
                f"param_groups must be the full groups the scheduler edits")
        diffs = {n: float(np.max(np.abs(sched["final"][n] - want)))
                 for n, want in sched["ref"].items()
                 if not np.allclose(sched["final"][n], want, atol=ATOL, rtol=RTOL)}
        if diffs:
            raise AssertionError(
                f"rank {rank} differs by up to {max(diffs.values()):.1e} in {len(diffs)} of "
                f"{len(sched['ref'])} parameters (e.g. {sorted(diffs)[:2]}) after "
                f"{probes.SCHED_STEPS} steps under {call} with {size} ranks from AdamW under the "
                f"same scheduler, although param_groups had the scheduler's lr {sched['lrs']}: "
                f"step() must copy the hyper-parameters of param_groups to the local optimizer "
                f"first (_sync_hyperparameters)")
