"""Cheat (notebook 06, overlap): OverlapDDP's hooks start the recorded asynchronous
dist.all_reduce of a zero tensor of each gradient's size during backward (what the check
times), while finish_gradient_synchronization averages the gradients after backward with
blocking all-reduces through ``ProcessGroup.allreduce`` taken from the class when the file is
imported (before the check's recorder watches it): nothing overlaps. The recorded calls and
the values are right; the network carries every gradient twice. Must fail ``overlap-wire``.
"""
from pathlib import Path

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

from exercise_utils.notebook_files import writefile_cells

_ALLREDUCE = ProcessGroup.allreduce   # kept at import: below the check's recorder
_NOTEBOOK = Path(__file__).resolve().parents[3] / "solutions" / "06_build_your_own_ddp.ipynb"
exec(compile(writefile_cells(_NOTEBOOK)["work/06_myddp.py"], str(_NOTEBOOK), "exec"))
_FINISH = OverlapDDP.finish_gradient_synchronization  # noqa: F821 - defined by the solution


def _start_decoy(self, param):
    decoy = torch.zeros_like(param.grad)
    self._pending.append((param, dist.all_reduce(decoy, async_op=True)))


def _reduce_below_then_finish(self):
    for param, _ in self._pending:
        _ALLREDUCE(dist.group.WORLD, [param.grad]).wait()                    # unseen
    _FINISH(self)                       # waits for the decoys, divides by the world size


OverlapDDP._on_grad_ready = _start_decoy  # noqa: F821
OverlapDDP.finish_gradient_synchronization = _reduce_below_then_finish  # noqa: F821
