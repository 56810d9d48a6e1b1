"""RIGHT (notebook 07, memory): exact rational arithmetic (fractions.Fraction) driven by a
table stage -> set of partitioned parts, converted to float once; partition by
``min(range(world_size), key=(load, rank))`` over a stable largest-first order; one
``dist.broadcast`` per parameter in global order (contiguous scratch copy for transposed
ones); consolidation gathers (global index, state) pairs with ``gather_object``; loading
deep-copies the kept entries.

Written from the release notebook alone; the checker must accept it.
"""
import copy
from fractions import Fraction

import torch
import torch.distributed as dist

PARAM_BYTES = 2     # fp16 parameters (forward and backward run in half precision)
GRAD_BYTES = 2      # fp16 gradients
ADAM_K = 12         # optimizer state per parameter: fp32 master weights, momentum, variance


# ---------------------------------------------------------------- part 1: memory accounting
# which of the three parts (parameters, gradients, optimizer state) each stage partitions
_PARTITIONED = {
    0: frozenset(),
    1: frozenset({"optimizer"}),
    2: frozenset({"optimizer", "gradients"}),
    3: frozenset({"optimizer", "gradients", "parameters"}),
}


def _exact(x):
    """A Fraction for x when it is a real number Fraction understands, else x itself."""
    try:
        return Fraction(x)
    except (TypeError, ValueError, OverflowError):
        return x


def bytes_per_device(num_params, num_devices, stage, k=ADAM_K):
    """Model-state memory per device (bytes) in the ZeRO paper's model (Section 3, Figure 1)."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
    partitioned = _PARTITIONED[int(stage)]
    part_bytes = {"parameters": PARAM_BYTES, "gradients": GRAD_BYTES, "optimizer": k}
    psi = _exact(num_params)
    replicated = sum(_exact(b) for name, b in part_bytes.items() if name not in partitioned)
    sharded = sum(_exact(b) for name, b in part_bytes.items() if name in partitioned)
    total = replicated * psi
    if partitioned:
        total = total + sharded * psi / _exact(num_devices)
    return float(total)


# ---------------------------------------------------------------- part 2: the sharded optimizer
def partition_parameters(numels, world_size, loads=None):
    """Greedy largest-first assignment to the least-loaded rank (ties: lower index, lower rank)."""
    sizes = [int(n) for n in numels]
    per_rank = [0] * world_size if loads is None else list(loads)   # a copy: loads untouched
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    owner = [0] * len(sizes)
    for i in order:
        r = min(range(world_size), key=lambda q: (per_rank[q], q))
        owner[i] = r
        per_rank[r] = per_rank[r] + sizes[i]
    return owner


def _hyperparameters(group):
    """A parameter group's settings without its parameters (a new dict)."""
    return {k: v for k, v in group.items() if k != "params"}


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1: each rank keeps the optimizer state of its own shard of the parameters only."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls, self.owners, self.optim = optimizer_cls, {}, None
        self._consolidated = None
        self.optim = optimizer_cls([{"params": []}], **kwargs)
        del self.optim.param_groups[:]
        super().__init__(params, self.optim.defaults)

    def _rank_loads(self):
        loads = [0] * self.world_size
        for group in self.param_groups:
            for p in group["params"]:
                loads[self.owners[id(p)]] += p.numel()
        return loads

    def add_param_group(self, group):
        if not isinstance(group, dict):
            raise TypeError(f"param group must be a dict, got {type(group).__name__}")
        params = group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        for p in params:
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, got {type(p).__name__}")
        if any(id(p) in self.owners for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        owners = partition_parameters([p.numel() for p in params], self.world_size,
                                      self._rank_loads())
        for p, r in zip(params, owners):
            self.owners[id(p)] = r
        local = _hyperparameters(group)
        local["params"] = [p for p, r in zip(params, owners) if r == self.rank]
        self.optim.add_param_group(local)
        full = _hyperparameters(self.optim.param_groups[-1])
        full["params"] = params
        self.param_groups.append(full)

    def _sync_hyperparameters(self):
        """Copy the hyper-parameters of ``self.param_groups`` to the local optimizer's groups."""
        for full, local in zip(self.param_groups, self.optim.param_groups):
            local.update(_hyperparameters(full))

    @torch.no_grad()
    def step(self, closure=None):
        self._sync_hyperparameters()
        result = self.optim.step() if closure is None else self.optim.step(closure)
        # one broadcast per parameter, in the global order: the same calls on every rank
        for group in self.param_groups:
            for p in group["params"]:
                src = self.owners[id(p)]
                data = p.detach()
                if data.is_contiguous():
                    dist.broadcast(data, src=src)
                else:
                    scratch = data.contiguous()
                    dist.broadcast(scratch, src=src)
                    if self.rank != src:
                        data.copy_(scratch)
        return result

    def zero_grad(self, set_to_none=True):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    def _global_indices(self):
        out, index = [], 0
        for group in self.param_groups:
            out.append([])
            for p in group["params"]:
                if self.owners[id(p)] == self.rank:
                    out[-1].append(index)
                index += 1
        return out

    def consolidate_state_dict(self, to=0):
        local = self.optim.state_dict()
        local_ids = [i for g in local["param_groups"] for i in g["params"]]
        global_ids = [i for ids in self._global_indices() for i in ids]
        to_global = dict(zip(local_ids, global_ids))
        pairs = [(to_global[i], s) for i, s in local["state"].items()]
        received = [None] * self.world_size if self.rank == to else None
        dist.gather_object(pairs, received, dst=to)
        self._consolidated = None
        if self.rank != to:
            return
        state = {}
        for part in received:
            for index, entry in part:
                state[index] = entry
        groups, start = [], 0
        for group in self.param_groups:
            packed = copy.deepcopy(_hyperparameters(group))
            packed["params"] = list(range(start, start + len(group["params"])))
            start += len(group["params"])
            groups.append(packed)
        self._consolidated = {"state": dict(sorted(state.items())), "param_groups": groups}

    def state_dict(self):
        if self._consolidated is None:
            raise RuntimeError("no consolidated state on this rank: call "
                               "consolidate_state_dict(to=this rank) on every rank first")
        return self._consolidated

    def load_state_dict(self, state_dict):
        saved_groups = state_dict["param_groups"]
        saved_state = state_dict["state"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        local_state, local_groups, nxt = {}, [], 0
        for full, saved in zip(self.param_groups, saved_groups):
            if len(saved["params"]) != len(full["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't "
                                 "match the size of optimizer's group")
            kept = []
            for p, index in zip(full["params"], saved["params"]):
                if self.owners[id(p)] != self.rank:
                    continue
                if index in saved_state:
                    local_state[nxt] = copy.deepcopy(saved_state[index])
                kept.append(nxt)
                nxt += 1
            group = copy.deepcopy(_hyperparameters(saved))
            group["params"] = kept
            local_groups.append(group)
        self.optim.load_state_dict({"state": local_state, "param_groups": local_groups})
        for full, saved in zip(self.param_groups, saved_groups):
            full.update(copy.deepcopy(_hyperparameters(saved)))
