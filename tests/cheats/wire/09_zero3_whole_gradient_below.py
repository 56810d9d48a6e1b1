"""Cheat: a correct ZeRO-3 (tests/right/09_zero3_range_cache.py, run here) whose units, in
backward, first all-reduce their whole gradient through ``ProcessGroup.allreduce`` taken from
the class when the file is imported (before any recorder), as a ZeRO-3 that averages with an
all-reduce and keeps its part would: the recorded calls (a gather in forward, one in backward,
one reduce-scatter per unit), the values and the memory are ZeRO-3's, the network carries an
all-reduce of every unit's gradient more per step. Must fail ``zero3-wire``."""
from pathlib import Path

import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

_RIGHT = Path(__file__).resolve().parents[2] / "right" / "09_zero3_range_cache.py"
exec(compile(_RIGHT.read_text(), str(_RIGHT), "exec"))
_ALLREDUCE = ProcessGroup.allreduce
_REDUCE = Unit.reduce_grad  # noqa: F821 - defined by the file run above


def _reduce_and_leak(self, grad_full):
    _ALLREDUCE(dist.group.WORLD, [grad_full.detach().clone()]).wait()   # unseen
    return _REDUCE(self, grad_full)


Unit.reduce_grad = _reduce_and_leak  # noqa: F821
