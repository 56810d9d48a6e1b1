"""RIGHT (notebook 09, state_dict): written from the notebook alone. ``full_state_dict`` reuses
the forward machinery: under ``torch.no_grad()`` it ``unshard()``s each unit in turn, reads
every trainable parameter from its module attribute by qualified name (``get_submodule``),
clones it and ``reshard()``s; the dict follows the pre-wrapping key order, frozen parameters and
buffers read with ``get_parameter`` / ``get_buffer``. ``load_full_state_dict`` concatenates a
unit's parameters, pads with zeros and takes row ``rank`` of ``view(N, -1)``; frozen
parameters and buffers copied through ``named_parameters`` / ``named_buffers``. The rest as in
09_zero2_lists.

The checker must accept it.
"""
import math

import torch
import torch.distributed as dist
import torch.nn as nn


def shard_flat(tensors, world_size, rank):
    """Flatten ``tensors`` into one vector, pad it with zeros to a multiple of ``world_size``
    and return this rank's equal part.

    Args:
        tensors: a non-empty list of tensors (parameters or gradients), concatenated in order.
        world_size: N, the number of shards.
        rank: which shard to return (0 .. N - 1).
    Returns:
        (shard, numel): a NEW 1-D tensor of ceil(numel / N) elements (not a view: the caller
        keeps only it), and the number of real (unpadded) elements.
    """
    numel = sum(t.numel() for t in tensors)
    per = math.ceil(numel / world_size)
    flat = torch.zeros(per * world_size, dtype=tensors[0].dtype, device=tensors[0].device)
    offset = 0
    with torch.no_grad():
        for t in tensors:
            flat.narrow(0, offset, t.numel()).copy_(t.reshape(-1))
            offset += t.numel()
    return flat.narrow(0, rank * per, per).clone(), numel


def unflatten_into(flat, tensors):
    """Copy the first elements of the 1-D ``flat`` into ``tensors`` in order (given)."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


class Zero2:
    """ZeRO stage 2: gradients and optimizer state sharded, parameters replicated.

    Use like an optimizer after each rank's own ``loss.backward()`` (no DDP, no all-reduce):
    ``opt = Zero2(model.parameters(), torch.optim.AdamW, lr=1e-3); ...; opt.step();
    opt.zero_grad()``.
    """

    def __init__(self, params, optimizer_cls, **defaults):
        self.params = [p for p in params if p.requires_grad]   # frozen ones are not trained
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        shard, self.numel = shard_flat(self.params, self.world, self.rank)
        self.shard = nn.Parameter(shard)          # this rank's fp32 shard: the one it updates
        self.optim = optimizer_cls([self.shard], **defaults)   # state for 1/N of the elements
        self.per = self.shard.numel()

    def _padded(self):
        return torch.zeros(self.per * self.world, dtype=self.shard.dtype,
                           device=self.shard.device)

    def step(self):
        """Reduce-scatter the gradients (the AVERAGE over the ranks of this rank's shard becomes
        ``self.shard.grad``; a parameter without ``.grad`` counts as zeros), free every
        parameter's full ``.grad``, step the local optimizer on the shard, and all-gather the
        updated shards into every rank's parameters."""
        buffer = self._padded()
        offset = 0
        for p in self.params:
            if p.grad is not None:
                buffer[offset:offset + p.numel()].copy_(p.grad.reshape(-1))
                p.grad = None                      # freed as soon as it is copied
            offset += p.numel()
        mine = torch.empty(self.per, dtype=self.shard.dtype, device=self.shard.device)
        dist.reduce_scatter(mine, list(buffer.chunk(self.world)))
        del buffer
        self.shard.grad = mine / self.world
        self.optim.step()

        gathered = self._padded()
        dist.all_gather(list(gathered.chunk(self.world)), self.shard.data)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(gathered[offset:offset + p.numel()].view(p.shape))
                offset += p.numel()

    def zero_grad(self):
        """Drop every gradient: the parameters' and the shard's."""
        for p in self.params:
            p.grad = None
        self.shard.grad = None


class _Gather(torch.autograd.Function):
    """Forward: the unit's full flat parameters, all-gathered from the shards. Backward: the
    gradient of those full parameters, reduce-scattered (averaged) into the shard's."""

    @staticmethod
    def forward(ctx, shard, unit):
        ctx.unit = unit
        return unit.gather()

    @staticmethod
    def backward(ctx, grad_full):
        return ctx.unit.reduce_grad(grad_full), None


class _Where:
    """Where a saved tensor lies in a unit's gathered parameters."""

    __slots__ = ("unit", "offset", "size", "stride")

    def __init__(self, unit, tensor):
        self.unit = unit
        self.offset = tensor.storage_offset()
        self.size = tensor.size()
        self.stride = tensor.stride()


class Unit:
    """One unit of ``Zero3``: the flat parameters of some modules, of which this rank keeps a
    1/N shard (``self.shard``, an ``nn.Parameter``: what the optimizer updates).

    Args:
        owners: ``[(parameter, [(module, attribute name), ...])]``: each parameter once, with
            every place the model uses it (a tied weight has two). The unit keeps their
            shapes, not the tensors.
    """

    def __init__(self, owners, world, rank, active=None):
        self.world, self.rank = world, rank
        shard, self.numel = shard_flat([p for p, _ in owners], world, rank)
        self.shard = nn.Parameter(shard)
        self.owners = [(p.shape, uses) for p, uses in owners]   # not the full tensors
        self.full = None        # the gathered flat parameters while the unit runs forward
        self.again = None       # ... and gathered again for backward
        self.active = [] if active is None else active   # units gathered now (shared)
        for _, uses in owners:
            for module, name in uses:
                del module._parameters[name]     # the module keeps a plain attribute instead
                setattr(module, name, None)

    def gather(self):
        """All-gather the shards into a new flat tensor (padded length)."""
        full = torch.empty(self.shard.numel() * self.world, dtype=self.shard.dtype,
                           device=self.shard.device)
        dist.all_gather_into_tensor(full, self.shard.detach())
        return full

    def reduce_grad(self, grad_full):
        """The average over the ranks of this rank's part of ``grad_full``; frees what backward
        gathered."""
        self.again = None
        grad_full = grad_full.contiguous()
        part = torch.empty(self.shard.numel(), dtype=grad_full.dtype, device=grad_full.device)
        dist.reduce_scatter_tensor(part, grad_full)
        part /= self.world
        return part

    def _views(self, full):
        offset = 0
        for shape, uses in self.owners:
            n = shape.numel()
            yield full.narrow(0, offset, n).view(shape), uses
            offset += n

    def unshard(self):
        """Gather the parameters (through ``_Gather``, so backward reaches the shard) and point
        every module attribute at its view of them."""
        self.full = _Gather.apply(self.shard, self)
        for view, uses in self._views(self.full):
            for module, name in uses:
                setattr(module, name, view)
        self.active.append(self)

    def reshard(self):
        """Free the gathered parameters: nothing may keep them alive after forward."""
        self.active.remove(self)
        for _, uses in self.owners:
            for module, name in uses:
                setattr(module, name, None)
        self.full = None

    def pack(self, tensor):
        """Autograd saves ``tensor`` for backward: for a view of the gathered parameters save a
        note of where it lies instead (so they can be freed), anything else as it is."""
        base = tensor if tensor._base is None else tensor._base
        for unit in self.active:
            if base is unit.full:
                return _Where(unit, tensor)
        return tensor

    def unpack(self, saved):
        """Backward needs a saved tensor: rebuild a noted one from the parameters gathered again
        (once per backward)."""
        if not isinstance(saved, _Where):
            return saved
        unit = saved.unit
        if unit.again is None:
            unit.again = unit.gather()
        return unit.again.as_strided(saved.size, saved.stride, saved.offset)

    def run(self, forward, *args, **kwargs):
        """``forward(*args, **kwargs)`` with the parameters gathered, then freed (given)."""
        self.unshard()
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                return forward(*args, **kwargs)
        finally:
            self.reshard()


def _uses(model):
    """``{id(parameter): (parameter, [(module, name, qualified name), ...])}`` for the
    trainable parameters, every place each is registered (tied weights: several)."""
    found = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        for name, p in list(module._parameters.items()):
            if p is not None and p.requires_grad:
                found.setdefault(id(p), (p, []))[1].append(
                    (module, name, f"{prefix}.{name}" if prefix else name))
    return found


class Zero3(nn.Module):
    """ZeRO stage 3 / FSDP: parameters, gradients and optimizer state sharded.

    Args:
        model: the model (the same initial values on every rank). Its trainable parameters
            become shards; frozen parameters and buffers stay as they are on every rank.
        units: submodules of ``model``, each a unit gathered only while it runs. A parameter
            used inside exactly one unit belongs to it; every other (outside every unit, or
            tied between units) belongs to the root unit, gathered for the whole forward.
    ``Zero3.parameters()`` yields the shards (and frozen parameters): give them to any
    ``torch.optim`` optimizer.
    """

    def __init__(self, model, units):
        super().__init__()
        self.model = model
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self._keys = list(model.state_dict().keys())
        uses = _uses(model)
        inside = {}
        for i, unit in enumerate(units):
            for p in unit.parameters():
                inside.setdefault(id(p), set()).add(i)
        members = [[] for _ in range(len(units) + 1)]          # the root unit last
        self._names = {}
        for key, (p, where) in uses.items():
            i = next(iter(inside[key])) if len(inside.get(key, ())) == 1 and all(
                any(m is n for n in units[next(iter(inside[key]))].modules())
                for m, _, _ in where) else len(units)
            members[i].append((p, [(m, n) for m, n, _ in where]))
            self._names[key] = [q for _, _, q in where]
        self._order = [[self._names[id(p)] for p, _ in owners] for owners in members]
        active = []
        self.units = [Unit(owners, self.world, self.rank, active) if owners else None
                      for owners in members]
        self.shards = nn.ParameterList([u.shard for u in self.units if u is not None])
        for module, unit in zip(units, self.units):
            if unit is not None:
                module.forward = _wrapped(unit, module.forward)

    def forward(self, *args, **kwargs):
        root = self.units[-1]
        if root is None:
            return self.model(*args, **kwargs)
        return root.run(self.model, *args, **kwargs)

    def _attribute(self, qualified):
        path, _, name = qualified.rpartition(".")
        return self.model.get_submodule(path), name

    def full_state_dict(self):
        """Every rank calls it; rank 0 gets the whole model's ``state_dict()`` (the keys of the
        model before wrapping, tied weights under each of their names, frozen parameters and
        buffers included), the other ranks None."""
        trained = {}
        with torch.no_grad():
            for unit, order in zip(self.units, self._order):
                if unit is None:
                    continue
                unit.unshard()
                try:
                    for names in order:
                        module, name = self._attribute(names[0])
                        value = getattr(module, name).detach().clone()
                        for q in names:
                            trained[q] = value
                finally:
                    unit.reshard()
        if self.rank != 0:
            return None
        state = {}
        for key in self._keys:
            if key in trained:
                state[key] = trained[key]
                continue
            module, name = self._attribute(key)
            if name in module._parameters:
                state[key] = self.model.get_parameter(key).detach().clone()
            else:
                state[key] = self.model.get_buffer(key).detach().clone()
        return state

    def load_full_state_dict(self, state_dict):
        """Every rank calls it with the same full state dict (``full_state_dict``'s format):
        each keeps its shards of it; frozen parameters and buffers are copied."""
        with torch.no_grad():
            for unit, order in zip(self.units, self._order):
                if unit is None:
                    continue
                flat = torch.cat([state_dict[names[0]].reshape(-1) for names in order])
                padded = flat.new_zeros(unit.shard.numel() * self.world)
                padded[:flat.numel()] = flat
                unit.shard.copy_(padded.view(self.world, -1)[self.rank])
            for name, tensor in self.model.named_parameters():
                tensor.copy_(state_dict[name])
            for name, tensor in self.model.named_buffers():
                if name in state_dict:
                    tensor.copy_(state_dict[name])


def _wrapped(unit, forward):
    def run(*args, **kwargs):
        return unit.run(forward, *args, **kwargs)
    return run
