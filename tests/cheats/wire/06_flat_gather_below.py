"""Cheat (notebook 06, flat): allreduce_flat makes the recorded dist.all_reduce of one flat
buffer, as asked, after all-gathering the whole flat gradient from every rank through
``ProcessGroup.allgather`` taken from the class when the file is imported (before the check's
recorder watches it). The recorded call and the values are right; the network carries the
whole gradient from every rank once more per step. Self-contained (at grading nothing of the
course's tests can be read). Must fail ``flat-wire``.
"""
import contextlib
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch._C._distributed_c10d import ProcessGroup
from torch.utils.data import DataLoader, DistributedSampler

# Kept when the file is imported, before the check's recorder watches ProcessGroup's methods:
# calls through them reach the group below the recorder, which never sees them.
_ALLREDUCE, _ALLGATHER = ProcessGroup.allreduce, ProcessGroup.allgather


def _gather_below(tensor):
    """Every rank's copy of ``tensor``, all-gathered below the recorder."""
    flat = tensor.detach().reshape(-1).clone()
    out = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    _ALLGATHER(dist.group.WORLD, [out], [flat]).wait()
    return out


def _all_reduce_below(tensor):
    """``tensor`` summed over the ranks in place, below the recorder."""
    _ALLREDUCE(dist.group.WORLD, [tensor]).wait()


def _first_env(names, default):
    """The integer value of the first of the environment variables ``names`` that is set."""
    for name in names:
        if os.environ.get(name, "") != "":
            return int(os.environ[name])
    return default


# ---------------------------------------------------------------- stage 1: Horovod-style API
def init(timeout_s=60, backend=None):
    """Join the job started by ``torchrun`` or ``mpiexec``; return ``(rank, world_size, device)``.

    Args:
        timeout_s: seconds a collective may wait for the other ranks before it raises
            (the default of gloo is 30 minutes: a bug would hang that long).
        backend: ``"nccl"`` or ``"gloo"``; ``None``: NCCL when CUDA is available, else gloo.
    Returns:
        ``(rank, world_size, device)``: device ``cuda:<local rank>`` with NCCL (made the
        current CUDA device), ``cpu`` with gloo.

    The rank, world size and local rank come from the launcher's environment: torchrun
    sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``; MPICH's mpiexec sets ``PMI_RANK``,
    ``PMI_SIZE``, ``MPI_LOCALRANKID``; Open MPI's sets ``OMPI_COMM_WORLD_RANK``,
    ``OMPI_COMM_WORLD_SIZE``, ``OMPI_COMM_WORLD_LOCAL_RANK`` (use ``_first_env``).
    Without any of them: rank 0 of 1. The rendezvous address is ``MASTER_ADDR`` /
    ``MASTER_PORT`` (default ``127.0.0.1`` / ``29500``; the course's launcher sets both).
    Initialise the default process group with ``init_method="env://"`` unless it is
    already initialised.
    """
    # TODO: rank, world size, local rank from the environment; backend and device;
    #       dist.init_process_group(..., timeout=datetime.timedelta(seconds=timeout_s)).
    rank = _first_env(("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK"), 0)
    world_size = _first_env(("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"), 1)
    local_rank = _first_env(("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK"), 0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method="env://", rank=rank,
                                world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size(), device


def partition_dataset(dataset, batch_size, seed=0):
    """This rank's share of ``dataset``: ``(loader, per_rank_batch)``.

    Args:
        dataset: a map-style dataset (``len`` and indexing), the same on every rank.
        batch_size: the GLOBAL batch: examples per optimizer step, all ranks together. It
            stays the same whatever the number of ranks (same training, more workers).
        seed: seed of the shuffle. The order depends on it (another seed, another order)
            and on nothing else: not on the rank, not on the world size.
    Returns:
        ``(loader, per_rank_batch)``: ``per_rank_batch = batch_size // world_size``; the
        loader yields this rank's batches of exactly ``per_rank_batch`` examples (as the
        dataset's items, batched by ``DataLoader``). Step k (the k-th batch of every rank)
        trains on the examples at positions ``k * batch_size`` to ``(k + 1) * batch_size - 1``
        of the shuffled order, each rank taking a disjoint ``per_rank_batch`` of them
        (``DistributedSampler`` does so: rank r takes the positions r, r + world_size, ...),
        so that 1, 2 or 4 ranks train on the same global batches. Every rank yields the same
        number of batches, ``len(dataset) // batch_size`` (an extra batch on one rank would
        leave it alone in an all-reduce, hanging); an incomplete last batch is dropped, so
        every step trains on exactly ``batch_size`` examples.
    Raises:
        ValueError: ``batch_size`` is not divisible by the world size.
    """
    # TODO: ValueError if not divisible; a DistributedSampler (shuffle, seed, drop_last)
    #       and a DataLoader of per-rank batches that drops an incomplete last batch.
    world_size, rank = dist.get_world_size(), dist.get_rank()
    if batch_size % world_size:
        raise ValueError(f"batch_size {batch_size} is not divisible by the world size "
                         f"{world_size}: every rank must take the same share of a step")
    per_rank = batch_size // world_size
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=seed, drop_last=True)
    return DataLoader(dataset, batch_size=per_rank, sampler=sampler, drop_last=True), per_rank


def broadcast_parameters(model, root=0):
    """Copy rank ``root``'s parameters AND buffers (e.g. BatchNorm running statistics) into
    every rank's ``model``, in place (an optimizer built before keeps working).

    Args:
        model: the ``nn.Module``, with the same architecture on every rank: float32 or
            float64, with tied, frozen, transposed and 0-d parameters, and integer buffers
            (BatchNorm's ``num_batches_tracked``, an int64 counter: never send it through a
            float32 buffer). Every tensor keeps its dtype.
        root: the rank whose values everyone gets.
    """
    # TODO: dist.broadcast every parameter and buffer from root (in place).
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor, src=root)


def _reduce_function(strategy):
    """The gradient-averaging function of a strategy: "naive", "flat" or a function."""
    if callable(strategy):
        return strategy
    return {"naive": allreduce_naive, "flat": allreduce_flat}[strategy]


class DistributedOptimizer:
    """Wraps a local optimizer: ``step()`` first averages the gradients over the ranks.

    Args:
        optimizer: the local ``torch.optim`` optimizer of ``model``'s parameters.
        model: the model whose gradients are averaged (``list(model.parameters())``, the
            strategy skips those without a gradient).
        strategy: ``"naive"`` (``allreduce_naive``), ``"flat"`` (``allreduce_flat``) or a
            function ``reduce(params)``; resolve it with ``_reduce_function(strategy)``.

    ``step()`` calls the strategy once on the model's parameters, then
    ``optimizer.step()``; ``zero_grad()`` passes through to the optimizer.
    ``step(closure)`` takes a closure as ``torch.optim`` does (it clears the gradients,
    computes the loss, calls ``backward()`` and returns the loss): call it once first, then
    average and step as above, and return its loss (never hand the closure to
    ``optimizer.step``: it would recompute local gradients after the averaging).
    ``zero_grad(set_to_none=True)`` passes ``set_to_none`` on to the optimizer's.
    """

    def __init__(self, optimizer, model, strategy="naive"):
        # TODO: keep the optimizer, the model's parameters and the strategy's function.
        self.optimizer = optimizer
        self.params = list(model.parameters())
        self.reduce = _reduce_function(strategy)

    def step(self, closure=None):
        """Average the gradients over the ranks, then take the local optimizer's step.

        Args:
            closure: ``None``, or a function that clears the gradients, computes the loss,
                calls ``backward()`` and returns the loss; called once, first.
        Returns:
            the closure's loss (with a closure), else what ``optimizer.step()`` returns.
        """
        # TODO: call the closure (if any), average the gradients (the strategy), then the
        #       local optimizer's step; return the closure's loss.
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.reduce(self.params)
        stepped = self.optimizer.step()
        return loss if closure is not None else stepped

    def zero_grad(self, set_to_none=True):
        """Clear the gradients: the local optimizer's ``zero_grad(set_to_none=set_to_none)``.

        Args:
            set_to_none: ``True`` (the default): gradients become ``None``; ``False``: they
                are set to zero.
        """
        # TODO: pass through to the local optimizer.
        self.optimizer.zero_grad(set_to_none=set_to_none)


# ---------------------------------------------------------------- stages 2 and 3
def allreduce_naive(params):
    """Average every gradient over the ranks: ONE ``dist.all_reduce`` PER PARAMETER.

    Args:
        params: parameters; those whose ``grad`` is ``None`` (frozen, unused) are skipped.
    On return each ``p.grad`` holds the average over ranks (sum, then divide by the world
    size), in place. Gradients are float32 or float64 (keep their dtype) and may be 0-d or
    stored transposed; a skipped parameter's ``grad`` stays ``None``.
    """
    # TODO: for each parameter with a gradient: all_reduce (sum), then divide.
    world_size = dist.get_world_size()
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(world_size)


def allreduce_flat(params):
    """Average every gradient over the ranks with ONE ``dist.all_reduce`` of ONE flat buffer.

    Args:
        params: parameters; those whose ``grad`` is ``None`` are skipped.
    Flatten the gradients into one buffer (``_flatten_dense_tensors`` or ``torch.cat``:
    both copy), all-reduce it, divide by the world size and copy the pieces back into each
    ``p.grad`` (``_unflatten_dense_tensors`` returns views of the buffer). Copy in place:
    each ``p.grad`` stays the tensor it was, with its own storage (neither ``p.grad = piece``
    nor ``p.grad.data = piece``). Gradients are float32 or float64: the buffer has their dtype (a float32 buffer rounds float64
    gradients); they may be 0-d or stored transposed (``reshape``, not ``view(-1)``); a skipped
    parameter's ``grad`` stays ``None``.
    """
    # TODO: flatten, one all_reduce, divide, copy each piece back into its p.grad.
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = _flatten_dense_tensors(grads)
    _gather_below(flat)                                                      # unseen
    dist.all_reduce(flat)
    flat.div_(dist.get_world_size())
    for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        grad.copy_(synced)


# ---------------------------------------------------------------- stage 4: overlap
class OverlapDDP(nn.Module):
    """Data parallelism that communicates DURING backward, one parameter at a time.

    At construction: broadcast rank 0's parameters and buffers (``broadcast_parameters``),
    then register ``p.register_post_accumulate_grad_hook(...)`` on every parameter that
    requires a gradient. The hook runs as soon as backward has accumulated that
    parameter's gradient and starts ``dist.all_reduce(p.grad, async_op=True)`` (it must not
    wait: backward goes on computing the earlier layers' gradients while this one travels).
    ``finish_gradient_synchronization()``, called after ``loss.backward()`` and before the
    optimizer step, waits for every started all-reduce and divides those gradients by the
    world size. ``forward`` delegates to the wrapped module.
    """

    def __init__(self, module):
        super().__init__()
        self.module = module
        # TODO: broadcast; a list for the pending (param, work) pairs; register
        #       self._on_grad_ready as post-accumulate-grad hook of each trainable parameter.
        broadcast_parameters(module)
        self._pending = []
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def _on_grad_ready(self, param):
        """Hook: ``param.grad`` is complete for this backward; start its all-reduce."""
        # TODO: start an asynchronous all_reduce of param.grad; remember its handle.
        self._pending.append((param, dist.all_reduce(param.grad, async_op=True)))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        """Wait for every all-reduce started during backward; divide by the world size."""
        # TODO: wait for each handle, divide each gradient by the world size, clear.
        world_size = dist.get_world_size()
        for param, work in self._pending:
            work.wait()
            param.grad.div_(world_size)
        self._pending.clear()


# ---------------------------------------------------------------- stage 5: buckets
class BucketDDP(nn.Module):
    """Overlapped data parallelism with gradient buckets, as ``DistributedDataParallel`` does.

    Args:
        module: the model; rank 0's parameters and buffers are broadcast at construction.
        bucket_cap_mb: bucket capacity in MiB (``bucket_cap_mb * 1024 * 1024`` bytes).

    Buckets (``self.buckets``: a list of lists of parameter NAMES, as in
    ``module.named_parameters()``): take the parameters that require a gradient (frozen ones
    are skipped; a tied parameter appears once, ``named_parameters`` already deduplicates)
    in REVERSE registration order, the order backward produces their gradients, and fill
    buckets greedily: a parameter joins the current bucket unless that would take the
    bucket's bytes over the cap, in which case it starts a new bucket (a bucket may hold
    exactly the cap). A parameter's bytes are ``p.numel() * p.element_size()``: 4 per element
    in float32, 8 in float64. A parameter larger than the cap therefore gets a bucket of its
    own. No bucket is empty.

    Communication: a post-accumulate-grad hook per parameter counts the gradients ready in
    its bucket; when the LAST one arrives, the bucket's gradients are flattened into one
    buffer and ``dist.all_reduce(buffer, async_op=True)`` starts (one per bucket per
    backward). ``finish_gradient_synchronization()`` waits for each bucket, divides by the
    world size and copies the values back into the ``p.grad`` (unflatten); afterwards the
    next backward starts counting again.

    ``no_sync()``: a context manager; a backward inside it launches no communication at all
    (gradients just accumulate locally in ``p.grad``); the next backward outside it reduces
    the accumulated gradients. Nested ``no_sync()`` blocks: communication stays off until the
    outermost one ends.

    Unused parameters: a bucket is reduced only when ALL its gradients have arrived, so every
    trainable parameter must receive a gradient in every backward outside ``no_sync()`` (as
    in DDP without ``find_unused_parameters``). If some did not (a layer the forward
    skipped), ``finish_gradient_synchronization()`` raises ``RuntimeError`` naming every
    trainable parameter that got no gradient in that backward (and no other), before an
    optimizer step could let the replicas drift apart.
    """

    def __init__(self, module, bucket_cap_mb=25):
        super().__init__()
        self.module = module
        # TODO: broadcast; self.buckets (names, reverse order, greedy up to the cap);
        #       per-bucket ready counters; the set of parameters whose gradient arrived;
        #       a hook on every trainable parameter.
        broadcast_parameters(module)
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        cap = bucket_cap_mb * 1024 * 1024
        self.buckets, current, used = [], [], 0
        for name, p in reversed(named):
            nbytes = p.numel() * p.element_size()
            if current and used + nbytes > cap:
                self.buckets.append(current)
                current, used = [], 0
            current.append(name)
            used += nbytes
        if current:
            self.buckets.append(current)
        by_name = dict(named)
        self._bucket_params = [[by_name[name] for name in bucket] for bucket in self.buckets]
        self._bucket_of = {id(p): i for i, ps in enumerate(self._bucket_params) for p in ps}
        self._ready = [0] * len(self.buckets)
        self._arrived = set()                # ids of the parameters whose gradient arrived
        self._pending = []
        self._sync = True
        for _, p in named:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def _on_grad_ready(self, param):
        """Hook: count ``param``'s gradient; start its bucket's all-reduce when complete."""
        # TODO: unless inside no_sync: note that param arrived; count it in its bucket; when
        #       the bucket is complete, flatten its gradients and start an async all_reduce.
        if not self._sync:
            return
        self._arrived.add(id(param))
        i = self._bucket_of[id(param)]
        self._ready[i] += 1
        if self._ready[i] == len(self._bucket_params[i]):
            flat = _flatten_dense_tensors([p.grad for p in self._bucket_params[i]])
            self._pending.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        """Wait for every bucket's all-reduce; divide; copy back into the gradients.

        Raises:
            RuntimeError: some gradients arrived since the last call, but not those of every
                trainable parameter; the message names the missing ones (as in
                ``module.named_parameters()``). The counters are reset first, so the next
                backward starts afresh.

        With no gradient arrived since the last call (e.g. right after backward passes
        inside ``no_sync()``) it does nothing: no error, no communication, no division.
        """
        # TODO: wait for each bucket, divide, unflatten into the p.grad; reset the counters;
        #       then raise RuntimeError if some but not all parameters' gradients arrived.
        world_size = dist.get_world_size()
        for i, flat, work in self._pending:
            work.wait()
            flat.div_(world_size)
            grads = [p.grad for p in self._bucket_params[i]]
            for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
                grad.copy_(synced)
        self._pending.clear()
        self._ready = [0] * len(self.buckets)
        arrived, self._arrived = self._arrived, set()
        missing = [name for names, params in zip(self.buckets, self._bucket_params)
                   for name, p in zip(names, params) if id(p) not in arrived]
        if arrived and missing:
            raise RuntimeError(
                f"BucketDDP: the trainable parameters {missing} got no gradient in this "
                "backward, so their buckets were never all-reduced and the replicas would "
                "drift apart. Freeze them (p.requires_grad_(False)) before wrapping the model, "
                "or use them in every forward")

    @contextlib.contextmanager
    def no_sync(self):
        """Inside: backward accumulates gradients locally, without any communication."""
        # TODO: switch communication off while the with-block runs (and back on after).
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous
