"""RIGHT (notebook 03, sync_batchnorm): moves the channel axis first and flattens to (C, M),
accumulates the per-channel count, sum and sum of squares in float64 whatever the input
dtype (one differentiable all_reduce of a (3, C) float64 tensor), casts mean and variance back
to the input dtype, normalises with ``rsqrt`` and ``addcmul``, and updates the running
statistics by ``lerp_``.

Written from the release notebook alone; the checker must accept it.
"""
import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn   # collectives with autograd support
import torch.nn.functional as F
from torch import nn

warnings.filterwarnings("ignore", message="torch.distributed.nn.functional.all_reduce")


class DistributedBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm over the union of all ranks' batches (inputs ``(N, C)`` or ``(N, C, ...)``)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, group=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.group = group

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError(f"expected a (N, C) or (N, C, ...) input, got shape {tuple(x.shape)}")

    def forward(self, x):
        self._check_input_dim(x)
        if not self.training and self.track_running_stats:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight,
                                self.bias, False, 0.0, self.eps)
        channels = x.shape[1]
        rows = x.movedim(1, 0).flatten(1).double()             # (C, M), M may be 0
        local = torch.stack([
            torch.full((channels,), float(rows.shape[1]), dtype=torch.float64),
            rows.sum(1),
            (rows * rows).sum(1),
        ])
        group = self.group if self.group is not None else dist.group.WORLD
        count, total, squares = dist_nn.all_reduce(local, op=dist.ReduceOp.SUM, group=group)
        n = float(count[0].detach())
        if n == 1:                                           # as nn.BatchNorm would
            raise ValueError("Expected more than 1 value per channel when training")
        mean64 = total / n
        var64 = (squares / n - mean64 * mean64).clamp_min(0)   # biased variance

        shape = [1, channels] + [1] * (x.dim() - 2)
        mean = mean64.to(x.dtype)
        inv_std = torch.rsqrt(var64.to(x.dtype) + self.eps)
        y = (x - mean.view(shape)) * inv_std.view(shape)
        if self.weight is not None:
            y = torch.addcmul(self.bias.view(shape), y, self.weight.view(shape))

        if self.training and self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                          else self.momentum)
                unbiased = var64 * (n / (n - 1))
                self.running_mean.lerp_(mean64.to(self.running_mean.dtype), factor)
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), factor)
        return y


def convert_batchnorm(module, group=None):
    """Replace every ``nn.BatchNorm1d`` / ``nn.BatchNorm2d`` by a DistributedBatchNorm (given)."""
    if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
        new = DistributedBatchNorm(module.num_features, module.eps, module.momentum,
                                   module.affine, module.track_running_stats, group)
        new.load_state_dict(module.state_dict())
        new.train(module.training)
        return new
    for name, child in module.named_children():
        setattr(module, name, convert_batchnorm(child, group))
    return module
