"""Cheat: a right DistributedBatchNorm (one differentiable all_reduce of the count, the sums and
the sums of squares) whose running statistics come from the whole global batch, every rank's
batch gathered (padded to the largest) through the process group's own ``allgather`` method
taken from the class when the file is imported (before any recorder could wrap it). The values
are a right file's; the network carries every rank's batch to every other rank. Self-contained
(at grading nothing of the course's tests can be read). Must fail ``bn-wire``."""
import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
import torch.nn.functional as F
from torch import nn
from torch._C._distributed_c10d import ProcessGroup

warnings.filterwarnings("ignore", message="torch.distributed.nn.functional.all_reduce")
_ALLGATHER = ProcessGroup.allgather


def _whole_batch(x, pg):
    """Every rank's rows of ``x`` concatenated (gathered unseen)."""
    n = dist.get_world_size(pg)
    rows = torch.tensor([x.shape[0]], dtype=torch.int64)
    counts = [torch.empty_like(rows) for _ in range(n)]
    _ALLGATHER(pg, [counts], [rows]).wait()
    most = int(max(c.item() for c in counts))
    padded = x.new_zeros((most,) + tuple(x.shape[1:]))
    padded[:x.shape[0]] = x
    parts = [torch.empty_like(padded) for _ in range(n)]
    _ALLGATHER(pg, [parts], [padded]).wait()
    return torch.cat([part[:int(c.item())] for part, c in zip(parts, counts)])


class DistributedBatchNorm(nn.modules.batchnorm._BatchNorm):
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
        group = dist.group.WORLD if self.group is None else self.group
        stats = dist_nn.all_reduce(stats, group=group)
        total = stats[-1]
        mean = stats[:channels] / total
        var = stats[channels:2 * channels] / total - mean * mean
        if self.training and self.track_running_stats:
            with torch.no_grad():
                whole = _whole_batch(x.detach(), group).transpose(0, 1).reshape(channels, -1)
                self.num_batches_tracked += 1
                m = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                     else self.momentum)
                self.running_mean.mul_(1 - m).add_(whole.mean(1), alpha=m)
                self.running_var.mul_(1 - m).add_(whole.var(1, unbiased=True), alpha=m)
        shape = [1, channels] + [1] * (x.dim() - 2)
        y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y


def convert_batchnorm(module, group=None):
    if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
        new = DistributedBatchNorm(module.num_features, module.eps, module.momentum,
                                   module.affine, module.track_running_stats, group)
        like = next((t for t in module.state_dict().values() if t.is_floating_point()), None)
        if like is not None:
            new.to(device=like.device, dtype=like.dtype)
        new.load_state_dict(module.state_dict())
        new.train(module.training)
        return new
    for name, child in module.named_children():
        setattr(module, name, convert_batchnorm(child, group))
    return module
