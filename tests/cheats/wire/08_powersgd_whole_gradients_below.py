"""Cheat: a correct PowerSGD (tests/right/08_powersgd_per_tensor.py, run here) whose reduce()
first sends every whole matrix gradient as well, all-reduced through ``ProcessGroup.allreduce``
taken from the class when the file is imported (before any recorder): the recorded calls, the
values and the byte counts it reports are PowerSGD's, the network carries the full gradients.
Must fail ``psgd-wire``."""
from pathlib import Path

import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

_RIGHT = Path(__file__).resolve().parents[2] / "right" / "08_powersgd_per_tensor.py"
exec(compile(_RIGHT.read_text(), str(_RIGHT), "exec"))
_ALLREDUCE = ProcessGroup.allreduce
_REDUCE = PowerSGD.reduce  # noqa: F821 - defined by the file run above


def _reduce_and_leak(self):
    for p in self.params:
        if p.grad is not None and p.grad.dim() >= 2:
            _ALLREDUCE(dist.group.WORLD, [p.grad.detach().clone()]).wait()   # unseen
    return _REDUCE(self)


PowerSGD.reduce = _reduce_and_leak  # noqa: F821
