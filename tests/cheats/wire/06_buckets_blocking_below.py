"""Cheat (notebook 06, buckets): BucketDDP starts the recorded asynchronous dist.all_reduce of
a zero buffer of each complete bucket's size during backward (what the check counts and
times), while finish_gradient_synchronization averages each bucket's gradients after backward
with a blocking all-reduce through ``ProcessGroup.allreduce`` taken from the class when the
file is imported (before the check's recorder watches it). The recorded calls and the values
are right; the network carries every bucket twice. Must fail ``buckets-wire``.
"""
from pathlib import Path

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup
from torch._utils import _flatten_dense_tensors

from exercise_utils.notebook_files import writefile_cells

_ALLREDUCE = ProcessGroup.allreduce   # kept at import: below the check's recorder
_NOTEBOOK = Path(__file__).resolve().parents[3] / "solutions" / "06_build_your_own_ddp.ipynb"
exec(compile(writefile_cells(_NOTEBOOK)["work/06_myddp.py"], str(_NOTEBOOK), "exec"))
_FINISH = BucketDDP.finish_gradient_synchronization  # noqa: F821 - defined by the solution


def _count_then_start_decoy(self, param):
    if not self._sync:
        return
    self._arrived.add(id(param))
    i = self._bucket_of[id(param)]
    self._ready[i] += 1
    if self._ready[i] == len(self._bucket_params[i]):
        flat = _flatten_dense_tensors([p.grad for p in self._bucket_params[i]])
        decoy = torch.zeros_like(flat)
        self._pending.append((i, flat, dist.all_reduce(decoy, async_op=True)))


def _reduce_below_then_finish(self):
    for _, flat, _ in self._pending:
        _ALLREDUCE(dist.group.WORLD, [flat]).wait()                          # unseen
    _FINISH(self)                       # waits for the decoys, divides, copies back


BucketDDP._on_grad_ready = _count_then_start_decoy  # noqa: F821
BucketDDP.finish_gradient_synchronization = _reduce_below_then_finish  # noqa: F821
