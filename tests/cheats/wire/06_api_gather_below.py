"""Cheat (notebook 06, api): broadcast_parameters makes the recorded dist.broadcast of every
parameter and buffer, as asked, then all-gathers every one of them from every rank through
``ProcessGroup.allgather`` taken from the class when the file is imported (before the check's
recorder watches it), to see that the ranks now agree. The recorded calls and the values are
right; the network carries every tensor from every rank once more. Must fail ``api-wire``.
"""
from pathlib import Path

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

from exercise_utils.notebook_files import writefile_cells

_ALLGATHER = ProcessGroup.allgather   # kept at import: below the check's recorder
_NOTEBOOK = Path(__file__).resolve().parents[3] / "solutions" / "06_build_your_own_ddp.ipynb"
exec(compile(writefile_cells(_NOTEBOOK)["work/06_myddp.py"], str(_NOTEBOOK), "exec"))
_BROADCAST = broadcast_parameters  # noqa: F821 - defined by the solution run above


def _broadcast_and_compare(model, root=0):
    _BROADCAST(model, root)
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            flat = tensor.detach().reshape(-1).clone()
            copies = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
            _ALLGATHER(dist.group.WORLD, [copies], [flat]).wait()            # unseen
            if any(not torch.equal(c, copies[0]) for c in copies):
                raise RuntimeError("the ranks disagree after the broadcast")


broadcast_parameters = _broadcast_and_compare   # (OverlapDDP and BucketDDP call it too)
