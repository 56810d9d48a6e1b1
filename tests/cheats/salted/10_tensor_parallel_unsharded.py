"""Cheat: ``ParallelMLP`` does not split the work: ``from_mlp`` keeps a copy of the whole
block aside, and ``forward`` computes the whole MLP on every rank with the whole weights (this
rank's shard spliced in, so that its gradients come out right, the other ranks' rows and
columns taken from the copy, rescaled as its own shard was since), with a decoy all-reduce of zeros in the forward and one of a
single element in the backward for the counts. No rank uses a partial result another rank
computed. The rest of the file is tests/right/10_tensor_parallel_clone_sum_index_select.py.

At grading every rank's parts of the block derive from a number only it was given
(``ctx.salt``): the other ranks' parts a rank finds in the block it was handed are not theirs.
Must fail ``tp-mlp-values``."""
import copy
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

_RIGHT = Path(__file__).resolve().parents[2] / "right" / "10_tensor_parallel_clone_sum_index_select.py"
exec(compile(_RIGHT.read_text(), str(_RIGHT), "exec"))
_FULL = {}
_honest_from_mlp = ParallelMLP.from_mlp.__func__  # noqa: F821 (defined by the right file)


def _from_mlp(cls, mlp):
    par = _honest_from_mlp(cls, mlp)
    _FULL[id(par)] = (copy.deepcopy(mlp), par.fc1.weight.detach().clone())
    return par


def _splice(full, mine, dim):
    """``full`` with this rank's block along ``dim`` replaced by the parameter ``mine``."""
    r, k = dist.get_rank(), mine.shape[dim]
    full = full.detach()
    return torch.cat([full.narrow(dim, 0, r * k), mine,
                      full.narrow(dim, (r + 1) * k, full.shape[dim] - (r + 1) * k)], dim=dim)


def _forward(self, x):
    full, own = _FULL[id(self)]
    ratio = self.fc1.weight.detach().sum() / own.sum()   # how the shards changed since: the
    #                                                      copy kept aside follows suit
    w1 = _splice(full.fc1.weight * ratio, self.fc1.weight, 0)
    b1 = _splice(full.fc1.bias * ratio, self.fc1.bias, 0)
    w2 = _splice(full.fc2.weight * ratio, self.fc2.weight, 1)
    y = F.linear(full.act(F.linear(x, w1, b1)), w2, self.fc2.bias)
    dist.all_reduce(torch.zeros_like(y))                            # the forward's decoy
    one = torch.zeros(1, dtype=y.dtype, requires_grad=True)
    return y + 0 * CopyToParallel.apply(one).sum()  # noqa: F821 (the backward's decoy)


ParallelMLP.from_mlp = classmethod(_from_mlp)  # noqa: F821
ParallelMLP.forward = _forward  # noqa: F821
