"""RIGHT (notebook 09, zero2): ``09_zero2_padchunk`` (run here) whose ``Zero2.__init__`` first
makes every rank start from rank 0's parameters: one ``dist.broadcast`` per trainable
parameter (a careful student's guard against ranks built from different seeds; the notebook
neither asks for it nor forbids it, and ``step()`` still issues one reduce-scatter and one
all-gather only). On the wire that is (N - 1) x the parameters more per ``Zero2`` built, which
the envelope allows.

The checker must accept it.
"""
from pathlib import Path

import torch
import torch.distributed as dist

_BASE = Path(__file__).resolve().with_name("09_zero2_padchunk.py")
exec(compile(_BASE.read_text(), str(_BASE), "exec"))
_INIT = Zero2.__init__  # noqa: F821 - defined by the file run above


def _init_synced(self, params, optimizer_cls, **defaults):
    params = list(params)
    with torch.no_grad():
        for p in params:
            if p.requires_grad:             # every rank starts from rank 0's parameters
                dist.broadcast(p.data, src=0)
    _INIT(self, params, optimizer_cls, **defaults)


Zero2.__init__ = _init_synced  # noqa: F821
