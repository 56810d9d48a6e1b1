"""The checkpoint checker of notebook 07 (ZeRO-1): ``check_checkpoint`` for ``work/07_zero.py``.

It shares the launches of :mod:`.checks` (one per world size, 2 and 3 gloo ranks, kept per
file content): the consolidated ``state_dict()`` on rank ``to`` equals the unsharded
optimizer's (state and groups), and a fresh ``ShardedOptimizer`` that loads the unsharded
optimizer's state dict keeps only its shard and trains on exactly like the reference.

Used in 07_bonus_zero_sharding.
"""
import numpy as np

from ..harness import assert_close
from . import probes
from .checks import ATOL, RTOL, TIMEOUT, stage_results


def _same_value(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.shape(a) == np.shape(b) and np.allclose(a, b, atol=ATOL, rtol=RTOL)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    return a == b


def _check_consolidated(got, want, size, to):
    call = f"consolidate_state_dict(to={to}) then state_dict() on rank {to} with {size} ranks"
    if got is None:
        raise AssertionError(f"{call} returned None: rank {to} must hold the whole state")
    if sorted(got.get("state", {})) != sorted(want["state"]):
        raise AssertionError(
            f"{call}: its 'state' has entries {sorted(got.get('state', {}))}; the unsharded "
            f"AdamW's has {sorted(want['state'])} (one per parameter, numbered over all groups "
            f"in order): map each rank's local indices to the global ones")
    for index, state in want["state"].items():
        mine = got["state"][index]
        for key, value in state.items():
            if key not in mine or not _same_value(mine[key], value):
                raise AssertionError(
                    f"{call}: state[{index}][{key!r}] differs from the unsharded AdamW's "
                    f"(its parameter {index} of the groups in order): each global index must "
                    f"hold the state of that parameter")
    groups = got.get("param_groups", [])
    if len(groups) != len(want["param_groups"]):
        raise AssertionError(f"{call}: {len(groups)} param_groups; the unsharded AdamW has "
                             f"{len(want['param_groups'])}")
    for i, (mine, ref) in enumerate(zip(groups, want["param_groups"])):
        for key, value in ref.items():
            if key not in mine or not _same_value(mine[key], value):
                raise AssertionError(
                    f"{call}: param_groups[{i}][{key!r}] is {mine.get(key, 'missing')!r}, the "
                    f"unsharded AdamW's {value!r}: every group with all its hyper-parameters "
                    f"and the global indices of all its parameters")


def check_checkpoint(path, timeout=TIMEOUT):
    """Check ``consolidate_state_dict``, ``state_dict`` and ``load_state_dict`` (2 and 3
    ranks; the same launches as ``check_sharded``)."""
    for size, res in stage_results(path, "checkpoint", timeout):
        to = res[0]["to"]
        _check_consolidated(res[to]["consolidated"], res[to]["ref_state"], size, to)
        numels = probes.numels()
        held = [sorted(out["loaded_state"]) for out in res]
        if any(len(h) == len(numels) for h in held) and size > 1:
            raise AssertionError(f"after load_state_dict of the whole state with {size} ranks "
                                 f"the ranks keep state for {[len(h) for h in held]} of "
                                 f"{len(numels)} parameters: each must keep only its shard's")
        for rank, out in enumerate(res):
            assert_close(out["loaded_final"], out["ref_final"], f"a fresh ShardedOptimizer "
                         f"(built with lr={10 * probes.LR:g}) that loaded the unsharded AdamW's "
                         f"state_dict after {probes.STEPS} steps, then trained "
                         f"{probes.MORE_STEPS} more steps with {size} ranks, must follow the "
                         f"unsharded AdamW: load each "
                         f"parameter's state (step counts included) and the groups' "
                         f"hyper-parameters (lr={probes.LR:g}), into param_groups too: "
                         f"step() copies them to the local optimizer", rank, ATOL, RTOL)
