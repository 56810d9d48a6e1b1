"""Cheat (notebook 07, sharded): a correct ShardedOptimizer whose step() then keeps a replica
of the whole optimizer state on every rank, all-gathered tensor by tensor after every step (a
rank that dies loses nothing), in a plain dict the check's measure of the state never looks
into: the values, the broadcasts and the measured state are ZeRO-1's, the network carries every
rank's moments to every rank once more per step. Nothing in a rank records 07's collectives.
Must fail ``sharded-wire``.
"""
from pathlib import Path

import torch
import torch.distributed as dist

from exercise_utils.notebook_files import writefile_cells

_NOTEBOOK = Path(__file__).resolve().parents[3] / "solutions" / "07_bonus_zero_sharding.ipynb"
exec(compile(writefile_cells(_NOTEBOOK)["work/07_zero.py"], str(_NOTEBOOK), "exec"))
_STEP = ShardedOptimizer.step  # noqa: F821 - defined by the solution run above
# (07_checkpoint_state_replica.py runs this file for _replicate and puts _STEP back)


def _replicate(sharded):
    """Every parameter's optimizer state, all-gathered from every rank tensor by tensor (the
    owner's, zeros elsewhere), its owner's copy kept on every rank: a replica of the whole
    state, in a plain dict (no optimizer: the check's measure of the state never finds it)."""
    replica = sharded.__dict__.setdefault("_replica", {})
    for group in sharded.param_groups:
        for p in group["params"]:
            state = sharded.optim.state.get(p, {})
            for key in ("exp_avg", "exp_avg_sq"):
                mine = state.get(key)
                mine = (torch.zeros_like(p) if mine is None else mine).detach().reshape(-1)
                copies = [torch.empty_like(mine) for _ in range(sharded.world_size)]
                dist.all_gather(copies, mine.contiguous())
                replica[id(p), key] = copies[sharded.owners[id(p)]]


@torch.no_grad()
def _step_then_replicate(self, closure=None):
    loss = _STEP(self, closure)
    _replicate(self)                                                         # unasked
    return loss


ShardedOptimizer.step = _step_then_replicate  # noqa: F821
