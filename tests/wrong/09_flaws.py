"""Known-wrong files of notebook 09, as patches of the solution (see tests/flaws.py)."""
from flaws import Def, Flaw  # noqa: F401

FLAWS = [
    Flaw('state_dict', 'every_rank', clause='rank-0-gets', case='?',
         why=('full_state_dict returns the whole state dict'
              ' on every rank instead of rank 0 only (the other ranks should get None).'),
         patch=(
             ("""        sizes = [shape.numel() for shape, _ in self.owners]
        parts = self.full.split(sizes + [self.full.numel() - sum(sizes)])   # + the padding
        for (shape, uses), part in zip(self.owners, parts):
""",
              """        offset = 0
        for shape, uses in self.owners:
            view = self.full[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
"""),
             ("""                setattr(module, name, part.view(shape))
""",
              """                setattr(module, name, view)
"""),
             ("""        return {k: out[k] for k in self._keys} if self.rank == 0 else None
""",
              """        return {k: out[k] for k in self._keys}
"""),
         )),
    Flaw('state_dict', 'load_shard_zero', clause='keeps-shards-frozen', case='?',
         why=("load_full_state_dict cuts every unit's "
              'flat vector with rank 0 on every rank, so every rank loads shard 0 instead of its own '
              'shard.'),
         patch=(
             ("""        sizes = [shape.numel() for shape, _ in self.owners]
        parts = self.full.split(sizes + [self.full.numel() - sum(sizes)])   # + the padding
        for (shape, uses), part in zip(self.owners, parts):
""",
              """        offset = 0
        for shape, uses in self.owners:
            view = self.full[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
"""),
             ("""                setattr(module, name, part.view(shape))
""",
              """                setattr(module, name, view)
"""),
             ("""                shard, _ = shard_flat([state_dict[keys[0]] for keys in names], self.world,
                                      self.rank)
""",
              """                shard, _ = shard_flat([state_dict[keys[0]] for keys in names], self.world, 0)
"""),
         )),
    Flaw('state_dict', 'load_skips_buffers', clause='keeps-shards-frozen', case='?',
         why=('load_full_state_dict loads every '
              "unit's shard but never copies the frozen parameters and buffers, so a model built from "
              'another seed keeps its own buffer and frozen gain.'),
         patch=(
             ("""        sizes = [shape.numel() for shape, _ in self.owners]
        parts = self.full.split(sizes + [self.full.numel() - sum(sizes)])   # + the padding
        for (shape, uses), part in zip(self.owners, parts):
""",
              """        offset = 0
        for shape, uses in self.owners:
            view = self.full[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
"""),
             ("""                setattr(module, name, part.view(shape))
""",
              """                setattr(module, name, view)
"""),
             ("""            own = self.model.state_dict()
            for k, v in own.items():
                if v is not None:
                    v.copy_(state_dict[k])
""",
              ''),
         )),
    Flaw('state_dict', 'no_frozen', clause='rank-0-gets', case='?',
         why=("full_state_dict adds the model's buffers "
              '(``named_buffers()``) to the gathered parameters but not its frozen parameters, which '
              'are not sharded either: ``blocks.2.gain`` is missing.'),
         patch=(
             ("""        sizes = [shape.numel() for shape, _ in self.owners]
        parts = self.full.split(sizes + [self.full.numel() - sum(sizes)])   # + the padding
        for (shape, uses), part in zip(self.owners, parts):
""",
              """        offset = 0
        for shape, uses in self.owners:
            view = self.full[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
"""),
             ("""                setattr(module, name, part.view(shape))
""",
              """                setattr(module, name, view)
"""),
             ("""        rest = self.model.state_dict()          # frozen parameters and buffers
""",
              """        rest = dict(self.model.named_buffers())   # the buffers
"""),
             ("""        return {k: out[k] for k in self._keys} if self.rank == 0 else None
""",
              """        return out if self.rank == 0 else None
"""),
         )),
    Flaw('state_dict', 'one_tied_name', clause='rank-0-gets', case='?',
         why=('full_state_dict stores each gathered '
              'parameter under its first name only, so the tied weight appears as ``emb.weight`` but '
              'not as ``head.weight``.'),
         patch=(
             ("""        sizes = [shape.numel() for shape, _ in self.owners]
        parts = self.full.split(sizes + [self.full.numel() - sum(sizes)])   # + the padding
        for (shape, uses), part in zip(self.owners, parts):
""",
              """        offset = 0
        for shape, uses in self.owners:
            view = self.full[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
"""),
             ("""                setattr(module, name, part.view(shape))
""",
              """                setattr(module, name, view)
"""),
             ("""                    out.update({k: value for k in keys})
""",
              """                    out[keys[0]] = value
"""),
             ("""        return {k: out[k] for k in self._keys} if self.rank == 0 else None
""",
              """        return out if self.rank == 0 else None
"""),
         )),
    Flaw('zero2', 'all_reduce', clause='no-ddp-no', case='?',
         why=('Zero2.step all-reduces the whole flat gradient '
              'and slices its own shard out of the average: the numbers are right, but it moves twice '
              'the data of a reduce-scatter and every rank briefly holds the full averaged gradient.'),
         patch=(
             ("""        grad = torch.empty_like(self.shard)
        dist.reduce_scatter_tensor(grad, flat, op=dist.ReduceOp.SUM)
""",
              """        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        n = self.shard.numel()
        grad = flat[self.rank * n:(self.rank + 1) * n].clone()
"""),
             ("""        sizes = [shape.numel() for shape, _ in self.owners]
        parts = self.full.split(sizes + [self.full.numel() - sum(sizes)])   # + the padding
        for (shape, uses), part in zip(self.owners, parts):
""",
              """        offset = 0
        for shape, uses in self.owners:
            view = self.full[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
"""),
             ("""                setattr(module, name, part.view(shape))
""",
              """                setattr(module, name, view)
"""),
         )),
    Flaw('zero2', 'gathers_before_step', clause='all-gather-updated', case='?',
         why=('Zero2.step all-gathers the shards into '
              'the parameters BEFORE the local optimizer steps, so the parameters always receive the '
              'shards of the previous step: the model lags one update behind.'),
         patch=(
             ("""        self.optim.step()
""",
              ''),
             ("""        unflatten_into(full, self.params)

""",
              """        unflatten_into(full, self.params)
        self.optim.step()

"""),
             ("""        sizes = [shape.numel() for shape, _ in self.owners]
        parts = self.full.split(sizes + [self.full.numel() - sum(sizes)])   # + the padding
        for (shape, uses), part in zip(self.owners, parts):
""",
              """        offset = 0
        for shape, uses in self.owners:
            view = self.full[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
"""),
             ("""                setattr(module, name, part.view(shape))
""",
              """                setattr(module, name, view)
"""),
         )),
    Flaw('zero2', 'keeps_flat_buffer', clause='free-parameter-s', case='?',
         why=('Zero2 allocates the padded flat gradient '
              "buffer once in __init__ and reuses it every step (an attribute): the parameters' "
              '``.grad`` are freed, but a full-size copy of the gradient stays alive on every rank.'),
         patch=(
             ("""        self.optim = optimizer_cls([self.shard], **defaults)   # state for 1/N of the elements

""",
              """        self.optim = optimizer_cls([self.shard], **defaults)   # state for 1/N of the elements
        self.flat = torch.zeros(shard.numel() * self.world, dtype=shard.dtype)  # reused

"""),
             ("""        flat = torch.zeros(self.shard.numel() * self.world, dtype=self.shard.dtype,
                           device=self.shard.device)
""",
              """        flat = self.flat
"""),
             ("""        sizes = [shape.numel() for shape, _ in self.owners]
        parts = self.full.split(sizes + [self.full.numel() - sum(sizes)])   # + the padding
        for (shape, uses), part in zip(self.owners, parts):
""",
              """        offset = 0
        for shape, uses in self.owners:
            view = self.full[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
"""),
             ("""                setattr(module, name, part.view(shape))
""",
              """                setattr(module, name, view)
"""),
         )),
    Flaw('zero2', 'keeps_full_grads', clause='free-parameter-s', case='?',
         why=('Zero2.step copies the gradients into the '
              "flat buffer but never frees the parameters' ``.grad``: every rank keeps the full "
              'gradient until the next zero_grad(), so gradient memory is not sharded.'),
         patch=(
             ("""        for p in self.params:
            p.grad = None                         # a rank keeps only its shard of the gradient
""",
              ''),
             ("""        sizes = [shape.numel() for shape, _ in self.owners]
        parts = self.full.split(sizes + [self.full.numel() - sum(sizes)])   # + the padding
        for (shape, uses), part in zip(self.owners, parts):
""",
              """        offset = 0
        for shape, uses in self.owners:
            view = self.full[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
"""),
             ("""                setattr(module, name, part.view(shape))
""",
              """                setattr(module, name, view)
"""),
         )),
    Flaw('zero2', 'pads_extra_shard', clause='pad-zeros-multiple', case='?',
         why=('shard_flat computes the shard length as '
              '``numel // world_size + 1`` (a hand-made ceiling): when numel is already a multiple of '
              'world_size it pads a whole extra shard of zeros, so every shard is one element longer '
              'than ceil(numel / N).'),
         patch=(
             ("""    per_rank = math.ceil(numel / world_size)
""",
              """    per_rank = math.floor(numel / world_size) + 1   # rounded up
"""),
             ("""        sizes = [shape.numel() for shape, _ in self.owners]
        parts = self.full.split(sizes + [self.full.numel() - sum(sizes)])   # + the padding
        for (shape, uses), part in zip(self.owners, parts):
""",
              """        offset = 0
        for shape, uses in self.owners:
            view = self.full[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
"""),
             ("""                setattr(module, name, part.view(shape))
""",
              """                setattr(module, name, view)
"""),
         )),
    Flaw('zero2', 'shard_view', clause='new-1-d', case='?',
         why=('shard_flat returns a slice of the padded vector '
              'without ``.clone()``: a view that keeps the whole padded vector alive, so the rank keeps'
              ' all of it instead of 1/N.'),
         patch=(
             ("""    return padded[rank * per_rank:(rank + 1) * per_rank].clone(), numel
""",
              """    return padded[rank * per_rank:(rank + 1) * per_rank], numel
"""),
             ("""        sizes = [shape.numel() for shape, _ in self.owners]
        parts = self.full.split(sizes + [self.full.numel() - sum(sizes)])   # + the padding
        for (shape, uses), part in zip(self.owners, parts):
""",
              """        offset = 0
        for shape, uses in self.owners:
            view = self.full[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
"""),
             ("""                setattr(module, name, part.view(shape))
""",
              """                setattr(module, name, view)
"""),
         )),
    Flaw('zero2', 'sum_not_average', clause='average-over-ranks', case='?',
         why=('Zero2.step uses the reduce-scattered SUM of '
              "the gradients as the shard's gradient and never divides by the world size, so every "
              'update is N times too large.'),
         patch=(
             ("""        self.shard.grad = grad.div_(self.world)
""",
              """        self.shard.grad = grad
"""),
             ("""        sizes = [shape.numel() for shape, _ in self.owners]
        parts = self.full.split(sizes + [self.full.numel() - sum(sizes)])   # + the padding
        for (shape, uses), part in zip(self.owners, parts):
""",
              """        offset = 0
        for shape, uses in self.owners:
            view = self.full[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
"""),
             ("""                setattr(module, name, part.view(shape))
""",
              """                setattr(module, name, view)
"""),
         )),
    Flaw('zero3', 'again_never_freed', clause='rebuild-noted-one', case='?',
         why=('Unit.reduce_grad never drops '
              '``self.again``: the parameters gathered for backward stay alive after it (every rank '
              "holds the whole model), and the next step's backward reuses the stale gather of the "
              'previous step.'),
         patch=(
             ('        gathered."""\n        self.again = None\n        grad = torch.empty_like(self.shard)\n',
              '        gathered."""\n        grad = torch.empty_like(self.shard)\n'),
             ("""        sizes = [shape.numel() for shape, _ in self.owners]
        parts = self.full.split(sizes + [self.full.numel() - sum(sizes)])   # + the padding
        for (shape, uses), part in zip(self.owners, parts):
""",
              """        offset = 0
        for shape, uses in self.owners:
            view = self.full[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
"""),
             ("""                setattr(module, name, part.view(shape))
""",
              """                setattr(module, name, view)
"""),
         )),
    Flaw('zero3', 'grad_sum', clause='average-over-ranks', case='?',
         why=('Unit.reduce_grad returns the reduce-scattered SUM '
              "of the ranks' gradients without dividing by the world size, so every shard's gradient is"
              ' N times too large.'),
         patch=(
             ("""        return grad.div_(self.world)
""",
              """        return grad
"""),
             ("""        sizes = [shape.numel() for shape, _ in self.owners]
        parts = self.full.split(sizes + [self.full.numel() - sum(sizes)])   # + the padding
        for (shape, uses), part in zip(self.owners, parts):
""",
              """        offset = 0
        for shape, uses in self.owners:
            view = self.full[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
"""),
             ("""                setattr(module, name, part.view(shape))
""",
              """                setattr(module, name, view)
"""),
         )),
    Flaw('zero3', 'pack_keeps_tensor', clause='view-gathered-parameters', case='?',
         why=('Unit.pack returns every tensor as it is, '
              'also views of the gathered parameters: autograd keeps the Linear weights (views of '
              '``self.full``) until backward, so the gathered parameters of every unit stay alive '
              'through forward.'),
         patch=(
             ("""        sizes = [shape.numel() for shape, _ in self.owners]
        parts = self.full.split(sizes + [self.full.numel() - sum(sizes)])   # + the padding
        for (shape, uses), part in zip(self.owners, parts):
""",
              """        offset = 0
        for shape, uses in self.owners:
            view = self.full[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
"""),
             ("""                setattr(module, name, part.view(shape))
""",
              """                setattr(module, name, view)
"""),
             ('        if self.full is not None and \\\n                tensor.untyped_storage().data_ptr() == self.full.untyped_storage().data_ptr():\n            return (self, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))\n',
              ''),
         )),
    Flaw('zero3', 'reshard_keeps_full', clause='unit-s-parameters', case='?',
         why=('Unit.reshard points the module attributes'
              " back to None but forgets ``self.full = None``: the unit's gathered flat parameters stay"
              ' alive (until the next step), so after a few units every rank holds the whole model.'),
         patch=(
             ("""        sizes = [shape.numel() for shape, _ in self.owners]
        parts = self.full.split(sizes + [self.full.numel() - sum(sizes)])   # + the padding
        for (shape, uses), part in zip(self.owners, parts):
""",
              """        offset = 0
        for shape, uses in self.owners:
            view = self.full[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
"""),
             ("""                setattr(module, name, part.view(shape))
""",
              """                setattr(module, name, view)
"""),
             ("""                setattr(module, name, None)
        self.full = None

""",
              """                setattr(module, name, None)

"""),
         )),
    Flaw('zero3', 'shards_plain_list', clause='zero3-parameters-yields', case='?',
         why=("Zero3 keeps the units' shards in a plain "
              'Python list instead of an ``nn.ParameterList``: they are not registered, so '
              '``parameters()`` yields only the frozen parameter and the optimizer never updates the '
              'shards.'),
         patch=(
             ("""        sizes = [shape.numel() for shape, _ in self.owners]
        parts = self.full.split(sizes + [self.full.numel() - sum(sizes)])   # + the padding
        for (shape, uses), part in zip(self.owners, parts):
""",
              """        offset = 0
        for shape, uses in self.owners:
            view = self.full[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
"""),
             ("""                setattr(module, name, part.view(shape))
""",
              """                setattr(module, name, view)
"""),
             ("""        self.shards = nn.ParameterList([u.shard for u in self.units if u is not None])
""",
              """        self.shards = [u.shard for u in self.units if u is not None]
"""),
         )),
    Flaw('zero3', 'unpack_gathers_every_call', clause='rebuild-noted-one', case='?',
         why=("Unit.unpack all-gathers the unit's"
              ' parameters anew for every saved tensor it rebuilds instead of once per backward (no '
              '``self.again`` cache): a unit whose forward saves several views of its parameters '
              'gathers them several times in backward.'),
         patch=(
             ("""        sizes = [shape.numel() for shape, _ in self.owners]
        parts = self.full.split(sizes + [self.full.numel() - sum(sizes)])   # + the padding
        for (shape, uses), part in zip(self.owners, parts):
""",
              """        offset = 0
        for shape, uses in self.owners:
            view = self.full[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
"""),
             ("""                setattr(module, name, part.view(shape))
""",
              """                setattr(module, name, view)
"""),
             ("""        if self.again is None:
            self.again = self.gather()
        return self.again.as_strided(shape, stride, offset)
""",
              """        return self.gather().as_strided(shape, stride, offset)
"""),
         )),
]

