"""The checkpoint checker of notebook 07 (ZeRO-1): ``check_checkpoint`` for ``work/07_zero.py``.

It shares the launches of :mod:`.checks` (one per world size, 2, 3 and 1 gloo ranks, kept per
file content; the probe: :mod:`.probes_checkpoint`). After ``consolidate_state_dict()`` (``to``
left at 0), then ``to=size - 1``, then ``to=1 % size`` after more steps and a changed lr, rank
``to``'s ``state_dict()`` equals the unsharded optimizer's at that moment (state and groups)
and every other rank's raises RuntimeError, as it does everywhere before any consolidation;
a fresh ``ShardedOptimizer`` that loads the unsharded optimizer's state dict keeps only its
shard, takes the groups' hyper-parameters and trains on exactly like the reference, and so
does one that loads the consolidated state dict (float32, float64 and EdgeNet). On a model
whose parameters with a gradient change from step to step (the probe's Switch), the state of a
parameter appears in the consolidated state dict once it has had a gradient, also after a
resume: a fresh optimizer that loaded the state dict, trained on and consolidated again.

Used in 07_bonus_zero_sharding.
"""
import numpy as np

from ..harness import check
from ..contract import fail
from . import probes_base, replay
from .checks import TIMEOUT, sharded_results, stage_results
from .checks_sharded import ATOL, RTOL, TIGHT, compare, expected_owners

FORMAT = ("the format of the unsharded optimizer: {'state': {global index: {name: tensor}}, "
          "'param_groups': [{hyper-parameters..., 'params': [global indices]}]}")


def _same_value(a, b, tol):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.shape(a) == np.shape(b) and np.allclose(a, b, atol=tol[0], rtol=tol[1])
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same_value(x, y, tol) for x, y in zip(a, b))
    return a == b


def _same_state_dict(case, got, want, call, tol):
    keys = sorted(got.get("state", {}))
    if keys != sorted(want["state"]):
        missing, extra = sorted(set(want["state"]) - set(keys)), sorted(set(keys) -
                                                                    set(want["state"]))
        fail(case, f"{call}: its 'state' has entries {keys}; the unsharded AdamW's has "
                   f"{sorted(want['state'])} (missing: {missing}, not expected: {extra}; one "
                   f"per parameter that has state, numbered over "
                   f"all groups in order, a parameter without gradient included in the "
                   f"numbering): map each rank's local indices to the global ones")
    for index, state in want["state"].items():
        for key, value in state.items():
            if key not in got["state"][index] or not _same_value(got["state"][index][key],
                                                                 value, tol):
                fail(case, f"{call}: state[{index}][{key!r}] differs from the unsharded "
                           f"AdamW's (its parameter {index} of the groups in order; tolerance "
                           f"{tol[0]:g}): each global index must hold the state of that "
                           f"parameter as it is now, in its own dtype")
    groups = got.get("param_groups", [])
    if len(groups) != len(want["param_groups"]):
        fail(case, f"{call}: {len(groups)} param_groups; the unsharded AdamW has "
                   f"{len(want['param_groups'])}")
    for i, (mine, ref) in enumerate(zip(groups, want["param_groups"])):
        for key, value in ref.items():
            if key not in mine or not _same_value(mine[key], value, tol):
                fail(case, f"{call}: param_groups[{i}][{key!r}] is {mine.get(key, 'missing')!r},"
                           f" the unsharded AdamW's {value!r}: every group with all its "
                           f"hyper-parameters as they are now and the global indices of all its "
                           f"parameters")


@check
def check_consolidated(case, runs, size, call, tol=(ATOL, RTOL)):
    """What ``state_dict()`` gave on rank ``to`` after ``call``, against the reference's."""
    to = runs[0]["to"]
    got, want = runs[to]["got"], runs[to]["ref"]
    call = f"{call} then state_dict() on rank {to} with {size} rank(s)"
    if "raised" in got:
        fail(case, f"{call} raised {got['raised']}: {got['message']}: rank {to} must hold the "
                   f"whole state")
    if "bad" in got:
        fail(case, f"{call} returned {got['bad']}; expected {FORMAT}")
    _same_state_dict(case, got["ok"], want, call, tol)


def _must_raise(case, rank, got, when):
    if got.get("raised") == "RuntimeError":
        return
    what = (f"raised {got['raised']}" if "raised" in got else "returned a state dict")
    fail(case, f"rank {rank}: state_dict() {when} {what}; it must raise RuntimeError (this rank "
               f"holds no consolidated state: only rank `to` of the last consolidate_state_dict "
               f"call does, every other rank drops what an earlier call left it)")


def _loadable(case, run, size):
    if run["unloadable"]:
        fail(case, f"the state dict that state_dict() returned on rank {run['to']} with {size} "
                   f"rank(s) cannot be loaded back: {run['unloadable']}. It must be in {FORMAT}, "
                   f"as torch's optimizers return it (tensors, AdamW's step count included)")


@check
def check_loaded(res, size):
    """The fresh optimizers that loaded a state dict: shard only, groups' settings, values."""
    nets = [out["net"] for out in res]
    holders = {n: [r for r, net in enumerate(nets) if n in net["loaded_state"]]
               for n in probes_base.numels()}
    owners = expected_owners(size)
    for name, ranks in holders.items():
        if ranks != [owners[name]]:
            fail("load-shard-only", f"after load_state_dict of the whole state with {size} "
                 f"rank(s) the state of {name} is on ranks {ranks}, expected only on its owner "
                 f"{owners[name]}: each rank keeps only its shard's state (kept per rank: "
                 f"{[len(net['loaded_state']) for net in nets]} of {len(owners)} parameters)")
    for rank, net in enumerate(nets):
        for i, (mine, ref) in enumerate(zip(net["loaded_groups"], net["ref_groups"])):
            if mine["hyper"] != ref["hyper"]:
                fail("load-hyper", f"rank {rank}: after load_state_dict param_groups[{i}] has "
                     f"{mine['hyper']}; the state dict's group has {ref['hyper']}: load every "
                     f"group's hyper-parameters into self.param_groups too (step() copies them "
                     f"to the local optimizer)")
    what = (f"load_state_dict, then {probes_base.MORE_STEPS} steps (a fresh ShardedOptimizer built "
            f"with lr={10 * probes_base.LR:g})")
    for rank, net in enumerate(nets):
        compare("load-values", rank, size, {"final": net["loaded_final"],
                                            "ref": net["ref_final"]},
                f"{what} of the unsharded AdamW's state_dict", "load each parameter's state "
                "(step counts included) and the groups' hyper-parameters")
    for rank, net in enumerate(nets):
        _loadable("load-round-trip", net["fresh"], size)
        compare("load-round-trip", rank, size, {"final": net["trip_final"],
                                                "ref": net["ref_final"]},
                f"{what} of the state_dict() your consolidate_state_dict made", "what "
                "state_dict() returns after consolidating must load back (tensors, step "
                "counts and all, in the unsharded optimizer's format) and train on alike")


@check
def _check_switch(res, size):
    """The Switch run: consolidated while c.* and spare.* never had a gradient, again after c's
    first one; and by a fresh optimizer that loaded the first state dict and trained alike."""
    runs = [out["switch"] for out in res]
    model = (f"a model whose forward uses one branch per step (step 1: a, step 2: b, step "
             f"{probes_base.SHORT}: a)")
    first = f"{probes_base.SHORT} steps of {model}, consolidate_state_dict() (c.* and " \
            f"spare.* never had a gradient: no state, no entry)"
    check_consolidated("checkpoint-varying", [r["first"] for r in runs], size, first)
    for rank, run in enumerate(runs):
        _loadable("checkpoint-varying", run["first"], size)
    more = "2 more steps (c.* gets its first gradient in the first, b.* in the second)"
    check_consolidated("checkpoint-varying", [r["again"] for r in runs], size,
                       f"{first}, {more}, consolidate_state_dict(to={size - 1}) (each call "
                       f"gathers the state as it is now: c.* has state since)")
    for rank, run in enumerate(runs):
        compare("checkpoint-varying", rank, size, {"final": run["final"],
                                                   "ref": run["ref_final"]},
                f"{first}, then {more}", "the state of every parameter that has one")
    resumed = (f"{first}; load_state_dict of that state dict into a fresh ShardedOptimizer, "
               f"{more}, consolidate_state_dict(to={1 % size}) (spare.* never had a gradient: "
               f"no entry in the state dict loaded, no state after loading, no entry now)")
    check_consolidated("checkpoint-resumed", [r["resumed"] for r in runs], size, resumed)
    for rank, run in enumerate(runs):
        compare("checkpoint-resumed", rank, size, {"final": run["trip_final"],
                                                   "ref": run["trip_ref"]},
                f"{first}; load_state_dict of it into a fresh ShardedOptimizer, then {more}",
                "a parameter without an entry in the state dict has no state after loading, "
                "and the local optimizer creates it at its first gradient, as AdamW does")


@check
def check_checkpoint(path, timeout=TIMEOUT):
    """Check ``consolidate_state_dict``, ``state_dict`` and ``load_state_dict`` (2, 3 and 1
    ranks; the same launches as ``check_sharded``; on the wire, a launch that trains then
    consolidates, against the training alone: ``checkpoint-wire``)."""
    for size, res in stage_results(path, "checkpoint", timeout):
        # the reference, replayed here: never the ranks'
        replay.judge_checkpoint(res, size, sharded_results(path, size))
        nets = [out["net"] for out in res]
        check_consolidated("consolidate-values", [n["default"] for n in nets], size,
                           "consolidate_state_dict() (to left at its default, 0)")
        check_consolidated("consolidate-to", [n["last"] for n in nets], size,
                           f"consolidate_state_dict(to={size - 1})")
        for rank, net in enumerate(nets):
            _must_raise("state-dict-raises", rank, net["before"], "before any "
                        "consolidate_state_dict")
        for key, call in (("default", "consolidate_state_dict()"),
                          ("last", f"consolidate_state_dict(to={size - 1})")):
            for rank, net in enumerate(nets):
                if rank != net[key]["to"]:
                    _must_raise("consolidate-other-ranks", rank, net[key]["got"], f"after {call}")
        check_consolidated("consolidate-fresh", [n["fresh"] for n in nets], size,
                           f"halving group 0's lr, 2 more steps, halving it again (a "
                           f"scheduler's step: no step() since), consolidate_state_dict(to="
                           f"{1 % size})")
        for rank, net in enumerate(nets):
            if rank != net["fresh"]["to"]:
                _must_raise("consolidate-other-ranks", rank, net["fresh"]["got"],
                            f"after consolidate_state_dict(to={1 % size})")
        check_loaded(res, size)
        for case, key, tol in (("checkpoint-float64", "float64", TIGHT),
                               ("checkpoint-edge", "edge", (ATOL, RTOL))):
            runs = [out[key] for out in res]
            model = "a float64 model" if key == "float64" else "EdgeNet"
            check_consolidated(case, runs, size, f"consolidate_state_dict() on {model}", tol)
            for rank, run in enumerate(runs):
                _loadable(case, run, size)
                compare(case, rank, size, {"final": run["final"], "ref": run["ref_final"]},
                        f"load_state_dict of the consolidated state dict of {model}, then 2 "
                        f"steps", "the state of every parameter that has one, in the "
                        "parameters' dtype, under its global index", tol)
        _check_switch(res, size)
