"""RIGHT (notebook 06, naive): one all_reduce per parameter from last to first, each gradient as reshape(-1) (view reduced in place, or a copy written back), torch.div(out=) averaging, ties deduplicated by id).

Written from the release notebook alone; the checker must accept it.
"""
import contextlib
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.utils.data import DataLoader, DistributedSampler


def _first_env(names, default):
    """The integer value of the first of the environment variables ``names`` that is set."""
    for name in names:
        if os.environ.get(name, "") != "":
            return int(os.environ[name])
    return default


def _world():
    """(rank, world size) of the default group, (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


# ---------------------------------------------------------------- stage 1: Horovod-style API
def init(timeout_s=60, backend=None):
    """Join the job started by ``torchrun`` or ``mpiexec``; return ``(rank, world_size, device)``."""
    rank = _first_env(("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK"), 0)
    world_size = _first_env(("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"), 1)
    local_rank = _first_env(("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK"), 0)
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device(f"cuda:{local_rank}")
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group(backend=backend, init_method="env://", rank=rank,
                                world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size(), device


def partition_dataset(dataset, batch_size, seed=0):
    """This rank's share of ``dataset``: ``(loader, per_rank_batch)``."""
    rank, world_size = _world()
    if batch_size % world_size != 0 or batch_size <= 0:
        raise ValueError(f"batch_size {batch_size} is not divisible by the world size {world_size}")
    per_rank = batch_size // world_size
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=per_rank, sampler=sampler, drop_last=True)
    return loader, per_rank


def broadcast_parameters(model, root=0):
    """Copy rank ``root``'s parameters AND buffers into every rank's ``model``, in place."""
    seen = set()
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if id(t) in seen:
                continue
            seen.add(id(t))
            if t.is_contiguous():
                dist.broadcast(t.data, src=root)
            else:
                tmp = t.detach().contiguous()
                dist.broadcast(tmp, src=root)
                t.copy_(tmp)


def _reduce_function(strategy):
    """The gradient-averaging function of a strategy: "naive", "flat" or a function."""
    if callable(strategy):
        return strategy
    return {"naive": allreduce_naive, "flat": allreduce_flat}[strategy]


class DistributedOptimizer:
    """Wraps a local optimizer: ``step()`` first averages the gradients over the ranks."""

    def __init__(self, optimizer, model, strategy="naive"):
        self.optimizer = optimizer
        self.params = list(model.parameters())
        self.reduce = _reduce_function(strategy)

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.reduce(self.params)
        result = self.optimizer.step()
        return loss if closure is not None else result

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)


# ---------------------------------------------------------------- stages 2 and 3
def allreduce_naive(params):
    """Average every gradient over the ranks: ONE ``dist.all_reduce`` PER PARAMETER.

    Variant: walks the parameters from the last to the first (the order backward produced
    them), each tied tensor once; every gradient travels as a 1-d ``reshape(-1)``: a view of
    ``p.grad`` when its storage allows (reduced in place), else a contiguous copy written
    back with ``copy_`` (a transposed gradient keeps its own storage and strides).
    """
    world_size = dist.get_world_size()
    done = set()
    for p in reversed(list(params)):
        g = p.grad
        if g is None or id(p) in done:
            continue
        done.add(id(p))
        line = g.reshape(-1)
        shares = line.numel() == 0 or line.data_ptr() == g.data_ptr() and g.is_contiguous()
        dist.all_reduce(line, op=dist.ReduceOp.SUM)
        torch.div(line, world_size, out=line)
        if not shares:
            g.copy_(line.view(g.shape))


def allreduce_flat(params):
    """Average every gradient over the ranks with ONE ``dist.all_reduce`` of ONE flat buffer."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    buf = _flatten_dense_tensors(grads)
    dist.all_reduce(buf)
    buf.div_(dist.get_world_size())
    for g, piece in zip(grads, _unflatten_dense_tensors(buf, grads)):
        g.copy_(piece)


# ---------------------------------------------------------------- stage 4: overlap
class OverlapDDP(nn.Module):
    """Data parallelism that communicates DURING backward, one parameter at a time."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        broadcast_parameters(module)
        self._pending = []
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def _on_grad_ready(self, param):
        g = param.grad
        buf = g if g.is_contiguous() else g.contiguous()
        self._pending.append((g, buf, dist.all_reduce(buf, async_op=True)))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        world_size = dist.get_world_size()
        pending, self._pending = self._pending, []
        for g, buf, work in pending:
            work.wait()
            buf.div_(world_size)
            if buf is not g:
                g.copy_(buf)


# ---------------------------------------------------------------- stage 5: buckets
class BucketDDP(nn.Module):
    """Overlapped data parallelism with gradient buckets, as ``DistributedDataParallel`` does."""

    def __init__(self, module, bucket_cap_mb=25):
        super().__init__()
        self.module = module
        broadcast_parameters(module)
        cap = bucket_cap_mb * 1024 * 1024
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.buckets, size = [], 0
        for name, p in reversed(named):
            nbytes = p.numel() * p.element_size()
            if self.buckets and size + nbytes <= cap:
                self.buckets[-1].append(name)
                size += nbytes
            else:
                self.buckets.append([name])
                size = nbytes
        self._params = dict(named)
        self._bucket_of = {}
        for i, names in enumerate(self.buckets):
            for n in names:
                self._bucket_of[id(self._params[n])] = i
        self._ready = [0] * len(self.buckets)
        self._arrived = set()
        self._works = {}
        self._sync_depth = 0
        for name, p in named:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def _on_grad_ready(self, param):
        if self._sync_depth > 0:
            return
        i = self._bucket_of[id(param)]
        if id(param) in self._arrived:
            return
        self._arrived.add(id(param))
        self._ready[i] += 1
        if self._ready[i] == len(self.buckets[i]):
            grads = [self._params[n].grad for n in self.buckets[i]]
            buf = _flatten_dense_tensors(grads)
            self._works[i] = (buf, dist.all_reduce(buf, async_op=True))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        if not self._arrived:
            return
        world_size = dist.get_world_size()
        works, self._works = self._works, {}
        arrived, self._arrived = self._arrived, set()
        self._ready = [0] * len(self.buckets)
        for i in sorted(works):
            buf, work = works[i]
            work.wait()
            buf.div_(world_size)
            grads = [self._params[n].grad for n in self.buckets[i]]
            for g, piece in zip(grads, _unflatten_dense_tensors(buf, grads)):
                g.copy_(piece)
        missing = [n for n, p in self._params.items() if id(p) not in arrived]
        if missing:
            raise RuntimeError("these trainable parameters got no gradient in this backward "
                               f"(freeze them or use them in every step): {', '.join(missing)}")

    @contextlib.contextmanager
    def no_sync(self):
        self._sync_depth += 1
        try:
            yield
        finally:
            self._sync_depth -= 1
