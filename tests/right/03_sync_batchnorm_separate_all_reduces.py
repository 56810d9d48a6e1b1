"""RIGHT (notebook 03, sync_batchnorm): three differentiable all_reduces (count, per-channel
sum, per-channel sum of squares) instead of one concatenated tensor; the statistics are
computed over the channel-last view ``x.transpose(0, 1).reshape(C, -1)``; the running
statistics move with ``Tensor.lerp_``; the group is passed as given (``None`` is the default
group for ``torch.distributed.nn.functional.all_reduce`` too).

Written differently from the solution on purpose; the checker must accept it.
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
        c = x.size(1)
        flat = x.transpose(0, 1).reshape(c, -1)                 # (C, samples * positions)
        count = flat.new_full((1,), float(flat.size(1)))
        total_sum, total_sq = flat.sum(1), (flat * flat).sum(1)
        if dist.is_initialized():
            count = dist_nn.all_reduce(count, group=self.group)
            total_sum = dist_nn.all_reduce(total_sum, group=self.group)
            total_sq = dist_nn.all_reduce(total_sq, group=self.group)
        mean = total_sum / count
        var = total_sq / count - mean ** 2
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / self.num_batches_tracked.item() if self.momentum is None
                      else self.momentum)
            with torch.no_grad():
                self.running_mean.lerp_(mean, factor)
                self.running_var.lerp_(var * count / (count - 1), factor)
        view = (1, c) + (1,) * (x.dim() - 2)
        y = (x - mean.reshape(view)) / torch.sqrt(var.reshape(view) + self.eps)
        if self.weight is not None:
            y = torch.addcmul(self.bias.reshape(view), y, self.weight.reshape(view))
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
