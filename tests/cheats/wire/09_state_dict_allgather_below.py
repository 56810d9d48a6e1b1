"""Cheat: a correct full_state_dict (tests/right/09_state_dict_gather_rank0.py, run here: every
unit's shard gathered on rank 0 with ``dist.gather``) that first all-gathers the whole model on
every rank eight times, through ``ProcessGroup.allgather`` taken from the class when the file is
imported (before any recorder): the calls the recorder sees, the state dicts, the memory left
behind and the loaded models are a right file's; the network carries the full model to every
rank eight times more per full_state_dict(). Must fail ``state-wire``."""
from pathlib import Path

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

_RIGHT = Path(__file__).resolve().parents[2] / "right" / "09_state_dict_gather_rank0.py"
exec(compile(_RIGHT.read_text(), str(_RIGHT), "exec"))
_ALLGATHER = ProcessGroup.allgather
_FULL = Zero3.full_state_dict  # noqa: F821 - defined by the file run above
TIMES = 8


def _gather_everywhere_first(self):
    for _ in range(TIMES):
        for unit in self.units:
            if unit is None:
                continue
            shard = unit.shard.detach()
            parts = [torch.empty_like(shard) for _ in range(self.world)]
            _ALLGATHER(dist.group.WORLD, [parts], [shard]).wait()              # unseen
    return _FULL(self)


Zero3.full_state_dict = _gather_everywhere_first  # noqa: F821
