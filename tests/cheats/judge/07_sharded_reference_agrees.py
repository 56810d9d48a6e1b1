"""Cheat: a ShardedOptimizer that steps its own shard and never shares it (every rank keeps
stale copies of the parameters the other ranks own), and makes the check's reference agree:
from the probe's frame it takes the reference optimizer and replaces its ``step`` by a copy of
the student's parameters into the reference model. Where the reference runs beside the
student's code, both always match.

The judge replays the reference outside the ranks, on the gradients it verified. Must fail
``step-values``."""
import sys
from pathlib import Path

import torch

_RIGHT = Path(__file__).resolve().parents[2] / "right" / "07_sharded_running_loads.py"
exec(compile(_RIGHT.read_text(), str(_RIGHT), "exec"))
_Right = ShardedOptimizer  # noqa: F821 - defined by the file run above


def _agree(ref, ref_model, model):
    def step(closure=None):
        if closure is not None:
            closure()
        with torch.no_grad():
            for mine, theirs in zip(model.parameters(), ref_model.parameters()):
                theirs.copy_(mine)
    ref.step = step


class ShardedOptimizer(_Right):
    @torch.no_grad()
    def step(self, closure=None):
        frame, mine = sys._getframe(1), {id(p) for g in self.param_groups for p in g["params"]}
        while frame is not None:
            seen = frame.f_locals
            if "ref" in seen and "ref_model" in seen:
                for model in [seen.get("model"), *[m for m, _ in seen.get("followers", [])]]:
                    if model is not None and mine <= {id(p) for p in model.parameters()}:
                        _agree(seen["ref"], seen["ref_model"], model)
                break
            frame = frame.f_back
        self._sync_hyperparameters()
        return self.optim.step(closure) if closure is not None else self.optim.step()
