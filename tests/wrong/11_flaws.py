"""Known-wrong files of notebook 11, as patches of the solution (see tests/flaws.py): one flaw
each, naming the clause of ``exercise_utils/bonus_composed/requirements.py`` it breaks and the
check case that must reject it."""
from flaws import Def, Flaw

COORDS = "    return rank // (pp * tp), rank // tp % pp, rank % tp\n"
KEY = "        key = tuple(coords[k] for k in DIMS if k != dim)\n"
KEEP = ("                if rank in line:\n"
        "                    self.ranks[dim], self.groups[dim] = line, group\n")
NEIGHBOURS = ("        self.prev = stages[p - 1] if p > 0 else None\n"
              "        self.next = stages[p + 1] if p + 1 < pp else None\n")
REDUCE = "        out = x.clone(memory_format=torch.contiguous_format)\n        dist.all_reduce(out, group=group)\n"
LOOKUP = "        out = F.embedding(torch.where(mine, local, 0), self.weight) * mine.unsqueeze(-1)\n"
MAX = "        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)\n"
TARGET = "        target_logit = logits.detach().gather(1, index).squeeze(1) * mine\n"
BACKWARD = "        return g * (grad / softmax.shape[0]), None, None\n"

COPY_FORWARD = "        ctx.group = group\n        return x.view_as(x)\n"
COPY_BACKWARD = ("        grad = grad.clone(memory_format=torch.contiguous_format)\n"
                 "        dist.all_reduce(grad, group=ctx.group)\n        return grad, None\n")
PROJ = "        x = x + ReduceFromGroup.apply(a, self.group) + self.b_proj\n"
HEAD = "            x = F.linear(CopyToGroup.apply(self.norm(x), self.group), self.head)\n"
LOSS_SHARE = ("    dist.all_reduce(value, group=mesh.groups[\"dp\"])\n"
              "    dist.broadcast(value, src=mesh.ranks[\"pp\"][-1], group=mesh.groups[\"pp\"])\n")
LOSS = ("        loss = vocab_parallel_cross_entropy(y.flatten(0, 1), targets.flatten(), "
        "mesh.groups[\"tp\"])\n")

FLAWS = [
    # ------------------------------------------------------------------ the mesh
    Flaw("mesh", "coords_dp_fastest", clause="coords", case="mesh-pure",
         why="lays the grid out with dp varying fastest (rank = (t * pp + p) * dp + d), the "
             "reverse of the notebook's order.",
         expect="mesh_coords(1, 1, 2, 2) returned [0, 1, 0]",
         patch=((COORDS, "    return rank % dp, rank // dp % pp, rank // (dp * pp)\n"),)),
    Flaw("mesh", "coords_list", clause="coords-returns", case="mesh-pure",
         why="returns the coordinates as a list, not a tuple.",
         expect="(list of int); expected the tuple of ints",
         patch=((COORDS, "    return [rank // (pp * tp), rank // tp % pp, rank % tp]\n"),)),
    Flaw("mesh", "coords_numpy_ints", clause="coords-returns", case="mesh-pure",
         why="returns numpy's unravel_index as it is: a tuple of numpy integers, not ints.",
         expect="(tuple of int64); expected the tuple of ints",
         patch=((COORDS, "    import numpy as np\n"
                         "    return tuple(np.unravel_index(rank, (dp, pp, tp)))\n"),)),
    Flaw("mesh", "coords_rank_unchecked", clause="coords-returns", case="mesh-pure",
         why="does not check the rank: a rank outside the grid gets coordinates outside it.",
         expect="mesh_coords(4, 2, 1, 2) returned",
         patch=(("    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < "
                 "dp * pp * tp:\n        raise ValueError(f\"rank {rank!r} is not in [0, "
                 "{dp * pp * tp})\")\n", ""),)),
    Flaw("mesh", "lines_planes", clause="lines", case="mesh-pure",
         why="groups the ranks that share the coordinate dim (a plane of the grid) instead of "
             "those that share the other two (a line).",
         expect="mesh_lines('dp', 1, 1, 2)",
         patch=((KEY, "        key = tuple(coords[k] for k in DIMS if k == dim)\n"),
                ("        lines.setdefault(key, [None] * sizes[dim])[coords[dim]] = rank\n",
                 "        lines.setdefault(key, []).append(rank)\n"))),
    Flaw("mesh", "lines_of_tuples", clause="lines-returns", case="mesh-pure",
         why="returns each line as a tuple.",
         expect="(a list of tuple of int)",
         patch=(("    return sorted(lines.values())\n",
                 "    return sorted(tuple(line) for line in lines.values())\n"),)),
    Flaw("mesh", "lines_unknown_dim", clause="lines-returns", case="mesh-pure",
         why="does not check dim: an unknown dimension fails with a KeyError deep inside.",
         expect="mesh_lines('cp', 1, 2, 1) raised KeyError",
         patch=(("    if dim not in DIMS:\n        raise ValueError(f\"dim must be one of {DIMS}, "
                 "got {dim!r}\")\n", ""),)),
    Flaw("mesh", "only_own_groups", clause="order", case="mesh-groups",
         why="makes only the groups it is in, with use_local_synchronization=True (which torch "
             "allows): the ranks no longer make the same groups in the same order.",
         expect="called dist.new_group with",
         patch=(("                group = dist.new_group(line)\n                if rank in line:\n",
                 "                if rank in line:\n"
                 "                    group = dist.new_group(line, use_local_synchronization=True)\n"),)),
    Flaw("mesh", "tp_groups_first", clause="order", case="mesh-groups",
         why="makes the tensor-parallel groups first (tp, pp, dp): the same groups, another order.",
         expect="expected [[0, 4], [1, 5]",
         patch=(("        for dim in DIMS:\n            for line in mesh_lines(",
                 "        for dim in reversed(DIMS):\n            for line in mesh_lines("),)),
    Flaw("mesh", "keeps_last_group", clause="groups", case="mesh-comm",
         why="keeps the last group made in each dimension, not its own (the `if rank in line` "
             "test applied to the ranks only).",
         expect="is a group of",
         patch=((KEEP, "                self.groups[dim] = group\n                if rank in line:\n"
                       "                    self.ranks[dim] = line\n"),)),
    Flaw("mesh", "neighbours_are_coordinates", clause="neighbours", case="mesh-groups",
         why="gives the previous and next stage's pipeline coordinate, not its global rank.",
         expect=".next is 1; expected 2",
         patch=((NEIGHBOURS, "        self.prev = p - 1 if p > 0 else None\n"
                             "        self.next = p + 1 if p + 1 < pp else None\n"),)),
    Flaw("mesh", "ranks_within_group", clause="ranks", case="mesh-groups",
         why="keeps in ranks the ranks within the group (0, 1, ...) instead of the global ranks.",
         expect=".ranks is",
         patch=((KEEP, "                if rank in line:\n"
                       "                    self.ranks[dim] = list(range(len(line)))\n"
                       "                    self.groups[dim] = group\n"),)),
    Flaw("mesh", "sizes_unchecked", clause="sizes", case="mesh-groups",
         why="does not call check_sizes: sizes whose product is not the world size start making "
             "groups before anything fails.",
         expect="Mesh(2, 2, 3)",
         patch=(("        check_sizes(dp, pp, tp, dist.get_world_size())\n", ""),)),
    # ------------------------------------------------------------------ the vocabulary
    Flaw("vocab_parallel", "sum_over_world", clause="group-sum", case="vp-group",
         why="all-reduces without group=: the sum runs over the whole world, not the group.",
         expect="not of the world",
         patch=((REDUCE, "        out = x.clone(memory_format=torch.contiguous_format)\n"
                         "        dist.all_reduce(out)\n"),)),
    Flaw("vocab_parallel", "sum_in_place", clause="group-sum", case="vp-group",
         why="all-reduces x itself and returns it: the caller's tensor is overwritten.",
         expect="modified x in place",
         patch=((REDUCE + "        return out\n",
                 "        dist.all_reduce(x, group=group)\n        return x\n"),)),
    Flaw("vocab_parallel", "sum_backward_sums", clause="group-sum", case="vp-group",
         why="all-reduces the gradient in the backward too (as torch.distributed.nn's "
             "all_reduce does): every gradient is the group's sum.",
         expect="the gradient of x",
         patch=(("    def backward(ctx, grad):\n        return grad, None\n",
                 "    def backward(ctx, grad):\n"
                 "        grad = grad.clone()\n        dist.all_reduce(grad, group=ctx.group)\n"
                 "        return grad, None\n"),
                ("        dist.all_reduce(out, group=group)\n        return out\n",
                 "        dist.all_reduce(out, group=group)\n        ctx.group = group\n"
                 "        return out\n"))),
    Flaw("vocab_parallel", "rows_of_global_rank", clause="emb-rows", case="vp-embedding",
         why="takes the rows of the global rank (dist.get_rank()) instead of the group's rank.",
         expect="group rank r holds rows",
         patch=(("        r, t = dist.get_rank(group), dist.get_world_size(group)\n"
                 "        if emb.num_embeddings % t:\n",
                 "        r, t = dist.get_rank(), dist.get_world_size(group)\n"
                 "        if emb.num_embeddings % t:\n"),)),
    Flaw("vocab_parallel", "rows_are_a_view", clause="emb-copy", case="vp-embedding",
         why="keeps a slice of the table's weight without .clone(): a view of emb's tensor.",
         expect="a view of emb's weight True",
         patch=(("        return cls(emb.weight.detach()[r * k:(r + 1) * k].clone(), r * k, group)\n",
                 "        return cls(emb.weight.detach()[r * k:(r + 1) * k], r * k, group)\n"),)),
    Flaw("vocab_parallel", "divisibility_unchecked", clause="emb-divisible", case="vp-embedding",
         why="does not check that the rows divide by the group's size: the last rows are lost.",
         expect="expected ValueError",
         patch=(("        if emb.num_embeddings % t:\n            raise ValueError(f\"num_embeddings="
                 "{emb.num_embeddings} is not divisible by {t} ranks\")\n", ""),)),
    Flaw("vocab_parallel", "others_not_zeroed", clause="emb-forward", case="vp-embedding",
         why="looks up every token in its rows, clamping the ids outside them, and does not "
             "zero those lookups: the sum counts wrong rows.",
         expect="the output differs from one process",
         patch=((LOOKUP, "        out = F.embedding(local.clamp(0, self.weight.shape[0] - 1), "
                         "self.weight)\n"),)),
    Flaw("vocab_parallel", "differentiable_all_reduce", clause="emb-one-all-reduce",
         case="vp-collectives",
         why="sums with torch.distributed.nn.functional.all_reduce instead of ReduceFromGroup: "
             "its backward all-reduces the gradient again.",
         expect="its backward issued all_reduce",
         patch=(("        return ReduceFromGroup.apply(out, self.group)\n",
                 "        from torch.distributed.nn.functional import all_reduce\n"
                 "        return all_reduce(out, group=self.group)\n"),)),
    Flaw("vocab_parallel", "weight_detached", clause="emb-grad", case="vp-embedding",
         why="looks up in weight.detach() (to keep autograd away from the all-reduce): no "
             "gradient reaches the shard.",
         expect="the gradient of weight",
         patch=((LOOKUP, "        out = F.embedding(torch.where(mine, local, 0), self.weight."
                         "detach()) * mine.unsqueeze(-1)\n"),)),
    Flaw("vocab_parallel", "ids_checked_with_max", clause="emb-forward", case="vp-embedding",
         why="checks the ids against V with tokens.max() and tokens.min(), which raise on an "
             "empty batch of tokens (a (B, 0) tensor: nn.Embedding returns (B, 0, d)).",
         expect="forward on empty tokens, of shape (3, 0)",
         patch=((LOOKUP, "        V = self.weight.shape[0] * dist.get_world_size(self.group)\n"
                         "        if int(tokens.max()) >= V or int(tokens.min()) < 0:\n"
                         "            raise IndexError(f\"token ids must lie in [0, {V})\")\n"
                 + LOOKUP),)),
    Flaw("vocab_parallel", "local_maximum", clause="loss-value", case="vp-loss",
         why="subtracts each rank's own row maximum, not the maximum over all V columns: the "
             "ranks' sums of exponentials are on different scales.",
         expect="vocab_parallel_cross_entropy in float64: the loss differs",
         patch=((MAX, ""),)),
    Flaw("vocab_parallel", "no_maximum", clause="loss-value", case="vp-loss",
         why="exponentiates the logits as they are: exp(800) overflows.",
         expect="the loss differs from one process by inf",
         patch=((MAX, "        row_max = torch.zeros_like(row_max)\n"),)),
    Flaw("vocab_parallel", "sum_not_mean", clause="loss-value", case="vp-loss",
         why="sums the rows' losses instead of taking their mean (the backward divides by N).",
         expect="the loss differs",
         patch=(("        loss = (sum_exp.log() + row_max - target_logit).mean()\n",
                 "        loss = (sum_exp.log() + row_max - target_logit).sum()\n"),)),
    Flaw("vocab_parallel", "columns_of_global_rank", clause="loss-columns", case="vp-loss",
         why="places its columns by the global rank (dist.get_rank()), not the group's rank.",
         expect="the loss differs",
         patch=(("        start = dist.get_rank(group) * k\n",
                 "        start = dist.get_rank() * k\n"),)),
    Flaw("vocab_parallel", "target_logit_unmasked", clause="loss-three", case="vp-loss",
         why="every rank adds the logit at the clamped target index, also when the target's "
             "column is not its own.",
         expect="the loss differs",
         patch=((TARGET, "        target_logit = logits.detach().gather(1, index).squeeze(1)\n"),)),
    Flaw("vocab_parallel", "gathers_the_logits", clause="loss-three", case="vp-collectives",
         why="all-gathers the full logits and computes the loss on every rank.",
         expect="all_gather",
         patch=(Def("VocabParallelCrossEntropy.forward",
                    "@staticmethod\ndef forward(ctx, logits, targets, group):\n"
                    "    t = dist.get_world_size(group)\n"
                    "    parts = [torch.empty_like(logits) for _ in range(t)]\n"
                    "    dist.all_gather(parts, logits.detach().contiguous(), group=group)\n"
                    "    full = torch.cat(parts, dim=1)\n"
                    "    n, k = logits.shape\n"
                    "    start = dist.get_rank(group) * k\n"
                    "    softmax = full.softmax(dim=1)\n"
                    "    local = targets - start\n"
                    "    mine = (local >= 0) & (local < k)\n"
                    "    index = torch.where(mine, local, 0).unsqueeze(1)\n"
                    "    ctx.save_for_backward(softmax[:, start:start + k], index, mine)\n"
                    "    return F.cross_entropy(full, targets)\n"),)),
    Flaw("vocab_parallel", "incoming_gradient_ignored", clause="loss-backward", case="vp-loss",
         why="returns (softmax - one_hot) / N without multiplying by the incoming gradient.",
         expect="the gradient of the logits differs",
         patch=((BACKWARD, "        return g / softmax.shape[0], None, None\n"),)),
    Flaw("vocab_parallel", "backward_all_reduces", clause="loss-backward",
         case="vp-collectives",
         why="all-reduces the gradient's row sums in the backward (to be safe): communication "
             "the backward does not need.",
         expect="its backward issued all_reduce",
         patch=((BACKWARD, "        check = g.sum(dim=1)\n        dist.all_reduce(check)\n"
                           "        return g * (grad / softmax.shape[0]), None, None\n"),)),
    Flaw("vocab_parallel", "logits_shifted_in_place", clause="loss-inputs", case="vp-loss",
         why="subtracts the maxima from logits.detach() in place: detach shares the storage, "
             "so the caller's logits change.",
         expect="modified the logits or the targets in place",
         patch=(("        exp = (logits.detach() - row_max.unsqueeze(1)).exp()\n",
                 "        shifted = logits.detach()\n        shifted -= row_max.unsqueeze(1)\n"
                 "        exp = shifted.exp()\n"),
                (TARGET, "        target_logit = (shifted.gather(1, index).squeeze(1) + row_max) "
                         "* mine\n"))),
    Flaw("vocab_parallel", "loss_in_float64", clause="loss-returns", case="vp-loss",
         why="computes the loss in float64 whatever the logits' dtype and returns it so.",
         expect="expected a 0-dim tensor of the logits' dtype (torch.float32)",
         patch=(("        loss = (sum_exp.log() + row_max - target_logit).mean()\n",
                 "        loss = (sum_exp.log() + row_max - target_logit).double().mean()\n"),)),
]

MERGE = ("    new = torch.logaddexp(lse, lse_b)\n    ref = _finite(new)\n"
         "    w, w_b = torch.exp(lse - ref), torch.exp(lse_b - ref)\n"
         "    return out * w.unsqueeze(-1) + out_b * w_b.unsqueeze(-1), new\n")
PAIRS_SKIP = "            if q_last < k_first:\n                continue\n"
FWD_SEND = ("            if step < c - 1:\n"
            "                buf = q.new_empty(B, H, len(positions[(src - 1) % c]), 2 * hd)\n"
            "                reqs = [dist.isend(held, nxt), dist.irecv(buf, prv)]\n")
FWD_WAIT = ("            if step < c - 1:\n                for req in reqs:\n"
            "                    req.wait()\n                held = buf\n")
FWD_BLOCK = ("                out_b, lse_b = block_forward(q[:, :, qs], held[:, :, ks, :hd],\n"
             "                                             held[:, :, ks, hd:], mask)\n")

FLAWS += [
    # ------------------------------------------------------------------ ring attention
    Flaw("ring_attention", "merge_naive_exp", clause="merge", case="ring-pure",
         why="merges with the plain sums of exponentials, exp(lse) + exp(lse_b): a side 800 "
             "above overflows.",
         expect="merge_blocks: the merged log-sum-exp is off",
         patch=((MERGE, "    total = torch.exp(lse) + torch.exp(lse_b)\n"
                        "    new = torch.log(total)\n"
                        "    return (out * torch.exp(lse).unsqueeze(-1) + out_b * "
                        "torch.exp(lse_b).unsqueeze(-1)) / total.unsqueeze(-1), new\n"),)),
    Flaw("ring_attention", "merge_nan_when_both_empty", clause="merge-inf", case="ring-pure",
         why="weights each side by exp(its lse - the merged lse) without guarding -inf: a row "
             "no key of either side is visible to becomes NaN.",
         expect="merge_blocks: the merged output differs from one process by nan",
         patch=((MERGE, "    new = torch.logaddexp(lse, lse_b)\n"
                        "    w, w_b = torch.exp(lse - new), torch.exp(lse_b - new)\n"
                        "    return out * w.unsqueeze(-1) + out_b * w_b.unsqueeze(-1), new\n"),)),
    Flaw("ring_attention", "merge_in_place", clause="merge-inf", case="ring-pure",
         why="scales out in place and adds the other side into it.",
         expect="merge_blocks modified its inputs",
         patch=((MERGE, "    new = torch.logaddexp(lse, lse_b)\n    ref = _finite(new)\n"
                        "    out.mul_(torch.exp(lse - ref).unsqueeze(-1))\n"
                        "    out.add_(out_b * torch.exp(lse_b - ref).unsqueeze(-1))\n"
                        "    return out, new\n"),)),
    Flaw("ring_attention", "balanced_not_mirrored", clause="balance", case="ring-pure",
         why="gives rank r chunks r and c + r: two chunks, but not one early and one late.",
         expect="balanced_positions(13, 3) returned",
         patch=(("    return [torch.cat([chunks[r], chunks[2 * c - 1 - r]]) for r in range(c)]\n",
                 "    return [torch.cat([chunks[r], chunks[c + r]]) for r in range(c)]\n"),)),
    Flaw("ring_attention", "balanced_short_sequence", clause="balanced-errors", case="ring-pure",
         why="does not check S >= 2c: a sequence too short gives ranks empty chunks.",
         expect="balanced_positions(5, 3) returned",
         patch=(("    if c < 1 or S < 2 * c:\n", "    if c < 1:\n"),)),
    Flaw("ring_attention", "balanced_wrong_order", clause="balanced", case="ring-pure",
         why="puts the late chunk first.",
         expect="expected [[0, 1, 2, 11, 12]",
         patch=(("    return [torch.cat([chunks[r], chunks[2 * c - 1 - r]]) for r in range(c)]\n",
                 "    return [torch.cat([chunks[2 * c - 1 - r], chunks[r]]) for r in range(c)]\n"),)),
    Flaw("ring_attention", "pairs_not_left_out", clause="pairs-causal", case="ring-pure",
         why="keeps the pairs no query sees, with a mask of False everywhere.",
         expect="block_pairs(tensor([0, 1, 2, 7, 8]), tensor([3, 4, 5, 6]), True) returned",
         patch=((PAIRS_SKIP, ""),)),
    Flaw("ring_attention", "pairs_always_masked", clause="pairs-mask", case="ring-pure",
         why="always builds the mask, also where every query sees every key.",
         expect="mask None where every query sees every key",
         patch=(("            mask = None if q_first >= k_last else q_pos[qs, None] >= "
                 "k_pos[None, ks]\n",
                 "            mask = q_pos[qs, None] >= k_pos[None, ks]\n"),)),
    Flaw("ring_attention", "pairs_runs_when_not_causal", clause="pairs-full", case="ring-pure",
         why="cuts non-causal blocks into runs too: the right products, not one.",
         expect="block_pairs(tensor([0, 1, 5, 6]), tensor([2, 3, 9]), False) returned",
         patch=(("    if not causal:\n        return [(slice(None), slice(None), None)]\n",
                 "    if not causal:\n        return [(qs, ks, None) for qs in contiguous_runs(q_pos)\n"
                 "                for ks in contiguous_runs(k_pos)]\n"),)),
    Flaw("ring_attention", "outputs_added", clause="values", case="ring-values",
         why="adds each block's output to the running output instead of merging them by their "
             "log-sum-exps.",
         expect="the output differs from one process",
         patch=(("                out[:, :, qs], lse[:, :, qs] = merge_blocks(out[:, :, qs], "
                 "lse[:, :, qs],\n"
                 "                                                            out_b, lse_b)\n",
                 "                out[:, :, qs] += out_b\n"
                 "                lse[:, :, qs] = torch.logaddexp(lse[:, :, qs], lse_b)\n"),)),
    Flaw("ring_attention", "last_block_forgotten", clause="forward-ring", case="ring-values",
         why="runs c - 1 steps: the block that arrives last is never computed with.",
         expect="the output differs from one process",
         patch=(("        held = torch.cat([k, v], dim=-1)\n        for step in range(c):\n",
                 "        held = torch.cat([k, v], dim=-1)\n        for step in range(max(c - 1, 1)):\n"),)),
    Flaw("ring_attention", "gradient_not_brought_home", clause="backward-ring",
         case="ring-values",
         why="stops passing after the last step's compute: each rank returns the gradient of "
             "the block it holds then, its neighbour's, not its own.",
         expect="the backward failed",
         patch=(("            if c > 1:\n                send = dist.isend(held, nxt)\n"
                 "                recv.wait()\n                send.wait()\n                held = buf\n",
                 "            if c > 1 and step < c - 1:\n                send = dist.isend(held, nxt)\n"
                 "                recv.wait()\n                send.wait()\n                held = buf\n"),
                ("            if c > 1:\n                buf = q.new_empty(B, H, len(positions[(src - 1) % c]), 4 * hd)\n",
                 "            if c > 1 and step < c - 1:\n                buf = q.new_empty(B, H, len(positions[(src - 1) % c]), 4 * hd)\n"))),
    Flaw("ring_attention", "computes_before_sending", clause="overlap", case="ring-messages",
         why="computes with the held block first and only then passes it on: correct, but the "
             "transfer never overlaps the arithmetic.",
         expect="the first block was computed before it was sent on",
         patch=((FWD_SEND, ""),
                (FWD_WAIT, FWD_SEND + "                for req in reqs:\n"
                           "                    req.wait()\n                held = buf\n"))),
    Flaw("ring_attention", "ring_reversed", clause="messages", case="ring-messages",
         why="sends to the previous rank and receives from the next: the blocks travel the "
             "other way round from the positions the loop assumes.",
         expect="not the ring's next rank",
         patch=(("                reqs = [dist.isend(held, nxt), dist.irecv(buf, prv)]\n",
                 "                reqs = [dist.isend(held, prv), dist.irecv(buf, nxt)]\n"),)),
    Flaw("ring_attention", "barrier_each_step", clause="messages", case="ring-messages",
         why="adds a dist.barrier() at every step to keep the ring in lock-step.",
         expect="the forward called ['barrier']",
         patch=((FWD_SEND, "            dist.barrier()\n" + FWD_SEND),)),
    Flaw("ring_attention", "keeps_received_blocks", clause="memory", case="ring-memory",
         why="keeps every received block on ctx (for a backward that would not need to pass "
             "them again), while the backward still passes them.",
         expect="the forward keeps",
         patch=(("        held = torch.cat([k, v], dim=-1)\n        for step in range(c):\n",
                 "        held = torch.cat([k, v], dim=-1)\n        ctx.blocks = []\n"
                 "        for step in range(c):\n            ctx.blocks.append(held)\n"),)),
    Flaw("ring_attention", "own_block_arithmetic", clause="block-functions", case="ring-work",
         why="computes the blocks with its own copy of block_forward's arithmetic.",
         expect="block_forward was never called",
         patch=((FWD_BLOCK, "                out_b, lse_b = _my_block(q[:, :, qs], held[:, :, ks, :hd],\n"
                            "                                         held[:, :, ks, hd:], mask)\n"),
                ("def ring_peers(group):\n",
                 "def _my_block(q, k, v, mask=None):\n"
                 "    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5\n"
                 "    if mask is not None:\n        scores = scores.masked_fill(~mask, NEG_INF)\n"
                 "    lse = torch.logsumexp(scores, dim=-1)\n"
                 "    return torch.exp(scores - _finite(lse).unsqueeze(-1)) @ v, lse\n\n\n"
                 "def ring_peers(group):\n"))),
    Flaw("ring_attention", "whole_blocks_masked", clause="pairs-causal", case="ring-work",
         why="computes each held block whole with a causal mask (skipping only blocks no query "
             "sees) instead of block_pairs' pairs: right values, but the masked pairs are "
             "computed too.",
         expect="leave out the pairs in which no query sees any key",
         patch=(("            for qs, ks, mask in block_pairs(q_pos, positions[src], causal):\n"
                 "                out_b, lse_b",
                 "            k_pos = positions[src]\n"
                 "            whole = [(slice(None), slice(None), (q_pos[:, None] >= k_pos[None, :])\n"
                 "                      if causal else None)]\n"
                 "            if causal and not bool((q_pos[:, None] >= k_pos[None, :]).any()):\n"
                 "                whole = []\n"
                 "            for qs, ks, mask in whole:\n"
                 "                out_b, lse_b"),)),
]

STUB = "{}\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"    # (as released)
FLAWS.append(
    Flaw("ring_attention", "merge_in_place_ring_unfinished", clause="merge-inf",
         case="ring-pure",
         why="the same in-place merge, with RingAttention still as released: a finished piece's "
             "failure is shown, not hidden behind the unfinished ones (issue 39).",
         expect="merge_blocks modified its inputs",
         patch=((MERGE, "    new = torch.logaddexp(lse, lse_b)\n    ref = _finite(new)\n"
                        "    out.mul_(torch.exp(lse - ref).unsqueeze(-1))\n"
                        "    out.add_(out_b * torch.exp(lse_b - ref).unsqueeze(-1))\n"
                        "    return out, new\n"),
                Def("RingAttention.forward", STUB.format(
                    "@staticmethod\ndef forward(ctx, q, k, v, positions, group, causal):")),
                Def("RingAttention.backward", STUB.format(
                    "@staticmethod\ndef backward(ctx, dout):")))))

GATHER_BWD = ("        t = dist.get_world_size(ctx.group)\n"
              "        out = grad.new_empty((grad.shape[0] // t,) + tuple(grad.shape[1:]))\n"
              "        dist.reduce_scatter_tensor(out, grad.contiguous(), group=ctx.group)\n"
              "        return out, None\n")
SCATTER_FWD = ("        ctx.group = group\n        t = dist.get_world_size(group)\n"
               "        out = x.new_empty((x.shape[0] // t,) + tuple(x.shape[1:]))\n"
               "        dist.reduce_scatter_tensor(out, x.contiguous(), group=group)\n"
               "        return out\n")
SP_FORWARD = ("        return x + ReduceScatterToSequence.apply(F.linear(h, self.w2), self.group) "
              "+ self.b2\n")
SP_GRADS = ("    for p in module.replicated:\n"
            "        dist.all_reduce(p.grad, group=module.group)\n")

FLAWS += [
    # ------------------------------------------------------------------ sequence parallelism
    Flaw("sequence_parallel", "gather_backward_own_rows", clause="gather-backward",
         case="sp-values",
         why="the all-gather's backward keeps this rank's rows of its own gradient, without "
             "summing the other ranks' gradients of them.",
         expect="the gradient of x differs",
         patch=((GATHER_BWD, "        t = dist.get_world_size(ctx.group)\n"
                             "        r = dist.get_rank(ctx.group)\n"
                             "        k = grad.shape[0] // t\n"
                             "        return grad[r * k:(r + 1) * k].clone(), None\n"),)),
    Flaw("sequence_parallel", "gather_backward_all_reduce", clause="gather-backward",
         case="sp-collectives",
         why="the all-gather's backward all-reduces the gradient and keeps its rows: right "
             "values, but the all-reduce sequence parallelism replaces.",
         expect="the backward issued",
         patch=((GATHER_BWD, "        t = dist.get_world_size(ctx.group)\n"
                             "        r = dist.get_rank(ctx.group)\n"
                             "        full = grad.clone()\n"
                             "        dist.all_reduce(full, group=ctx.group)\n"
                             "        k = grad.shape[0] // t\n"
                             "        return full[r * k:(r + 1) * k].clone(), None\n"),)),
    Flaw("sequence_parallel", "gather_by_global_rank_order", clause="gather",
         case="sp-values",
         why="concatenates the rows along the batch dimension instead of the sequence.",
         expect="differs from one process",
         patch=(("        out = x.new_empty((t * x.shape[0],) + tuple(x.shape[1:]))\n"
                 "        dist.all_gather_into_tensor(out, x.contiguous(), group=group)\n"
                 "        return out\n",
                 "        parts = [torch.empty_like(x) for _ in range(t)]\n"
                 "        dist.all_gather(parts, x.contiguous(), group=group)\n"
                 "        return torch.cat(parts, dim=1).reshape((t * x.shape[0],) + "
                 "tuple(x.shape[1:]))\n"),)),
    Flaw("sequence_parallel", "scatter_as_all_reduce", clause="scatter",
         case="sp-collectives",
         why="all-reduces the partial sums and keeps its rows: right values, an all-reduce "
             "where the reduce-scatter goes.",
         expect="the forward issued",
         patch=((SCATTER_FWD, "        ctx.group = group\n        t = dist.get_world_size(group)\n"
                              "        r = dist.get_rank(group)\n"
                              "        full = x.clone()\n"
                              "        dist.all_reduce(full, group=group)\n"
                              "        k = x.shape[0] // t\n"
                              "        return full[r * k:(r + 1) * k].clone()\n"),)),
    Flaw("sequence_parallel", "scatter_backward_own_rows", clause="scatter-backward",
         case="sp-values",
         why="the reduce-scatter's backward places its own gradient in its rows and zeros in "
             "the others, instead of gathering every rank's.",
         expect="differs from one process",
         patch=(("        out = grad.new_empty((t * grad.shape[0],) + tuple(grad.shape[1:]))\n"
                 "        dist.all_gather_into_tensor(out, grad.contiguous(), group=ctx.group)\n"
                 "        return out, None\n",
                 "        r = dist.get_rank(ctx.group)\n"
                 "        out = grad.new_zeros((t * grad.shape[0],) + tuple(grad.shape[1:]))\n"
                 "        out[r * grad.shape[0]:(r + 1) * grad.shape[0]] = grad\n"
                 "        return out, None\n"),)),
    Flaw("sequence_parallel", "bias_before_reduce_scatter", clause="bias-once",
         case="sp-values",
         why="adds fc2's bias before the reduce-scatter: it is counted t times.",
         expect="the output differs",
         patch=((SP_FORWARD, "        return x + ReduceScatterToSequence.apply(F.linear(h, self.w2, "
                             "self.b2), self.group)\n"),)),
    Flaw("sequence_parallel", "residual_of_the_whole", clause="rows", case="sp-values",
         why="adds the residual to the whole gathered sequence and reduce-scatters it: the "
             "residual is counted t times.",
         expect="the output differs",
         patch=(("        h = GatherFromSequence.apply(self.norm(x), self.group)\n",
                 "        xs = GatherFromSequence.apply(x, self.group)\n"
                 "        h = self.norm(xs)\n"),
                (SP_FORWARD, "        return ReduceScatterToSequence.apply(xs + F.linear(h, "
                             "self.w2), self.group) + self.b2\n"))),
    Flaw("sequence_parallel", "replicated_not_summed", clause="replicated",
         case="sp-replicated",
         why="leaves the replicated parameters' gradients as the backward made them: each "
             "rank's rows only.",
         expect="after sequence_parallel_grads, the gradient of norm.weight",
         patch=((SP_GRADS, "    return None\n"),)),
    Flaw("sequence_parallel", "replicated_averaged", clause="replicated",
         case="sp-replicated",
         why="averages the replicated gradients over the group (as data parallelism would).",
         expect="after sequence_parallel_grads",
         patch=((SP_GRADS, "    t = dist.get_world_size(module.group)\n"
                           "    for p in module.replicated:\n"
                           "        dist.all_reduce(p.grad, group=module.group)\n"
                           "        p.grad /= t\n"),)),
    Flaw("sequence_parallel", "every_gradient_summed", clause="replicated",
         case="sp-collectives",
         why="sums the gradient of every parameter over the group, the shards' too.",
         expect="sequence_parallel_grads issued",
         patch=((SP_GRADS, "    for p in module.replicated:\n"
                           "        dist.all_reduce(p.grad, group=module.group)\n"
                           "    for p in (module.w1, module.b1, module.w2):\n"
                           "        g = p.grad.clone()\n"
                           "        dist.all_reduce(g, group=module.group)\n"),)),
    Flaw("sequence_parallel", "block_all_reduce", clause="no-all-reduce", case="sp-collectives",
         why="adds an all-reduce of the output's norm in the forward, to check the ranks agree.",
         expect="the forward issued",
         patch=((SP_FORWARD, "        out = x + ReduceScatterToSequence.apply(F.linear(h, "
                             "self.w2), self.group) + self.b2\n"
                             "        probe = out.detach().norm().reshape(1)\n"
                             "        dist.all_reduce(probe, group=self.group)\n"
                             "        return out\n"),)),

    # ------------------------------------------------------------------ the composed step
    Flaw("composed_step", "copy_backward_identity", clause="copy-backward", case="step-values",
         why="gives CopyToGroup the identity backward too (no all-reduce of the gradient).",
         expect="differs from one process",
         patch=((COPY_BACKWARD, "        return grad, None\n"),)),
    Flaw("composed_step", "copy_forward_all_reduce", clause="copy-forward", case="step-values",
         why="sums the activation over the group in CopyToGroup's forward, as g does.",
         expect="returned the loss",
         patch=((COPY_FORWARD, "        ctx.group = group\n        out = x.clone()\n"
                               "        dist.all_reduce(out, group=group)\n"
                               "        return out\n"),)),
    Flaw("composed_step", "bias_before_reduce", clause="tp-bias-once", case="step-values",
         why="adds the output projection's bias on every rank before the all-reduce: t times.",
         expect="returned the loss",
         patch=((PROJ, "        x = x + ReduceFromGroup.apply(a + self.b_proj, self.group)\n"),)),
    Flaw("composed_step", "mlp_without_copy", clause="tp-block", case="step-values",
         why="forgets f before fc1: the MLP's input gradient stays each rank's part.",
         expect="the gradient of blocks.1.ln2.bias",
         patch=(("        h = CopyToGroup.apply(self.ln2(x), self.group)\n",
                 "        h = self.ln2(x)\n"),)),
    Flaw("composed_step", "head_without_copy", clause="stage-head", case="step-values",
         why="feeds the norm's output to the head's rows without f: the final norm's gradient "
             "is each rank's part only.",
         expect="the gradient of norm.bias",
         patch=((HEAD, "            x = F.linear(self.norm(x), self.head)\n"),)),
    Flaw("composed_step", "grads_summed", clause="dp-average", case="step-values",
         why="sums the gradients over the data-parallel group without dividing by dp.",
         expect="the gradient of",
         patch=(("        p.grad /= dp\n", ""),)),
    Flaw("composed_step", "loss_over_world", clause="neighbours", case="step-collectives",
         why="brings the loss to every rank with one all-reduce over the world (the other "
             "stages add 0), divided by dp * tp: the right number, over a group that is not "
             "the mesh's.",
         expect="all_reduce over ranks [0, 1, 2, 3, 4, 5, 6, 7]",
         patch=((LOSS_SHARE, "    dist.all_reduce(value)\n"
                             "    value /= mesh.sizes[\"tp\"]\n"),)),
    Flaw("composed_step", "replica_whole_batch", clause="replica-rows", case="step-messages",
         why="runs the whole batch on every replica: the same gradients, dp times the work "
             "and the messages.",
         expect="numbers)",
         patch=(("    tokens, targets = tokens[d * b:(d + 1) * b], targets[d * b:(d + 1) * b]\n",
                 "    b = tokens.shape[0]\n"),)),
    Flaw("composed_step", "replica_first_rows", clause="replica-rows", case="step-values",
         why="gives every replica the first B/dp rows.",
         expect="returned the loss",
         patch=(("    tokens, targets = tokens[d * b:(d + 1) * b], targets[d * b:(d + 1) * b]\n",
                 "    tokens, targets = tokens[:b], targets[:b]\n"),)),
    Flaw("composed_step", "inputs_rolled", clause="inputs", case="step-values",
         why="rolls its replica's rows to the front of the given batch in place, then takes "
             "the first rows: the right rows, and the caller's batch changed.",
         expect="modified the tokens or targets",
         patch=(("    tokens, targets = tokens[d * b:(d + 1) * b], targets[d * b:(d + 1) * b]\n",
                 "    tokens[:] = tokens.roll(-d * b, 0)\n"
                 "    targets[:] = targets.roll(-d * b, 0)\n"
                 "    tokens, targets = tokens[:b], targets[:b]\n"),)),
    Flaw("composed_step", "loss_last_stage_only", clause="returns", case="step-values",
         why="returns each stage's own loss: 0 on the stages that are not the last.",
         expect="returned the loss",
         patch=((LOSS_SHARE, ""),)),
    Flaw("composed_step", "loss_tensor", clause="returns", case="step-values",
         why="returns the loss as a 0-dim tensor.",
         expect="expected a Python float",
         patch=(("    return float(value) / dp\n", "    return value.reshape(()) / dp\n"),)),
    Flaw("composed_step", "loss_by_messages", clause="neighbours", case="step-messages",
         why="passes the loss back along the pipeline with point-to-point messages instead "
             "of a broadcast over the pipeline group.",
         expect="the messages were",
         patch=((LOSS_SHARE, "    dist.all_reduce(value, group=mesh.groups[\"dp\"])\n"
                             "    if mesh.next is not None:\n"
                             "        dist.recv(value, mesh.next)\n"
                             "    if mesh.prev is not None:\n"
                             "        dist.send(value, mesh.prev)\n"),)),
    Flaw("composed_step", "gathered_logits", clause="tp-collectives", case="step-collectives",
         why="gathers the full logits over the tensor-parallel group and takes F.cross_entropy "
             "of them: the right loss, and the (b * S, V) logits on every rank.",
         expect="over the tensor-parallel group",
         patch=((LOSS, "        parts = [torch.empty_like(y) for _ in range(mesh.sizes[\"tp\"])]\n"
                       "        dist.all_gather(parts, y.contiguous(), group=mesh.groups[\"tp\"])\n"
                       "        parts[mesh.coords[\"tp\"]] = y\n"
                       "        loss = F.cross_entropy(torch.cat(parts, -1).flatten(0, 1), "
                       "targets.flatten())\n"),)),
    Flaw("composed_step", "batch_cached", clause="state", case="step-values",
         why="keeps its replica's rows on the stage from the first call and reuses them.",
         expect="(the second step)",
         patch=(("    tokens, targets = tokens[d * b:(d + 1) * b], targets[d * b:(d + 1) * b]\n",
                 "    if not hasattr(stage, \"rows\"):\n"
                 "        stage.rows = tokens[d * b:(d + 1) * b], targets[d * b:(d + 1) * b]\n"
                 "    tokens, targets = stage.rows\n"),)),
    Flaw("composed_step", "middle_sends_output_grad", clause="pipeline", case="step-values",
         why="on a middle stage, sends back the gradient it received for its output instead of "
             "its input's gradient (the same shape).",
         expect="mesh 2x4x1",
         patch=(("        dist.send(x.grad, mesh.prev)\n",
                 "        dist.send(grad if mesh.next is not None else x.grad, mesh.prev)\n"),)),
]
