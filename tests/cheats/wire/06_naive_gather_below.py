"""Cheat (notebook 06, naive): allreduce_naive makes the recorded dist.all_reduce of every
gradient, as asked, after all-gathering that gradient from every rank through
``ProcessGroup.allgather`` taken from the class when the file is imported (before the check's
recorder watches it), to keep each rank's own. The recorded calls and the values are right;
the network carries every gradient from every rank once more. Must fail ``naive-wire``.
"""
from pathlib import Path

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

from exercise_utils.notebook_files import writefile_cells

_ALLGATHER = ProcessGroup.allgather   # kept at import: below the check's recorder
_NOTEBOOK = Path(__file__).resolve().parents[3] / "solutions" / "06_build_your_own_ddp.ipynb"
exec(compile(writefile_cells(_NOTEBOOK)["work/06_myddp.py"], str(_NOTEBOOK), "exec"))
_NAIVE = allreduce_naive  # noqa: F821 - defined by the solution run above


def _gather_then_naive(params):
    for p in params:
        if p.grad is not None:
            flat = p.grad.detach().reshape(-1).clone()
            copies = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
            _ALLGATHER(dist.group.WORLD, [copies], [flat]).wait()            # unseen
            _NAIVE([p])


allreduce_naive = _gather_then_naive    # (the "naive" strategy looks it up when resolved)
