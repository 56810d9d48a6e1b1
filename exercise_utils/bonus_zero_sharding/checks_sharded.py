"""What ``check_sharded`` (:mod:`.checks`) holds the ranks' results of stage "sharded" to
(:mod:`.probes_runs`): ``partition_parameters`` against :func:`greedy`; the baseline's
parameters against unsharded AdamW's, its gradients after ``zero_grad()``, its optimizer state
(where it is, how much each rank holds, in how many optimizers), its groups, full and local;
then each run that changes one dimension. Each verification raises through
:func:`~exercise_utils.contract.fail` with its check case.

Used in 07_bonus_zero_sharding.
"""

import numpy as np

from ..harness import check
from ..contract import fail
from . import probes, probes_base

ATOL = RTOL = 1e-6           # float32: both optimizers see bitwise the same gradients
TIGHT = (1e-12, 1e-10)       # float64: nothing may pass through float32 on the way
BALANCE = 0.2                # each rank's state: within 20 % of (total / world size)


def greedy(numels, world_size, loads=None):
    """The partition the notebook asks for: largest first (ties: lower index), each to the
    least-loaded rank (ties: lower rank), starting from ``loads`` (not modified)."""
    loads, owners = list(loads or [0] * world_size), [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        owners[i] = min(range(world_size), key=lambda r: (loads[r], r))
        loads[owners[i]] += numels[i]
    return owners


# ---------------------------------------------------------------- partition_parameters
def spread(sizes, owners, world_size, loads=None):
    """The elements each rank ends with, smallest first (whatever the ranks' numbers: ties
    broken otherwise give the same); None: not one owner in range(world_size) per parameter."""
    if owners is None or len(owners) != len(sizes) or \
            any(not 0 <= o < world_size for o in owners):
        return None
    total = list(loads or [0] * world_size)
    for size, rank in zip(sizes, owners):
        total[rank] += size
    return sorted(total)


@check
def check_partitions(res):
    """Every rank's results on :func:`probes.partition_cases`, the most basic case first."""
    cases = probes.partition_cases()
    for rank, out in enumerate(res):
        for (_, sizes, world, loads), got in zip(cases, out["partitions"]):
            call = f"partition_parameters({sizes}, {world}, loads={loads})"
            if "raised" in got:
                fail("partition-greedy", f"rank {rank}: {call} raised {got['raised']}; it works "
                     f"for any sizes and any number of ranks, more ranks than parameters and no "
                     f"parameter at all included")
            if got["type"] != "list" or any(t != "int" for t in got["items"]):
                fail("partition-type", f"rank {rank}: {call} returned a {got['type']} of "
                     f"{got['items']} ({got['shown']}); it returns list[int]: a Python list "
                     f"with the owner rank of each parameter, each a Python int (numpy's "
                     f"integers are not: int(...) them)")
    for rank, out in enumerate(res):
        for (name, sizes, world, loads), got in zip(cases, out["partitions"]):
            want = greedy(sizes, world, loads)
            mine = spread(sizes, got["owners"], world)
            if name == "partition-greedy" and mine != spread(sizes, want, world):
                fail(name, f"rank {rank}: partition_parameters({sizes}, {world}, loads={loads}) "
                           f"returned {got['owners']}, ranks holding {mine} elements; expected "
                           f"{want}, ranks holding {spread(sizes, want, world)}: one owner in "
                           f"range({world}) per parameter; take the parameters largest first, "
                           f"give each to the rank with the fewest elements so far")
    for case, hint in (("partition-ties", "ties: the lower index first among equal sizes, the "
                        "lower rank among equal loads, the same on every rank"),
                       ("partition-loads", "start from the elements `loads` gives each rank")):
        for rank, out in enumerate(res):
            for (name, sizes, world, loads), got in zip(cases, out["partitions"]):
                want = greedy(sizes, world, loads)
                scope = ("partition-greedy", case) if case == "partition-ties" else (case,)
                if got["owners"] != want and name in scope:
                    fail(case, f"rank {rank}: partition_parameters({sizes}, {world}, loads="
                               f"{loads}) returned {got['owners']}; expected {want}: {hint}")
    for rank, out in enumerate(res):
        for (_, sizes, world, loads), got in zip(cases, out["partitions"]):
            if loads is not None and got["loads"] != loads:
                fail("partition-loads-unmodified", f"rank {rank}: partition_parameters({sizes}, "
                     f"{world}, loads={loads}) changed the caller's loads to {got['loads']}: "
                     f"`loads` is not modified (work on a copy, e.g. list(loads))")


# ---------------------------------------------------------------- parameters after training
def compare(case, rank, size, out, what, promise, tol=(ATOL, RTOL)):
    """The parameters of run ``out`` on ``rank`` against the reference's."""
    for name, want in out["ref"].items():
        got = out["final"][name]
        if np.shape(got) != np.shape(want) or not np.allclose(got, want, atol=tol[0],
                                                              rtol=tol[1]):
            diff = float(np.max(np.abs(got - want))) if np.shape(got) == np.shape(want) else \
                float("nan")
            fail(case, f"rank {rank} differs by {diff:.1e} in {name} after {what} with {size} "
                       f"ranks from the unsharded optimizer given the same averaged gradients "
                       f"(max abs difference, tolerance {tol[0]:g} + {tol[1]:g}*|expected|): "
                       f"{promise}")


@check
def check_train(res, size):
    """The baseline's parameters, body first (a broadcast that never came, a wrong update),
    then the head's group added with its own hyper-parameters."""
    what = f"{probes_base.STEPS} AdamW steps"
    for rank, out in enumerate(res):
        built = out["train"]["built"]
        if built != 1:
            fail("optimizer-cls", f"rank {rank}: optimizer_cls was called {built} times while "
                 f"one ShardedOptimizer was built and trained (a group added after "
                 f"{probes_base.ADD_AT} steps): call it once, in __init__, and add every later "
                 f"group to that optimizer with add_param_group (a new one would lose the "
                 f"state)")
    for head in (False, True):
        for rank, out in enumerate(res):
            run, owned = out["train"], set(out["train"]["state"])
            for name in (n for n in run["ref"] if n.startswith("head.") == head):
                got, want = run["final"][name], run["ref"][name]
                if np.allclose(got, want, atol=ATOL, rtol=RTOL):
                    continue
                if name not in owned and np.array_equal(got, run["init"][name]):
                    fail("step-broadcast", f"rank {rank}: {name} never changed in {what} with "
                         f"{size} ranks: this rank does not own it, and after the local step "
                         f"every rank must receive the updated parameters from their owners "
                         f"(dist.broadcast from the owner)")
                if head:
                    compare("add-group-hyper", rank, size, run, what,
                            f"{name} belongs to the group added before step "
                            f"{probes_base.ADD_AT} with add_param_group({{'params': ..., "
                            f"'lr': {probes_base.HEAD['lr']}, "
                            f"'weight_decay': {probes_base.HEAD['weight_decay']}}}): its "
                            f"hyper-parameters must be kept, in the local optimizer too")
                compare("step-values", rank, size, run, what,
                        "step the local optimizer (built with the kwargs given) over this "
                        "rank's shard, then broadcast every parameter from its owner")


@check
def check_grads(res, size):
    """After ``zero_grad()``: no gradient left (zero-grad-all), and none as a zero tensor."""
    for case, bad, promise in (
            ("zero-grad-all", "nonzero", "still have nonzero gradients: reset the gradients of "
             "ALL parameters (every rank computed all of them), not only this rank's shard"),
            ("zero-grad-none", "zero", "hold zero tensors after zero_grad() with its default: "
             "set_to_none=True (the default) sets p.grad = None")):
        for rank, out in enumerate(res):
            for run in ("train", "edge"):
                for step, grads in enumerate(out[run]["grads"]):
                    names = [n for n, state in grads.items() if state == bad]
                    if names:
                        fail(case, f"rank {rank}, {size} ranks: after step {step + 1} and "
                                   f"zero_grad(), {names[:4]} {promise}")


@check
def check_state(res, size):
    """Each parameter's state on exactly one rank, balanced, on the rank the partition gives."""
    numels = probes_base.numels()
    for rank, out in enumerate(res):
        run = out["train"]
        if run["state"].get("<other>"):
            fail("state-one-rank", f"rank {rank}: its optimizer holds state "
                 f"({run['state']['<other>']} elements) for tensors that are not the model's "
                 f"parameters; build the local optimizer over the parameters themselves")
        if run["own_state"]:
            fail("state-one-rank", f"rank {rank}: ShardedOptimizer.state holds "
                 f"{run['own_state']} elements of state; its own state stays empty (the state "
                 f"is in the local optimizer, optim, and only there)")
    holders = {name: [r for r, out in enumerate(res) if name in out["train"]["state"]]
               for name in numels}
    for name, ranks in holders.items():
        if len(ranks) > 1:
            held = {r: len(res[r]["train"]["state"]) for r in ranks}
            fail("state-one-rank", f"with {size} ranks the optimizer state of {name} is kept "
                 f"on ranks {ranks} (parameters with state per rank: {held} of {len(numels)}): "
                 f"each rank must keep state only for its own shard. Build optimizer_cls over "
                 f"this rank's parameters only, not over all of them")
        if not ranks:
            fail("state-one-rank", f"with {size} ranks no rank holds optimizer state for {name} "
                 f"after {probes_base.STEPS} steps: every parameter must be owned (and updated) by "
                 f"exactly one rank")
    elements = [sum(out["train"]["state"].values()) for out in res]
    ideal = sum(elements) / size
    if max(elements) > (1 + BALANCE) * ideal or min(elements) < (1 - BALANCE) * ideal:
        fail("state-balance", f"unbalanced partition with {size} ranks: the ranks' optimizer "
             f"states hold {elements} elements (measured; 1/{size} of all would be "
             f"{ideal:.0f} each, within {BALANCE:.0%}). The parameter sizes are "
             f"{list(numels.values())}: assign with partition_parameters, by size, not by count")
    check_owners({name: ranks[0] for name, ranks in holders.items()}, size, "add-group-loads",
                 "state-owners", "the optimizer state of each parameter")


def expected_owners(size):
    """{name: owner} of the baseline: the body's group, then the head's from the loads."""
    numels, loads, want = probes_base.numels(), [0] * size, {}
    for prefix in ("body.", "head."):
        names = [n for n in numels if n.startswith(prefix)]
        owners = greedy([numels[n] for n in names], size, loads)
        want.update(zip(names, owners))
        for n, r in zip(names, owners):
            loads[r] += numels[n]
    return want


@check
def check_owners(held, size, loads_case, case, what):
    """``held`` ({name: rank holding its state}) against the partition of each group in turn."""
    numels, want = probes_base.numels(), expected_owners(size)
    if held == want:
        return
    head = [n for n in numels if n.startswith("head.")]
    fresh = dict(zip(head, greedy([numels[n] for n in head], size)))
    if all(held[n] == want[n] for n in numels if n not in head) and \
            all(held[n] == fresh[n] for n in head):
        fail(loads_case, f"with {size} ranks the group added with add_param_group ({head}) "
             f"went to ranks {[held[n] for n in head]}, as if no rank owned anything yet; "
             f"expected ranks {[want[n] for n in head]}: partition a new group starting from "
             f"the elements each rank already owns (partition_parameters(..., loads=...))")
    fail(case, f"with {size} ranks {what} is on ranks {[held[n] for n in numels]} (parameters "
               f"{list(numels)}); expected {list(want.values())}: the owners "
               f"partition_parameters gives for the first group, then for the added one "
               f"starting from the current loads")


@check
def check_groups(res, size):
    """The full groups: every parameter, every hyper-parameter, as the unsharded AdamW's; the
    local optimizer: one, with one group per full group, the same hyper-parameters."""
    for rank, out in enumerate(res):
        run = out["train"]
        full = run["groups"] or []
        if len(full) != len(run["ref_groups"]):
            fail("param-groups", f"rank {rank}: {len(full)} param_groups, the unsharded AdamW "
                 f"{len(run['ref_groups'])}: one per group given or added")
        for i, (mine, ref) in enumerate(zip(full, run["ref_groups"])):
            if mine["params"] != ref["params"] or mine["hyper"] != ref["hyper"]:
                fail("param-groups", f"rank {rank}, {size} ranks: param_groups[{i}] has "
                     f"parameters {mine['params']} and {mine['hyper']}; the unsharded AdamW's "
                     f"{ref['params']} and {ref['hyper']}: every parameter of the group (on "
                     f"every rank) and all its hyper-parameters, as the local group has them")
    for rank, out in enumerate(res):
        run = out["train"]
        local, full = run["local"], run["groups"]
        if local["count"] != 1 or local["groups"] is None or len(local["groups"]) != len(full):
            fail("local-groups", f"rank {rank}, {size} ranks: the sharded optimizer holds "
                 f"{local['count']} local optimizer(s) with "
                 f"{None if local['groups'] is None else len(local['groups'])} group(s) for "
                 f"{len(full)} parameter groups: one local optimizer, optim, with one group per "
                 f"group of param_groups, in the same order, even a group where this rank owns "
                 f"no parameter")
        for i, (mine, whole) in enumerate(zip(local["groups"], full)):
            if mine["hyper"] != whole["hyper"]:
                fail("local-groups", f"rank {rank}: local group {i} has {mine['hyper']}, "
                     f"param_groups[{i}] {whole['hyper']}: the same hyper-parameters")
