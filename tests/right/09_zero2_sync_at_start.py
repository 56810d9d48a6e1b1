"""RIGHT (notebook 09, zero2): written from the notebook alone, as ``09_zero2_padchunk`` but
``Zero2.__init__`` first makes every rank start from rank 0's parameters: one
``dist.broadcast`` per trainable parameter (a careful student's guard against ranks built from
different seeds; the notebook neither asks for it nor forbids it, and ``step()`` still issues
one reduce-scatter and one all-gather only). On the wire that is (N - 1) x the parameters more
per ``Zero2`` built, which the envelope allows.

The checker must accept it.
"""
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


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
    with torch.no_grad():
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        numel = flat.numel()
        per = math.ceil(numel / world_size)
        flat = F.pad(flat, (0, per * world_size - numel))
        shard = torch.chunk(flat, world_size)[rank].clone()
    return shard, numel


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
        with torch.no_grad():
            for p in self.params:             # every rank starts from rank 0's parameters
                dist.broadcast(p.data, src=0)
        shard, self.numel = shard_flat(self.params, self.world, self.rank)
        self.shard = nn.Parameter(shard)          # this rank's fp32 shard: the one it updates
        self.optim = optimizer_cls([self.shard], **defaults)   # state for 1/N of the elements

    def step(self):
        """Reduce-scatter the gradients (the AVERAGE over the ranks of this rank's shard becomes
        ``self.shard.grad``; a parameter without ``.grad`` counts as zeros), free every
        parameter's full ``.grad``, step the local optimizer on the shard, and all-gather the
        updated shards into every rank's parameters."""
        per = self.shard.numel()
        with torch.no_grad():
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                              for p in self.params])
            flat = F.pad(flat, (0, per * self.world - flat.numel()))
        for p in self.params:
            p.grad = None
        grad = torch.empty_like(self.shard)
        dist.reduce_scatter_tensor(grad, flat)
        del flat
        grad.div_(self.world)
        self.shard.grad = grad
        self.optim.step()
        full = torch.empty(per * self.world, dtype=self.shard.dtype, device=self.shard.device)
        dist.all_gather_into_tensor(full, self.shard.detach())
        unflatten_into(full, self.params)

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


class Unit:
    """One unit of ``Zero3``: the flat parameters of some modules, of which this rank keeps a
    1/N shard (``self.shard``, an ``nn.Parameter``: what the optimizer updates).

    Args:
        owners: ``[(parameter, [(module, attribute name), ...])]``: each parameter once, with
            every place the model uses it (a tied weight has two). The unit keeps their
            shapes, not the tensors.
    """

    def __init__(self, owners, world, rank):
        self.world, self.rank = world, rank
        shard, self.numel = shard_flat([p for p, _ in owners], world, rank)
        self.shard = nn.Parameter(shard)
        self.owners = [(p.shape, uses) for p, uses in owners]   # not the full tensors
        self.full = None        # the gathered flat parameters while the unit runs forward
        self.again = None       # ... and gathered again for backward
        self.outer = None       # the root unit (set by Zero3 for the other units)
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
        out = torch.empty_like(self.shard)
        dist.reduce_scatter_tensor(out, grad_full.contiguous())
        return out.div_(self.world)

    def unshard(self):
        """Gather the parameters (through ``_Gather``, so backward reaches the shard) and point
        every module attribute at its view of them."""
        self.full = _Gather.apply(self.shard, self)
        offset = 0
        for shape, uses in self.owners:
            n = math.prod(shape)
            view = self.full[offset:offset + n].view(shape)
            for module, name in uses:
                setattr(module, name, view)
            offset += n

    def reshard(self):
        """Free the gathered parameters: nothing may keep them alive after forward."""
        for _, uses in self.owners:
            for module, name in uses:
                setattr(module, name, None)
        self.full = None

    def _mine(self, tensor):
        return (self.full is not None and tensor.numel() > 0
                and tensor.untyped_storage().data_ptr() == self.full.untyped_storage().data_ptr())

    def pack(self, tensor):
        """Autograd saves ``tensor`` for backward: for a view of the gathered parameters save a
        note of where it lies instead (so they can be freed), anything else as it is."""
        if self._mine(tensor):
            return ("unit-view", self, tensor.storage_offset(), tuple(tensor.shape),
                    tuple(tensor.stride()))
        if self.outer is not None:
            return self.outer.pack(tensor)
        return tensor

    def unpack(self, saved):
        """Backward needs a saved tensor: rebuild a noted one from the parameters gathered again
        (once per backward)."""
        if isinstance(saved, tuple) and len(saved) == 5 and saved[0] == "unit-view":
            _, unit, offset, shape, stride = saved
            if unit.again is None:
                unit.again = unit.gather()
            return unit.again.as_strided(shape, stride, offset)
        return saved

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
        self.units = [Unit(owners, self.world, self.rank) if owners else None
                      for owners in members]
        self.shards = nn.ParameterList([u.shard for u in self.units if u is not None])
        for u in self.units[:-1]:
            if u is not None:
                u.outer = self.units[-1]
        for module, unit in zip(units, self.units):
            if unit is not None:
                module.forward = _wrapped(unit, module.forward)

    def forward(self, *args, **kwargs):
        root = self.units[-1]
        if root is None:
            return self.model(*args, **kwargs)
        return root.run(self.model, *args, **kwargs)

    def full_state_dict(self):
        """Every rank calls it; rank 0 gets the whole model's ``state_dict()`` (the keys of the
        model before wrapping, tied weights under each of their names, frozen parameters and
        buffers included), the other ranks None."""
        found = {}
        for unit, order in zip(self.units, self._order):
            if unit is None:
                continue
            with torch.no_grad():
                full = unit.gather()
            offset = 0
            for (shape, _), names in zip(unit.owners, order):
                n = math.prod(shape)
                value = full[offset:offset + n].view(shape).clone()
                for name in names:
                    found[name] = value
                offset += n
            del full
        if self.rank != 0:
            return None
        rest = self.model.state_dict()        # frozen parameters and buffers
        return {key: found[key] if key in found else rest[key].clone() for key in self._keys}

    def load_full_state_dict(self, state_dict):
        """Every rank calls it with the same full state dict (``full_state_dict``'s format):
        each keeps its shards of it; frozen parameters and buffers are copied."""
        with torch.no_grad():
            for unit, order in zip(self.units, self._order):
                if unit is None:
                    continue
                shard, _ = shard_flat([state_dict[names[0]] for names in order],
                                      self.world, self.rank)
                unit.shard.copy_(shard)
            for key, tensor in self.model.state_dict().items():
                tensor.copy_(state_dict[key])


def _wrapped(unit, forward):
    def run(*args, **kwargs):
        return unit.run(forward, *args, **kwargs)
    return run
