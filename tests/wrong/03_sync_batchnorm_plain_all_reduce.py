"""Wrong: the in-place dist.all_reduce instead of the differentiable one: the forward is right,
but autograd does not see the collective (it treats the global sums as the local ones), so the
other ranks' loss terms never reach this rank's input gradients.

Violates: "from a differentiable ``torch.distributed.nn.functional.all_reduce`` (SUM) of the
count, the sum and the sum of squares (one call can carry all three), so ``backward`` is right
on every rank"
"""
import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn   # collectives with autograd support
import torch.nn.functional as F
from torch import nn

# torch.distributed.nn.functional is marked deprecated (in favour of the private
# torch.distributed._functional_collectives); it is still the public differentiable all_reduce.
warnings.filterwarnings("ignore", message="torch.distributed.nn.functional.all_reduce")


class DistributedBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm over the union of all ranks' batches (inputs ``(N, C)`` or ``(N, C, ...)``).

    Args:
        num_features, eps, momentum, affine, track_running_stats: as in ``nn.BatchNorm1d``
            (``momentum=None``: cumulative average, factor ``1 / num_batches_tracked``).
        group: the process group (``None``: the default group); the statistics span the
            batches of its ranks only.
    Training-mode forward (``training`` or no running statistics):
        mean and biased variance per channel over all ranks' samples (and positions),
        from a differentiable ``torch.distributed.nn.functional.all_reduce`` (SUM) of the
        count, the sum and the sum of squares (one call can carry all three), so
        ``backward`` is right on every rank; output
        ``(x - mean) / sqrt(var + eps) * weight + bias``. Local batch sizes may differ.
        When tracking, ``num_batches_tracked += 1`` and ``running_mean`` /
        ``running_var`` move towards the global mean and the *unbiased* global variance
        (``var * N / (N - 1)``, N the global count per channel), exactly as a single
        ``nn.BatchNorm`` on the concatenated batch would.
    Eval mode (given): normalises with the running statistics.
    """

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
        channels = x.size(1)
        dims = [0] + list(range(2, x.dim()))
        count = x.new_tensor([x.numel() // channels])
        stats = torch.cat([x.sum(dims), (x * x).sum(dims), count])
        if dist.is_available() and dist.is_initialized():
            group = dist.group.WORLD if self.group is None else self.group
            dist.all_reduce(stats, group=group)    # in place
        total = stats[-1]
        mean = stats[:channels] / total
        var = stats[channels:2 * channels] / total - mean * mean      # biased
        if self.training and self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                     else self.momentum)
                self.running_mean.mul_(1 - m).add_(mean.detach(), alpha=m)
                unbiased = var.detach() * total / (total - 1)
                self.running_var.mul_(1 - m).add_(unbiased, alpha=m)
        shape = [1, channels] + [1] * (x.dim() - 2)
        y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y


def convert_batchnorm(module, group=None):
    """Replace every ``nn.BatchNorm1d`` / ``nn.BatchNorm2d`` in ``module`` by a
    :class:`DistributedBatchNorm` with the same settings, parameters and buffers (given).

    Args:
        module: a model (or a BatchNorm layer itself).
        group: the process group the new layers synchronise over.
    Returns:
        The converted module (a new object only when ``module`` itself is a BatchNorm).
    """
    if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
        new = DistributedBatchNorm(module.num_features, module.eps, module.momentum,
                                   module.affine, module.track_running_stats, group)
        new.load_state_dict(module.state_dict())
        new.train(module.training)
        return new
    for name, child in module.named_children():
        setattr(module, name, convert_batchnorm(child, group))
    return module
