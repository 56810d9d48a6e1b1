"""Cheat: DistributedBatchNorm never uses what another rank sends. It rebuilds the global batch
with the probe's own function (``probes_batchnorm.bn_data``; the case, the rank and the step
read from the probe's frames), takes the statistics of its group's rows from it, and adds the
other ranks' part of the input gradient through a term worth zero (their outputs' loss, whose
weights it rebuilds too); one decoy all_reduce of zeros per forward. The rest of the file is a
right one's (tests/right/03_sync_batchnorm_separate_all_reduces.py).

At grading each rank's rows derive from a number only it was given (``ctx.salt``): the batch it
rebuilds is not the ranks'. Must fail ``bn-output``."""
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from exercise_utils.torch_distributed_collectives.probes_batchnorm import bn_data

_RIGHT = Path(__file__).resolve().parents[2] / "right" / "03_sync_batchnorm_separate_all_reduces.py"
exec(compile(_RIGHT.read_text(), str(_RIGHT), "exec"))
_Right = DistributedBatchNorm  # noqa: F821 - from the right file


def _probe():
    frame = sys._getframe(2)
    while frame is not None and not {"case", "ctx"} <= frame.f_locals.keys():
        frame = frame.f_back
    return frame.f_locals["case"], frame.f_locals["ctx"]


class DistributedBatchNorm(_Right):
    def forward(self, x):
        if not self.training and self.track_running_stats:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight,
                                self.bias, False, 0.0, self.eps)
        case, ctx = _probe()
        steps, x_eval = bn_data(case)
        if self.training:
            step = self.__dict__.setdefault("steps_seen", 0)
            self.steps_seen = step + 1
            big_x, big_w = steps[step]
        else:                                 # eval mode without running statistics
            big_x, big_w = x_eval, torch.zeros_like(x_eval)
        sizes = case["sizes"]
        group = next((g for g in case.get("group") or [] if ctx.rank in g), range(len(sizes)))
        rows = {r: slice(sum(sizes[:r]), sum(sizes[:r + 1])) for r in group}
        parts = [x if r == ctx.rank else big_x[rows[r]].to(x.dtype) for r in group]
        whole = torch.cat(parts)
        c, view = x.size(1), (1, x.size(1)) + (1,) * (x.dim() - 2)
        flat = whole.transpose(0, 1).reshape(c, -1)
        count = flat.size(1)
        mean, var = flat.mean(1), flat.var(1, unbiased=False)
        dist.all_reduce(torch.zeros(3 * c, dtype=x.dtype))            # the decoy
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / self.num_batches_tracked.item() if self.momentum is None
                      else self.momentum)
            with torch.no_grad():
                self.running_mean.lerp_(mean, factor)
                self.running_var.lerp_(var * count / (count - 1), factor)
        y = (whole - mean.reshape(view)) / torch.sqrt(var.reshape(view) + self.eps)
        if self.weight is not None:
            y = y * self.weight.detach().reshape(view) + self.bias.detach().reshape(view)
            mine = ((x - mean.reshape(view)) / torch.sqrt(var.reshape(view) + self.eps)
                    ).detach() * self.weight.reshape(view) + self.bias.reshape(view)
        start = sum(sizes[r] for r in group if r < ctx.rank)
        local = y[start:start + x.size(0)]
        others = torch.cat([y[:start], y[start + x.size(0):]])
        weights = [big_w[rows[r]] for r in group if r != ctx.rank]
        theirs = (others * torch.cat(weights).to(x.dtype)).sum() if weights else 0.0
        w_here = big_w[rows[ctx.rank]].to(x.dtype)
        norm = (w_here * w_here).sum()
        extra = (theirs - theirs.detach()) * w_here / norm if weights and norm > 0 else 0
        if self.weight is not None:          # parameters' gradients: this rank's part only
            local = mine + (local - local.detach())
        return local + extra
