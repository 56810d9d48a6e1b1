"""Known-wrong files of notebook 09, as patches of the solution (see tests/flaws.py): one flaw
each, naming the clause of ``exercise_utils/bonus_fsdp/requirements.py`` it breaks and the check
case that must reject it."""
from flaws import Def, Flaw

FREE_GRADS = ("        for p in self.params:\n"
              "            p.grad = None                         # a rank keeps only its shard "
              "of the gradient\n")
STEP = "        self.optim.step()\n"

FLAWS = [
    # ------------------------------------------------------------------ zero2: shard_flat
    Flaw("zero2", "pads_extra_shard", clause="pad", case="shard-values",
         why="computes the shard length as numel // world_size + 1 (a hand-made ceiling): when "
             "numel is already a multiple of world_size every shard is one element too long.",
         expect="equal parts",
         patch=(("    per_rank = math.ceil(numel / world_size)\n",
                 "    per_rank = math.floor(numel / world_size) + 1   # rounded up\n"),)),
    Flaw("zero2", "shard_view", clause="new-1-d", case="shard-new",
         why="returns a slice of the padded vector without .clone(): a view that keeps the whole "
             "padded vector alive, so the rank keeps all of it instead of 1/N.",
         expect="returned a view of a larger tensor",
         patch=(("    return padded[rank * per_rank:(rank + 1) * per_rank].clone(), numel\n",
                 "    return padded[rank * per_rank:(rank + 1) * per_rank], numel\n"),)),
    Flaw("zero2", "view_flatten", clause="tensors", case="shard-edges",
         why="flattens each tensor with view(-1), which fails on a transposed parameter.",
         expect="view size is not compatible",
         patch=(("    flat = torch.cat([t.detach().reshape(-1) for t in tensors])\n",
                 "    flat = torch.cat([t.detach().view(-1) for t in tensors])\n"),)),
    Flaw("zero2", "split_empty", clause="numel", case="shard-edges",
         why="cuts the padded vector with split(per_rank): with no elements per_rank is 0 and "
             "split returns one piece, so every rank but 0 fails.",
         expect="with no elements every shard is empty",
         patch=(("    return padded[rank * per_rank:(rank + 1) * per_rank].clone(), numel\n",
                 "    return padded.split(per_rank)[rank].clone(), numel\n"),)),
    Flaw("zero2", "world1_shortcut", clause="world-size", case="shard-edges",
         why="a shortcut for a single rank (nothing to pad or cut) that concatenates the tensors "
             "without flattening them: tensors of different dimensions cannot be concatenated.",
         expect="world_size=1, rank=0) raised RuntimeError",
         patch=(("    flat = torch.cat([t.detach().reshape(-1) for t in tensors])\n",
                 "    if world_size == 1:                      # one rank: the whole vector\n"
                 "        return torch.cat([t.detach() for t in tensors]), "
                 "sum(t.numel() for t in tensors)\n"
                 "    flat = torch.cat([t.detach().reshape(-1) for t in tensors])\n"),)),
    Flaw("zero2", "float32_padding", clause="shard-dtype", case="shard-dtype",
         why="allocates the padded vector with torch.zeros(n) and no dtype: float32, so float64 "
             "values are rounded and int64 ones above 2**24 change.",
         expect="the shard has the tensors' dtype",
         patch=(("    padded = torch.zeros(per_rank * world_size, dtype=flat.dtype, "
                 "device=flat.device)\n",
                 "    padded = torch.zeros(per_rank * world_size, device=flat.device)\n"),)),
    Flaw("zero2", "int_to_float", clause="flat-dtype", case="shard-dtype",
         why="converts the flat vector to the default float dtype so that integer tensors can "
             "be padded like parameters: an int64 shard comes back float32.",
         expect="int64 tensors",
         patch=(("    flat = torch.cat([t.detach().reshape(-1) for t in tensors])\n",
                 "    flat = torch.cat([t.detach().reshape(-1) for t in tensors])\n"
                 "    if not flat.is_floating_point():\n"
                 "        flat = flat.to(torch.get_default_dtype())\n"),)),
    # ------------------------------------------------------------------ zero2: Zero2.step
    Flaw("zero2", "all_reduce", clause="no-all-reduce", case="zero2-collectives",
         why="all-reduces the whole flat gradient and slices its own shard out of the average: "
             "the numbers are right, but it moves twice the data of a reduce-scatter and every "
             "rank briefly holds the full averaged gradient.",
         expect="no all-reduce",
         patch=(("        grad = torch.empty_like(self.shard)\n"
                 "        dist.reduce_scatter_tensor(grad, flat, op=dist.ReduceOp.SUM)\n",
                 "        dist.all_reduce(flat, op=dist.ReduceOp.SUM)\n"
                 "        n = self.shard.numel()\n"
                 "        grad = flat[self.rank * n:(self.rank + 1) * n].clone()\n"),)),
    Flaw("zero2", "broadcast_shards", clause="one-of-each", case="zero2-collectives",
         why="sends the updated shards around with one broadcast per rank instead of one "
             "all-gather: the parameters are right, the collectives are not.",
         expect="issued ['broadcast']",
         patch=(("        dist.all_gather_into_tensor(full, self.shard.detach())\n"
                 "        unflatten_into(full, self.params)\n",
                 "        for r, piece in enumerate(full.chunk(self.world)):\n"
                 "            if r == self.rank:\n"
                 "                piece.copy_(self.shard.detach())\n"
                 "            dist.broadcast(piece, src=r)\n"
                 "        unflatten_into(full, self.params)\n"),)),
    Flaw("zero2", "sum_not_average", clause="average-over-ranks", case="zero2-values",
         why="uses the reduce-scattered SUM of the gradients as the shard's gradient and never "
             "divides by the world size, so every update is N times too large.",
         expect="summed instead of averaged? Divide",
         patch=(("        self.shard.grad = grad.div_(self.world)\n",
                 "        self.shard.grad = grad\n"),)),
    Flaw("zero2", "gathers_before_step", clause="all-gather-updated", case="zero2-values",
         why="all-gathers the shards into the parameters BEFORE the local optimizer steps, so "
             "the parameters always receive the shards of the previous step.",
         expect="parameters after 4 steps of Zero2",
         patch=((STEP, ""),
                ("        unflatten_into(full, self.params)\n",
                 "        unflatten_into(full, self.params)\n" + STEP))),
    Flaw("zero2", "skips_missing_grads", clause="missing-grad", case="zero2-values",
         why="concatenates only the gradients that exist: after a parameter without .grad (an "
             "unused layer) every gradient lands on the wrong parameters.",
         expect="blocks.3's parameters have no .grad there",
         patch=(("        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in "
                 "self.params]\n",
                 "        grads = [p.grad for p in self.params if p.grad is not None]\n"),
                ("        flat[:self.numel] = torch.cat([g.reshape(-1) for g in grads])\n",
                 "        cat = torch.cat([g.reshape(-1) for g in grads])\n"
                 "        flat[:cat.numel()] = cat\n"))),
    Flaw("zero2", "view_grads", clause="any-model", case="zero2-features",
         why="flattens the gradients with view(-1), which fails on a transposed parameter's "
             "gradient.",
         expect="view size is not compatible",
         patch=(("        flat[:self.numel] = torch.cat([g.reshape(-1) for g in grads])\n",
                 "        flat[:self.numel] = torch.cat([g.view(-1) for g in grads])\n"),)),
    Flaw("zero2", "float32_flat", clause="flat-dtype", case="zero2-float64",
         why="allocates the flat gradient buffer with torch.zeros(n) and no dtype (float32): a "
             "float64 model's gradients are rounded, or the collective refuses the mix.",
         expect="zero2-float64",
         patch=(("        flat = torch.zeros(self.shard.numel() * self.world, dtype=self.shard.dtype,\n"
                 "                           device=self.shard.device)\n",
                 "        flat = torch.zeros(self.shard.numel() * self.world, "
                 "device=self.shard.device)\n"),)),
    Flaw("zero2", "keeps_full_grads", clause="free-grads", case="zero2-grads-freed",
         why="copies the gradients into the flat buffer but never frees the parameters' .grad: "
             "every rank keeps the full gradient until the next zero_grad().",
         expect="still hold their full gradients",
         patch=((FREE_GRADS, ""),)),
    Flaw("zero2", "frees_after_step", clause="freed-before-step", case="zero2-freed-before-step",
         why="frees the parameters' .grad only after the local optimizer step (and the "
             "all-gather): while the optimizer runs, every rank still holds the full gradient.",
         expect="BEFORE the optimizer step",
         patch=((FREE_GRADS, ""),
                ("        unflatten_into(full, self.params)\n",
                 "        unflatten_into(full, self.params)\n" + FREE_GRADS))),
    Flaw("zero2", "keeps_local_flat", clause="free-grads", case="zero2-freed-before-step",
         why="sets every p.grad to None but keeps the padded flat buffer and the list of "
             "gradients in local variables until step() returns: during the optimizer step the "
             "full gradient is alive twice.",
         expect="of tensors were alive",
         patch=(("        del flat, grads\n", ""),)),
    Flaw("zero2", "keeps_flat_buffer", clause="memory", case="zero2-memory",
         why="allocates the padded flat gradient buffer once in __init__ and reuses it every "
             "step (an attribute): the parameters' .grad are freed, but a full-size copy of the "
             "gradient stays alive on every rank.",
         expect="after Zero2.step(); expected at most",
         patch=(("        self.optim = optimizer_cls([self.shard], **defaults)   # state for 1/N "
                 "of the elements\n",
                 "        self.optim = optimizer_cls([self.shard], **defaults)   # state for 1/N "
                 "of the elements\n"
                 "        self.flat = torch.zeros(shard.numel() * self.world, dtype=shard.dtype)"
                 "\n"),
                ("        flat = torch.zeros(self.shard.numel() * self.world, dtype=self.shard.dtype,\n"
                 "                           device=self.shard.device)\n",
                 "        flat = self.flat\n"),
                ("        del flat, grads\n", "        del grads\n"))),
    # ------------------------------------------------------------------ zero3
    Flaw("zero3", "shards_plain_list", clause="zero3-parameters-yields", case="zero3-parameters",
         why="keeps the units' shards in a plain Python list instead of an nn.ParameterList: "
             "they are not registered, so parameters() yields only the frozen parameter.",
         expect="Zero3.parameters() yields",
         patch=(("        self.shards = nn.ParameterList([u.shard for u in self.units if u is not "
                 "None])\n",
                 "        self.shards = [u.shard for u in self.units if u is not None]\n"),)),
    Flaw("zero3", "unpack_gathers_every_call", clause="rebuild-noted-one",
         case="zero3-collectives",
         why="all-gathers the unit's parameters anew for every saved tensor it rebuilds instead "
             "of once per backward: a unit whose forward saves several views gathers them "
             "several times.",
         expect="backward all-gathered",
         patch=(("        if self.again is None:\n"
                 "            self.again = self.gather()\n"
                 "        return self.again.as_strided(shape, stride, offset)\n",
                 "        return self.gather().as_strided(shape, stride, offset)\n"),)),
    Flaw("zero3", "reduce_all_reduce", clause="collectives", case="zero3-collectives",
         why="all-reduces the unit's full gradient and slices its own part out: the right "
             "average, with an all-reduce where a reduce-scatter belongs.",
         expect="no all-reduce",
         patch=(("        grad = torch.empty_like(self.shard)\n"
                 "        dist.reduce_scatter_tensor(grad, grad_full.contiguous(), "
                 "op=dist.ReduceOp.SUM)\n",
                 "        total = grad_full.contiguous().clone()\n"
                 "        dist.all_reduce(total, op=dist.ReduceOp.SUM)\n"
                 "        n = self.shard.numel()\n"
                 "        grad = total[self.rank * n:(self.rank + 1) * n].clone()\n"),)),
    Flaw("zero3", "grad_sum", clause="average-over-ranks", case="zero3-values",
         why="returns the reduce-scattered SUM of the ranks' gradients without dividing by the "
             "world size, so every shard's gradient is N times too large.",
         expect="outputs after 4 steps of Zero3",
         patch=(("        return grad.div_(self.world)\n", "        return grad\n"),)),
    Flaw("zero3", "rebuild_ignores_stride", clause="equals-one-process", case="zero3-values",
         why="rebuilds a noted view as a contiguous slice of its shape, ignoring the stride: a "
             "weight autograd saved transposed comes back with its elements in the wrong places.",
         expect="outputs after 4 steps of Zero3",
         patch=(("        return self.again.as_strided(shape, stride, offset)\n",
                 "        return self.again[offset:offset + math.prod(shape)].view(shape)\n"),)),
    Flaw("zero3", "reshard_keeps_attributes", clause="attribute-none", case="zero3-attrs-none",
         why="reshard drops the gathered vector but leaves the module attributes pointing at "
             "their views, which keep it alive until the next forward.",
         expect="reshard() must set EVERY attribute",
         patch=(Def("Unit.reshard", '''
             def reshard(self):
                 """Free the gathered parameters: nothing may keep them alive after forward."""
                 self.full = None
             '''),)),
    Flaw("zero3", "reshard_first_name_only", clause="reshard-every-attribute",
         case="zero3-attrs-none",
         why="reshard sets each parameter's first attribute back to None, not the others: the "
             "tied head.weight keeps a view of the root's gathered vector alive (inside the old "
             "1.3 x memory slack).",
         expect="'head.weight'",
         patch=(("        for _, uses in self.owners:\n"
                 "            for module, name in uses:\n"
                 "                setattr(module, name, None)\n"
                 "        self.full = None\n",
                 "        for _, uses in self.owners:\n"
                 "            module, name = uses[0]\n"
                 "            setattr(module, name, None)\n"
                 "        self.full = None\n"),)),
    Flaw("zero3", "pack_keeps_tensor", clause="view-gathered-parameters",
         case="zero3-forward-memory",
         why="pack returns every tensor as it is, also views of the gathered parameters: "
             "autograd keeps the Linear weights until backward, so every unit's gathered "
             "parameters stay alive through forward.",
         expect="when blocks.1.fc ran",
         patch=(("        if self.full is not None and \\\n"
                 "                tensor.untyped_storage().data_ptr() == "
                 "self.full.untyped_storage().data_ptr():\n"
                 "            return (self, tensor.storage_offset(), tuple(tensor.shape), "
                 "tuple(tensor.stride()))\n", ""),)),
    Flaw("zero3", "reshard_keeps_full", clause="gathered-while-running", case="zero3-memory",
         why="reshard points the module attributes back to None but forgets self.full = None: "
             "the unit's gathered flat parameters stay alive until its next forward.",
         expect="after the optimizer step; expected at most",
         patch=(("                setattr(module, name, None)\n        self.full = None\n\n",
                 "                setattr(module, name, None)\n\n"),)),
    Flaw("zero3", "keeps_views", clause="reshard-frees", case="zero3-memory",
         why="unshard also keeps the views in a list (self.views) to recognise them later, and "
             "reshard never empties it: the views keep every unit's gathered vector alive.",
         expect="after the optimizer step; expected at most",
         patch=(("                setattr(module, name, part.view(shape))\n",
                 "                setattr(module, name, part.view(shape))\n"
                 "        self.views = [getattr(m, n) for _, uses in self.owners for m, n in "
                 "uses]\n"),)),
    Flaw("zero3", "keeps_grad_full", clause="memory", case="zero3-memory",
         why="reduce_grad keeps the unit's padded full gradient (self.grad_full, to reuse its "
             "memory next step): after the step every rank holds every unit's full gradient.",
         expect="after the optimizer step; expected at most",
         patch=(("        self.again = None\n        grad = torch.empty_like(self.shard)\n",
                 "        self.again = None\n        self.grad_full = grad_full.contiguous()\n"
                 "        grad = torch.empty_like(self.shard)\n"),
                ("        dist.reduce_scatter_tensor(grad, grad_full.contiguous(), "
                 "op=dist.ReduceOp.SUM)\n",
                 "        dist.reduce_scatter_tensor(grad, self.grad_full, "
                 "op=dist.ReduceOp.SUM)\n"))),
    Flaw("zero3", "again_never_freed", clause="rebuild-noted-one", case="zero3-values",
         why="reduce_grad never drops self.again: the parameters gathered for backward stay "
             "alive after it, and the next backward rebuilds its views from that stale gather "
             "of the previous step's parameters.",
         expect="outputs after 4 steps of Zero3",
         patch=(("        self.again = None\n        grad = torch.empty_like(self.shard)\n",
                 "        grad = torch.empty_like(self.shard)\n"),)),
    Flaw("zero3", "pack_any_view", clause="root-views", case="zero3-features",
         why="pack takes any saved view that requires grad for a view of its own unit's "
             "parameters: inside a unit that uses the root's tied weight, it notes the root's "
             "view with its own unit and rebuilds it from the wrong vector.",
         expect="zero3-features",
         patch=(("        if self.full is not None and \\\n"
                 "                tensor.untyped_storage().data_ptr() == "
                 "self.full.untyped_storage().data_ptr():\n",
                 "        if self.full is not None and tensor.requires_grad and \\\n"
                 "                tensor._base is not None:                # a view of my "
                 "parameters\n"),)),
    Flaw("zero3", "offset_4_bytes", clause="any-model", case="zero3-float64",
         why="pack computes the note's offset from the data pointers, assuming 4 bytes per "
             "element: right for float32, twice too far for float64.",
         expect="zero3-float64",
         patch=(("            return (self, tensor.storage_offset(), tuple(tensor.shape), "
                 "tuple(tensor.stride()))\n",
                 "            offset = (tensor.data_ptr() - self.full.data_ptr()) // 4\n"
                 "            return (self, offset, tuple(tensor.shape), tuple(tensor.stride()))"
                 "\n"),)),
    Flaw("zero3", "reduce_grad_overwrites", clause="accumulate", case="zero3-accumulate",
         why="reduce_grad writes the averaged shard gradient into self.shard.grad itself (the "
             "text says 'reduce-scattered into its shard's .grad') and returns None: a second "
             "backward pass before the step overwrites the first one's gradient.",
         expect="TWO backward passes",
         patch=(("        return grad.div_(self.world)\n",
                 "        self.shard.grad = grad.div_(self.world)\n        return None\n"),)),
    # ------------------------------------------------------------------ state_dict
    Flaw("state_dict", "every_rank", clause="rank-0-gets", case="state-rank0",
         why="full_state_dict returns the whole state dict on every rank instead of rank 0 only.",
         expect="only rank 0 gets the state dict",
         patch=(("        return {k: out[k] for k in self._keys} if self.rank == 0 else None\n",
                 "        return {k: out[k] for k in self._keys}\n"),)),
    Flaw("state_dict", "no_frozen", clause="rank-0-gets", case="state-keys",
         why="adds the model's buffers (named_buffers()) to the gathered parameters but not its "
             "frozen parameters, which are not sharded either: blocks.2.gain is missing.",
         expect="lacks ['blocks.2.gain']",
         patch=(("        rest = self.model.state_dict()          # frozen parameters and buffers\n",
                 "        rest = dict(self.model.named_buffers())   # the buffers\n"),
                ("        return {k: out[k] for k in self._keys} if self.rank == 0 else None\n",
                 "        return out if self.rank == 0 else None\n"))),
    Flaw("state_dict", "one_tied_name", clause="rank-0-gets", case="state-keys",
         why="stores each gathered parameter under its first name only: the tied weight appears "
             "as emb.weight but not as head.weight.",
         expect="lacks ['head.weight']",
         patch=(("                    out.update({k: value for k in keys})\n",
                 "                    out[keys[0]] = value\n"),
                ("        return {k: out[k] for k in self._keys} if self.rank == 0 else None\n",
                 "        return out if self.rank == 0 else None\n"))),
    Flaw("state_dict", "offset_not_advanced", clause="rank-0-gets", case="state-values",
         why="forgets to advance the offset: every parameter of a unit is cut from the start of "
             "the gathered vector.",
         expect="full_state_dict() after 4 steps",
         patch=(("                    offset += shape.numel()\n", ""),)),
    Flaw("state_dict", "float_rest", clause="dtypes", case="state-float64",
         why="copies the frozen parameters and buffers with .float() for the checkpoint: "
             "float64 values come back float32, the int64 counter as a float.",
         expect="float64 EdgeNet",
         patch=(("        out.update({k: v.detach().clone() for k, v in rest.items() if v is not "
                 "None})\n",
                 "        out.update({k: v.detach().float() for k, v in rest.items() if v is not "
                 "None})\n"),)),
    Flaw("state_dict", "unshard_no_reshard", clause="resharded", case="state-resharded",
         why="reads every parameter from the module attributes after unit.unshard() and never "
             "reshards: after the checkpoint every unit is still gathered.",
         expect="must leave every unit resharded",
         patch=(Def("Zero3.full_state_dict", '''
             def full_state_dict(self):
                 out = {}
                 with torch.no_grad():
                     for unit, names in zip(self.units, self._order):
                         if unit is None:
                             continue
                         unit.unshard()                 # the attributes hold the values now
                         for (_, uses), keys in zip(unit.owners, names):
                             module, name = uses[0]
                             value = getattr(module, name).detach().clone()
                             out.update({k: value for k in keys})
                 rest = self.model.state_dict()          # frozen parameters and buffers
                 out.update({k: v.detach().clone() for k, v in rest.items() if v is not None})
                 return {k: out[k] for k in self._keys} if self.rank == 0 else None
             '''),)),
    Flaw("state_dict", "keeps_gathered", clause="resharded", case="state-resharded",
         why="keeps each unit's gathered vector in unit.full after the checkpoint (as if it "
             "were running): the module attributes are None, but the whole model stays alive.",
         expect="more were alive than before it",
         patch=(("                full, offset = unit.gather(), 0\n",
                 "                unit.full = full = unit.gather()\n                offset = 0\n"),)),
    Flaw("state_dict", "load_shard_zero", clause="load-shards", case="state-load",
         why="cuts every unit's flat vector with rank 0 on every rank, so every rank loads shard "
             "0 instead of its own.",
         expect="after load_full_state_dict()",
         patch=(("                shard, _ = shard_flat([state_dict[keys[0]] for keys in names], "
                 "self.world,\n"
                 "                                      self.rank)\n",
                 "                shard, _ = shard_flat([state_dict[keys[0]] for keys in names], "
                 "self.world, 0)\n"),)),
    Flaw("state_dict", "load_skips_buffers", clause="load-frozen-buffers", case="state-load",
         why="loads every unit's shard but never copies the frozen parameters and buffers, so a "
             "model built from another seed keeps its own buffer and frozen gain.",
         expect="after load_full_state_dict()",
         patch=(("            own = self.model.state_dict()\n"
                 "            for k, v in own.items():\n"
                 "                if v is not None:\n"
                 "                    v.copy_(state_dict[k])\n", ""),)),
    Flaw("state_dict", "every_name_sharded", clause="continues", case="state-load",
         why="builds each unit's flat vector from every key of its parameters, so the tied "
             "weight is in the root's vector twice and every later value is shifted.",
         expect="after load_full_state_dict()",
         patch=(("                shard, _ = shard_flat([state_dict[keys[0]] for keys in names], "
                 "self.world,\n",
                 "                shard, _ = shard_flat([state_dict[k] for keys in names for k in "
                 "keys], self.world,\n"),
                ("                unit.shard.copy_(shard)\n",
                 "                unit.shard.copy_(shard[:unit.shard.numel()])\n"))),
    Flaw("state_dict", "load_via_float32", clause="load-frozen-buffers", case="state-float64",
         why="copies the frozen parameters and buffers through .float(): float64 values are "
             "rounded and the int64 counter above 2**24 changes.",
         expect="the same loaded with load_full_state_dict()",
         patch=(("                    v.copy_(state_dict[k])\n",
                 "                    v.copy_(state_dict[k].float())\n"),)),
    Flaw("state_dict", "load_rebinds_shards", clause="in-place", case="state-load-in-place",
         why="wraps each loaded shard in a new nn.Parameter (and a new ParameterList): an "
             "optimizer built before the load keeps updating the old shards.",
         expect="no longer yields the same tensors",
         patch=(("                unit.shard.copy_(shard)\n",
                 "                unit.shard = nn.Parameter(shard)\n"
                 "            self.shards = nn.ParameterList([u.shard for u in self.units if u "
                 "is not None])\n"),)),
    Flaw("state_dict", "load_assign", clause="in-place", case="state-load-in-place",
         why="loads the frozen parameters and buffers with load_state_dict(..., assign=True), "
             "which replaces the model's tensors by the given ones instead of copying into them.",
         expect="an optimizer built before the load would update orphans",
         patch=(("            own = self.model.state_dict()\n"
                 "            for k, v in own.items():\n"
                 "                if v is not None:\n"
                 "                    v.copy_(state_dict[k])\n",
                 "            own = self.model.state_dict()\n"
                 "            self.model.load_state_dict({k: state_dict[k].clone() for k in own},"
                 " assign=True)\n"),)),
    # ------------------------------------------------------------------ time-varying gradients
    Flaw("zero2", "zeros_made_once", clause="missing-grad", case="zero2-values",
         why="makes the zeros of the parameters without a gradient once, at the first step, and "
             "uses them for those parameters at every step: a layer unused at the first step "
             "and used later has its gradient replaced by zeros.",
         expect="were counted as zeros at every later step too",
         patch=(("        grads = [p.grad if p.grad is not None else torch.zeros_like(p) "
                 "for p in self.params]\n",
                 "        if getattr(self, \"_zeros\", None) is None:   # unused parameters: "
                 "their zeros, made once\n"
                 "            self._zeros = {id(p): torch.zeros_like(p) for p in self.params "
                 "if p.grad is None}\n"
                 "        grads = [self._zeros.get(id(p), p.grad) for p in self.params]\n"),)),
]
