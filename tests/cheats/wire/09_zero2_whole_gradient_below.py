"""Cheat: a correct ZeRO-2 whose ``step`` first all-reduces the whole flat gradient through
``ProcessGroup.allreduce`` taken from the class when the file is imported (before any
recorder), as a ZeRO-2 that averages with an all-reduce and keeps its part would: the recorded
calls (one reduce-scatter, one all-gather), the values and the memory are ZeRO-2's, the network
carries an all-reduce of the whole gradient more per step. Self-contained (at grading nothing
of the course's tests can be read). Must fail ``zero2-wire``."""
import math

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._C._distributed_c10d import ProcessGroup

_ALLREDUCE = ProcessGroup.allreduce


def shard_flat(tensors, world_size, rank):
    numel = sum(t.numel() for t in tensors)
    per = math.ceil(numel / world_size)
    flat = torch.zeros(per * world_size, dtype=tensors[0].dtype)
    if numel:
        flat[:numel] = torch.cat([t.detach().reshape(-1) for t in tensors])
    return flat[rank * per:(rank + 1) * per].clone(), numel


class Zero2:
    def __init__(self, params, optimizer_cls, **defaults):
        self.params = [p for p in params if p.requires_grad]
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        shard, self.numel = shard_flat(self.params, self.world, self.rank)
        self.shard = nn.Parameter(shard)
        self.optim = optimizer_cls([self.shard], **defaults)

    def step(self):
        per = self.shard.numel()
        flat = torch.zeros(per * self.world, dtype=self.shard.dtype)
        offset = 0
        for p in self.params:
            if p.grad is not None:
                flat[offset:offset + p.numel()] = p.grad.reshape(-1)
            offset += p.numel()
            p.grad = None
        _ALLREDUCE(dist.group.WORLD, [flat.clone()]).wait()                   # unseen
        mine = torch.empty(per, dtype=flat.dtype)
        dist.reduce_scatter_tensor(mine, flat)
        del flat
        self.shard.grad = mine.div_(self.world)
        self.optim.step()
        full = torch.empty(per * self.world, dtype=self.shard.dtype)
        dist.all_gather_into_tensor(full, self.shard.detach())
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(full[offset:offset + p.numel()].view(p.shape))
                offset += p.numel()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
        self.shard.grad = None
