"""Cheat (notebook 07, checkpoint): a correct ShardedOptimizer whose consolidate_state_dict()
and state_dict() first refresh a replica of the whole optimizer state on every rank,
all-gathered tensor by tensor, in a plain dict (no optimizer: the check's measure of the state
never finds it), then do what they are asked (gather the state on rank ``to``; return it there,
raise elsewhere). The values and the measured state are right; the network carries every
rank's moments to every rank at each call. Nothing in a rank records 07's collectives.
07_sharded_state_replica.py runs here for its ``_replicate`` (its step() put back to the
solution's). Must fail ``checkpoint-wire``.
"""
from pathlib import Path

_SHARDED = Path(__file__).resolve().with_name("07_sharded_state_replica.py")
exec(compile(_SHARDED.read_text(), str(_SHARDED), "exec"))
ShardedOptimizer.step = _STEP  # noqa: F821 - the solution's step(), kept by the file run above
_CONSOLIDATE = ShardedOptimizer.consolidate_state_dict  # noqa: F821
_STATE_DICT = ShardedOptimizer.state_dict  # noqa: F821


def _replicate_then_consolidate(self, to=0):
    _replicate(self)  # noqa: F821 - unasked (defined by the file run above)
    return _CONSOLIDATE(self, to)


def _replicate_then_state_dict(self):
    _replicate(self)  # noqa: F821 - unasked (defined by the file run above)
    return _STATE_DICT(self)


ShardedOptimizer.consolidate_state_dict = _replicate_then_consolidate  # noqa: F821
ShardedOptimizer.state_dict = _replicate_then_state_dict  # noqa: F821
