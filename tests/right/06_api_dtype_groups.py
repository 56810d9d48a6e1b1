"""RIGHT (notebook 06, api): init reads a table of launcher variables; partition_dataset builds its own batch sampler from one numpy permutation cut into step rows (rank r takes row[r::W]) instead of DistributedSampler; broadcast_parameters sends one flat buffer per dtype (int64 counter in its own int64 buffer)).

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
_LAUNCHERS = (  # (rank, world size, local rank) variables of torchrun, MPICH, Open MPI
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
)


def init(timeout_s=60, backend=None):
    """Join the job started by ``torchrun`` or ``mpiexec``; return ``(rank, world_size, device)``."""
    ranks, sizes, locals_ = zip(*_LAUNCHERS)
    rank = _first_env(ranks, 0)
    world_size = _first_env(sizes, 1)
    local_rank = _first_env(locals_, 0)
    chosen = backend if backend is not None else (
        "nccl" if torch.cuda.is_available() else "gloo")
    if str(chosen).lower() == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), device
    addr = os.environ.get("MASTER_ADDR") or "127.0.0.1"
    port = os.environ.get("MASTER_PORT") or "29500"
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, port
    dist.init_process_group(chosen, init_method="env://", world_size=world_size, rank=rank,
                            timeout=datetime.timedelta(seconds=float(timeout_s)))
    return rank, world_size, device


class _StepBatches:
    """Batch sampler: this rank's index lists, step by step, of one seeded permutation."""

    def __init__(self, n, batch_size, rank, world_size, seed):
        import numpy as np
        order = np.random.default_rng(int(seed) % (1 << 64)).permutation(n)
        steps = n // batch_size
        # one row per step, the batch_size positions of that step; rank r takes r, r+W, ...
        table = order[:steps * batch_size].reshape(steps, batch_size)
        self._batches = [[int(i) for i in row[rank::world_size]] for row in table]

    def __len__(self):
        return len(self._batches)

    def __iter__(self):
        return iter([list(b) for b in self._batches])


def partition_dataset(dataset, batch_size, seed=0):
    """This rank's share of ``dataset``: ``(loader, per_rank_batch)``."""
    rank, world_size = _world()
    if batch_size <= 0 or batch_size % world_size:
        raise ValueError(f"global batch {batch_size} cannot be split over {world_size} ranks")
    sampler = _StepBatches(len(dataset), batch_size, rank, world_size, seed)
    return DataLoader(dataset, batch_sampler=sampler), batch_size // world_size


def broadcast_parameters(model, root=0):
    """Copy rank ``root``'s parameters AND buffers into every rank's ``model``, in place.

    One broadcast per dtype (and device): every tensor of that dtype is packed into a flat
    buffer OF THAT DTYPE (the int64 BatchNorm counter travels in an int64 buffer).
    """
    tensors = {}
    for t in list(model.parameters()) + list(model.buffers()):
        tensors.setdefault(id(t), t)
    groups = {}
    for t in tensors.values():
        groups.setdefault((t.dtype, t.device), []).append(t)
    with torch.no_grad():
        for (dtype, device), group in groups.items():
            flat = torch.cat([t.detach().reshape(-1) for t in group])
            dist.broadcast(flat, src=root)
            offset = 0
            for t in group:
                n = t.numel()
                t.copy_(flat[offset:offset + n].view(t.shape))
                offset += n


def _reduce_function(strategy):
    """The gradient-averaging function of a strategy: "naive", "flat" or a function."""
    if callable(strategy):
        return strategy
    return {"naive": allreduce_naive, "flat": allreduce_flat}[strategy]


class DistributedOptimizer:
    """Wraps a local optimizer: ``step()`` first averages the gradients over the ranks."""

    def __init__(self, optimizer, model, strategy="naive"):
        self._opt = optimizer
        self._model_params = [p for p in model.parameters()]
        self._strategy = _reduce_function(strategy)

    def step(self, closure=None):
        if closure is None:
            self._strategy(self._model_params)
            return self._opt.step()
        with torch.enable_grad():
            loss = closure()
        self._strategy(self._model_params)
        self._opt.step()
        return loss

    def zero_grad(self, set_to_none=True):
        return self._opt.zero_grad(set_to_none=set_to_none)


# ---------------------------------------------------------------- stages 2 and 3
def allreduce_naive(params):
    """Average every gradient over the ranks: ONE ``dist.all_reduce`` PER PARAMETER."""
    world_size = dist.get_world_size()
    for p in params:
        if p.grad is None:
            continue
        g = p.grad
        if g.is_contiguous():
            dist.all_reduce(g)
            g.div_(world_size)
        else:
            buf = g.contiguous()
            dist.all_reduce(buf)
            g.copy_(buf.div_(world_size))


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
