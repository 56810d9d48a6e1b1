"""Cheat (notebook 06, flat): allreduce_flat makes the recorded dist.all_reduce of one flat
buffer, as asked, after all-gathering the whole flat gradient from every rank through
``ProcessGroup.allgather`` taken from the class when the file is imported (before the check's
recorder watches it). The recorded call and the values are right; the network carries the
whole gradient from every rank once more per step. Must fail ``flat-wire``.
"""
from pathlib import Path

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup
from torch._utils import _flatten_dense_tensors

from exercise_utils.notebook_files import writefile_cells

_ALLGATHER = ProcessGroup.allgather   # kept at import: below the check's recorder
_NOTEBOOK = Path(__file__).resolve().parents[3] / "solutions" / "06_build_your_own_ddp.ipynb"
exec(compile(writefile_cells(_NOTEBOOK)["work/06_myddp.py"], str(_NOTEBOOK), "exec"))
_FLAT = allreduce_flat  # noqa: F821 - defined by the solution run above


def _gather_then_flat(params):
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        flat = _flatten_dense_tensors(grads)
        copies = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
        _ALLGATHER(dist.group.WORLD, [copies], [flat]).wait()                # unseen
    _FLAT(params)


allreduce_flat = _gather_then_flat      # (the "flat" strategy looks it up when resolved)
