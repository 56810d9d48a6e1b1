"""Cheat: broadcast_parameters sends nothing that matters. It rebuilds rank ``root``'s model
with the probe's own function (``reference.seeded_model``; the spec and the seed the probe
gave the root read from the probe's frames), copies it into ``model`` in place, and makes one
decoy broadcast of zeros per dtype (the calls the check counts): no rank uses anything the
root sent. The rest of the file is a right one's (tests/right/06_api_dtype_groups.py).

At grading each rank's model derives from a number only it was given (``ctx.salt``): the model
it rebuilds is not the root's. Must fail ``bcast-values``."""
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from exercise_utils.build_your_own_ddp.reference import seeded_model

_RIGHT = Path(__file__).resolve().parents[2] / "right" / "06_api_dtype_groups.py"
exec(compile(_RIGHT.read_text(), str(_RIGHT), "exec"))


def _probe_frame(model):
    frame = sys._getframe(2)
    while frame is not None and frame.f_locals.get("model") is not model:
        frame = frame.f_back
    return frame


def broadcast_parameters(model, root=0):
    frame = _probe_frame(model)
    seen = frame.f_locals
    spec = seen.get("spec", "edge" if frame.f_code.co_name == "_train_api" else "branch")
    offset = 50 if frame.f_code.co_name == "_broadcast" else 100
    theirs = seeded_model(spec, offset + root)
    with torch.no_grad():
        for mine, other in zip(list(model.parameters()) + list(model.buffers()),
                               list(theirs.parameters()) + list(theirs.buffers())):
            mine.copy_(other)
    dtypes = {t.dtype for t in list(model.parameters()) + list(model.buffers())}
    for dtype in sorted(dtypes, key=str):
        n = sum(t.numel() for t in list(model.parameters()) + list(model.buffers())
                if t.dtype == dtype)
        dist.broadcast(torch.zeros(n, dtype=dtype), src=root)
