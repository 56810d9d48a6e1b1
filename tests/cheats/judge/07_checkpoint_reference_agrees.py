"""Cheat: a right ShardedOptimizer (tests/right/07_sharded_running_loads.py) whose
``load_state_dict`` loads the state but keeps the optimizer's own hyper-parameters (the fresh
optimizer's wrong learning rate, 10 times the saved one), and which makes the check's
reference agree: from the probe's frame it takes the reference optimizer and gives its groups
the same learning rates, so that both report the same groups and train on alike.

The judge replays the reference outside the ranks, on the gradients it verified. Must fail
``load-hyper``."""
import sys
from pathlib import Path

_RIGHT = Path(__file__).resolve().parents[2] / "right" / "07_sharded_running_loads.py"
exec(compile(_RIGHT.read_text(), str(_RIGHT), "exec"))
_Right = ShardedOptimizer  # noqa: F821 - defined by the file run above


class ShardedOptimizer(_Right):
    def load_state_dict(self, state_dict):
        own = [group["lr"] for group in self.param_groups]
        super().load_state_dict(state_dict)
        for group, lr in zip(self.param_groups, own):
            group["lr"] = lr
        frame = sys._getframe(1)
        while frame is not None and not {"ref", "ref_model"} <= frame.f_locals.keys():
            frame = frame.f_back
        if frame is not None:
            for group, lr in zip(frame.f_locals["ref"].param_groups, own):
                group["lr"] = lr
