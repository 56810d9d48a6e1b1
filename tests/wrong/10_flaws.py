"""Known-wrong files of notebook 10, as patches of the solution (see tests/flaws.py): one flaw
each, naming the clause of ``exercise_utils/bonus_model_parallel/requirements.py`` it breaks and
the check case that must reject it."""
from flaws import Def, Flaw

F_BACKWARD = ("        grad = grad.clone(memory_format=torch.contiguous_format)\n"
              "        dist.all_reduce(grad)\n        return grad\n")
G_FORWARD = ("        out = x.clone(memory_format=torch.contiguous_format)\n"
             "        dist.all_reduce(out)\n        return out\n")
COL_ROWS = "        rows = slice(rank * k, (rank + 1) * k)\n"
ROW_BIAS = "        bias = None if linear.bias is None else linear.bias.detach().clone()\n"
ROW_FORWARD = ("        y = ReduceFromParallel.apply(F.linear(x, self.weight))\n"
               "        return y if self.bias is None else y + self.bias\n")
ATTN_FORWARD = ("        x = CopyToParallel.apply(x)\n        return self.o(attention_heads("
                "self.q(x), self.k(x), self.v(x), self.n_heads, self.causal))\n")
STUB = "{}\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"    # (as released)
GPIPE = "    return [(\"F\", j) for j in range(m)] + [(\"B\", j) for j in reversed(range(m))]\n"
WARM = "    warm = min(p - stage - 1, m)\n"
MAIN_LOOP = "    for kind, j in order:\n        if kind == \"F\":\n            if first:\n"
GRAD_SEND = "                isend(x.grad.contiguous(), s - 1, tag_gradient(j))\n"
SCALED = "                scaled = loss_fn(out, t_mbs[j]) * (t_mbs[j].shape[0] / n)\n"

FLAWS = [
    # ------------------------------------------------------------------ f and g
    Flaw("tensor_parallel", "f_backward_identity", clause="f", case="tp-f-g",
         why="f's backward returns the gradient unchanged (the all-reduce put in g's backward "
             "instead, or forgotten): each rank keeps only its partial gradient of x.",
         expect="CopyToParallel.apply(x): the gradient of x is off",
         patch=((F_BACKWARD, "        return grad\n"),)),
    Flaw("tensor_parallel", "f_in_place", clause="f-copy", case="tp-f-g",
         why="f's backward all-reduces the incoming gradient in place: autograd's gradient "
             "(here the caller's own tensor) is overwritten.",
         expect="modified the incoming gradient in place",
         patch=((F_BACKWARD, "        dist.all_reduce(grad)\n        return grad\n"),)),
    Flaw("tensor_parallel", "g_backward_all_reduces", clause="g", case="tp-f-g",
         why="g's backward all-reduces too (by symmetry with its forward): each gradient is N "
             "times too large.",
         expect="ReduceFromParallel.apply(x): the gradient of x is off",
         patch=(("    def backward(ctx, grad):\n        return grad\n",
                 "    def backward(ctx, grad):\n        grad = grad.clone()\n"
                 "        dist.all_reduce(grad)\n        return grad\n"),)),
    Flaw("tensor_parallel", "g_in_place", clause="g-new", case="tp-f-g",
         why="g all-reduces its input in place and returns it: the caller's tensor is "
             "overwritten with the sum.",
         expect="modified x in place",
         patch=((G_FORWARD, "        dist.all_reduce(x)\n        return x\n"),)),
    # ------------------------------------------------------------------ the layers
    Flaw("tensor_parallel", "column_strided_rows", clause="column-shard", case="tp-layers",
         why="takes every N-th row from row r (rows r, r+N, r+2N, ...) instead of the "
             "contiguous block [r*k, (r+1)*k): the heads and the hidden features no longer "
             "line up with the row-parallel layer's columns.",
         expect="ColumnParallelLinear.from_linear(Linear(in, out, bias=True)).weight",
         patch=((COL_ROWS, "        rows = slice(rank, None, n)\n"),)),
    Flaw("tensor_parallel", "row_bias_divided", clause="row-shard", case="tp-layers",
         why="gives each rank bias / N (so that the N copies add up to one bias): the output "
             "is right, but every rank's bias gets the full gradient and moves N times too "
             "far at each step.",
         expect="RowParallelLinear.from_linear(Linear(in, out, bias=True)).bias",
         patch=((ROW_BIAS, "        bias = None if linear.bias is None else "
                           "linear.bias.detach() / n\n"),)),
    Flaw("tensor_parallel", "shard_not_copied", clause="copy", case="tp-layers",
         why="keeps a slice of the layer's weight without .clone(): a view, so later changes "
             "to the single-process layer show in the shard.",
         expect="it is a view of the layer's tensor",
         patch=(("        return cls(linear.weight.detach()[rows].clone(), bias)\n",
                 "        return cls(linear.weight.detach()[rows], bias)\n"),)),
    Flaw("tensor_parallel", "heads_not_checked", clause="not-divisible", case="tp-layers",
         why="does not check that the heads divide by N: with 3 heads on 2 ranks q, k and v "
             "still split (6 features), and each rank silently computes 3 // 2 = 1 head.",
         expect="ParallelAttention.from_attention on a layer whose split width does not divide",
         patch=(("        if attn.n_heads % n:\n            raise ValueError(f\"n_heads={attn.n_heads} "
                 "is not divisible by {n} ranks\")\n", ""),)),
    Flaw("tensor_parallel", "forward_needs_bias", clause="column-shard", case="tp-layers",
         why="adds the bias in the column-parallel forward without asking whether there is one: "
             "a layer without a bias fails.",
         expect="raised TypeError",
         patch=(("        return F.linear(x, self.weight, self.bias)\n",
                 "        return x @ self.weight.T + self.bias\n"),)),
    Flaw("tensor_parallel", "shards_the_layer_itself", clause="leave-source", case="tp-layers",
         why="cuts the layer's own weight down to the shard (to free memory) and builds the "
             "parallel layer from a copy of it: the caller's layer is no longer the whole layer.",
         expect="changed the layer it was given",
         patch=(("        return cls(linear.weight.detach()[rows].clone(), bias)\n",
                 "        linear.weight.data = linear.weight.detach()[rows].clone()\n"
                 "        return cls(linear.weight.detach().clone(), bias)\n"),)),
    Flaw("tensor_parallel", "model_width_checked", clause="hidden-width", case="tp-layers",
         why="refuses an MLP whose model width d does not divide by N, although only the hidden "
             "width is split.",
         expect="only the hidden width is split",
         patch=(("        return cls(ColumnParallelLinear.from_linear(mlp.fc1), "
                 "copy.deepcopy(mlp.act),\n",
                 "        if mlp.fc1.in_features % dist.get_world_size():\n"
                 "            raise ValueError(\"d is not divisible by N\")\n"
                 "        return cls(ColumnParallelLinear.from_linear(mlp.fc1), "
                 "copy.deepcopy(mlp.act),\n"),)),
    # ------------------------------------------------------------------ the blocks
    Flaw("tensor_parallel", "default_gelu", clause="mlp-act", case="tp-mlp-values",
         why="builds a new nn.GELU() instead of keeping the block's own activation.",
         expect="the output of the mlp block in float64 differs from one process",
         patch=(("copy.deepcopy(mlp.act)", "nn.GELU()"),)),
    Flaw("tensor_parallel", "sequences_only", clause="mlp-shape", case="tp-mlp-values",
         why="reads the input as (B, T, d): an input of rows of features (2-D) fails.",
         expect="raised ValueError in check case 'tp-mlp-values'",
         patch=(("        return self.fc2(self.act(self.fc1(CopyToParallel.apply(x))))\n",
                 "        B, T, d = x.shape\n"
                 "        return self.fc2(self.act(self.fc1(CopyToParallel.apply(x))))\n"),)),
    Flaw("tensor_parallel", "bias_before_all_reduce", clause="bias-once", case="tp-layers",
         why="adds the row-parallel layer's bias before the all-reduce: the sum counts it N "
             "times.",
         expect="the bias added once, after the all-reduce",
         patch=((ROW_FORWARD, "        return ReduceFromParallel.apply(F.linear(x, self.weight, "
                              "self.bias))\n"),)),
    Flaw("tensor_parallel", "bias_before_all_reduce_blocks_unfinished", clause="bias-once",
         case="tp-layers",
         why="the same bias bug, with the MLP and the attention still as released: a finished "
             "piece's failure is shown, not hidden behind the unfinished ones (issue 39).",
         expect="the bias added once, after the all-reduce",
         patch=((ROW_FORWARD, "        return ReduceFromParallel.apply(F.linear(x, self.weight, "
                              "self.bias))\n"),
                *(Def(name, STUB.format(head)) for name, head in (
                    ("ParallelMLP.from_mlp", "@classmethod\ndef from_mlp(cls, mlp):"),
                    ("ParallelMLP.forward", "def forward(self, x):"),
                    ("ParallelAttention.from_attention",
                     "@classmethod\ndef from_attention(cls, attn):"),
                    ("ParallelAttention.forward", "def forward(self, x):"))))),
    Flaw("tensor_parallel", "mlp_without_f", clause="mlp-one-plus-one", case="tp-collectives",
         why="the MLP has no f in front: the forward is right, but each rank's input gradient "
             "is only its partial one (no all-reduce in the backward).",
         expect="0 all-reduces in the backward of the mlp block",
         patch=(("        return self.fc2(self.act(self.fc1(CopyToParallel.apply(x))))\n",
                 "        return self.fc2(self.act(self.fc1(x)))\n"),)),
    Flaw("tensor_parallel", "global_head_count", clause="heads-split", case="tp-attention-values",
         why="keeps the global head count: each rank cuts its d/N features into H heads of "
             "the wrong size.",
         expect="the output of the attention block in float64 differs from one process",
         patch=(("                   attn.n_heads // n, attn.causal)\n",
                 "                   attn.n_heads, attn.causal)\n"),)),
    Flaw("tensor_parallel", "f_per_projection", clause="attention-one-plus-one",
         case="tp-collectives",
         why="puts an f in front of each of q, k and v: the values are right, but the "
             "backward all-reduces three gradients of x instead of one.",
         expect="3 all-reduces in the backward of the attention block",
         patch=((ATTN_FORWARD, "        q, k, v = (layer(CopyToParallel.apply(x)) for layer in "
                               "(self.q, self.k, self.v))\n"
                               "        return self.o(attention_heads(q, k, v, self.n_heads, "
                               "self.causal))\n"),)),
    Flaw("tensor_parallel", "row_in_float32", clause="float64", case="tp-layers",
         why="computes the row-parallel product in float32 (to save time) and adds the bias: "
             "the float64 block comes out with float32's precision.",
         expect="the size of float32's rounding",
         patch=((ROW_FORWARD, "        y = ReduceFromParallel.apply(F.linear(x.float(), "
                              "self.weight.float()))\n"
                              "        return y if self.bias is None else y + self.bias\n"),)),
    Flaw("tensor_parallel", "mlp_reuses_fc2_bias", clause="leave-mlp", case="tp-layers",
         why="every rank holds fc2's whole bias, so from_mlp hands the parallel fc2 the MLP's "
             "own bias Parameter instead of a copy: updating the parallel block changes the "
             "MLP it was built from, and its backward writes the MLP's bias.grad.",
         expect="`mlp` itself is left as it is",
         patch=(("        return cls(ColumnParallelLinear.from_linear(mlp.fc1), "
                 "copy.deepcopy(mlp.act),\n"
                 "                   RowParallelLinear.from_linear(mlp.fc2))\n",
                 "        fc2 = RowParallelLinear.from_linear(mlp.fc2)\n"
                 "        fc2.bias = mlp.fc2.bias       # whole on every rank: nothing to cut\n"
                 "        return cls(ColumnParallelLinear.from_linear(mlp.fc1), mlp.act, "
                 "fc2)\n"),)),
    Flaw("tensor_parallel", "attention_reuses_o_bias", clause="leave-attention",
         case="tp-layers",
         why="from_attention builds o with from_linear, then sets its bias to attn.o.bias (the "
             "same Parameter, not a copy): updating the parallel block changes attn.",
         expect="`attn` itself is left as it is",
         patch=(("        return cls(col(attn.q), col(attn.k), col(attn.v), "
                 "RowParallelLinear.from_linear(attn.o),\n",
                 "        o = RowParallelLinear.from_linear(attn.o)\n"
                 "        if attn.o.bias is not None:\n"
                 "            o.bias = attn.o.bias\n"
                 "        return cls(col(attn.q), col(attn.k), col(attn.v), o,\n"),)),
    # ------------------------------------------------------------------ schedules
    Flaw("schedules", "gpipe_interleaved", clause="gpipe", case="schedule-gpipe",
         why="runs each micro-batch's backward right after its forward: no pipelining at all.",
         expect="a backward before the last forward",
         patch=((GPIPE, "    return [op for j in range(m) for op in ((\"F\", j), (\"B\", j))]\n"),)),
    Flaw("schedules", "gpipe_tuple", clause="list", case="schedule-gpipe",
         why="returns a tuple of the ops.",
         expect="returned a tuple: expected a list",
         patch=((GPIPE, "    return tuple([(\"F\", j) for j in range(m)] + [(\"B\", j) for j in "
                        "reversed(range(m))])\n"),)),
    Flaw("schedules", "lists_not_tuples", clause="list", case="schedule-gpipe",
         why="returns each op as a list [kind, j].",
         expect="expected tuples (kind, j)",
         patch=((GPIPE, "    return [[\"F\", j] for j in range(m)] + [[\"B\", j] for j in "
                        "reversed(range(m))]\n"),)),
    Flaw("schedules", "cached_list", clause="list", case="schedule-1f1b",
         why="memoizes the orders (they never change) and returns the same list object each "
             "time: a caller that changes one changes them all.",
         expect="return a new list each call",
         patch=(("def one_f_one_b_order(num_stages, num_microbatches, stage):\n",
                 "import functools\n\n\n@functools.lru_cache(maxsize=None)\n"
                 "def one_f_one_b_order(num_stages, num_microbatches, stage):\n"),)),
    Flaw("schedules", "warm_up_off_by_one", clause="1f1b", case="schedule-1f1b",
         why="warms up with p - stage forwards instead of p - stage - 1.",
         expect="at most p - stage",
         patch=((WARM, "    warm = min(p - stage, m)\n"),)),
    Flaw("schedules", "warm_up_off_by_one_gpipe_unfinished", clause="1f1b",
         case="schedule-1f1b",
         why="the same 1F1B warm-up bug, with gpipe_order still as released: the finished "
             "schedule's failure is shown, not hidden behind the unfinished one (issue 39).",
         expect="at most p - stage",
         patch=((WARM, "    warm = min(p - stage, m)\n"),
                Def("gpipe_order", STUB.format(
                    "def gpipe_order(num_stages, num_microbatches, stage):")))),
    Flaw("schedules", "same_warm_up_everywhere", clause="in-flight", case="schedule-1f1b",
         why="warms up every stage with p - 1 forwards (as stage 0 does): later stages hold "
             "more micro-batches than they need.",
         expect="micro-batches in flight",
         patch=((WARM, "    warm = min(p - 1, m)\n"),)),
    Flaw("schedules", "bool_accepted", clause="errors", case="schedule-errors",
         why="checks the ranges by hand but not the types: True passes as 1, 2.0 as 2.",
         expect="expected ValueError",
         patch=(("    check_schedule_args(num_stages, num_microbatches, stage)\n    p, m = "
                 "num_stages, num_microbatches\n",
                 "    if num_stages < 1 or num_microbatches < 1 or not 0 <= stage < num_stages:\n"
                 "        raise ValueError(\"invalid arguments\")\n"
                 "    p, m = num_stages, num_microbatches\n"),)),
    # ------------------------------------------------------------------ pipeline_step
    Flaw("pipeline", "always_gpipe", clause="order", case="pp-order",
         why="ignores the order it is given and always runs GPipe: right gradients, but 1F1B's "
             "memory saving is gone.",
         expect="its order was",
         patch=((MAIN_LOOP, "    for kind, j in gpipe_order(p, m, s):\n        if kind == "
                            "\"F\":\n            if first:\n"),)),
    Flaw("pipeline", "gradient_to_wrong_peer", clause="neighbours", case="pp-messages",
         why="the last stage sends its gradients to stage 0 (the first stage) instead of the "
             "previous one.",
         expect="stage s talks only to its neighbouring stages",
         patch=((GRAD_SEND, "                isend(x.grad.contiguous(), 0 if last else s - 1, "
                            "tag_gradient(j))\n"),)),
    Flaw("pipeline", "extra_barrier", clause="messages", case="pp-messages",
         why="ends the step with a barrier, to be safe.",
         expect="a pipeline needs only point-to-point messages",
         patch=(("    for work, _ in sends:\n        work.wait()\n",
                 "    for work, _ in sends:\n        work.wait()\n    dist.barrier()\n"),)),
    Flaw("pipeline", "done_message", clause="messages", case="pp-messages",
         why="tells the previous stage with a one-element message that each backward is done.",
         expect="expected the gradients: one per micro-batch, nothing else",
         patch=((GRAD_SEND, GRAD_SEND + "                isend(torch.ones(1), s - 1, "
                            "tag_gradient(j) + 10**6)\n"),
                ("                grad, work = grads.pop(j)\n                work.wait()\n",
                 "                grad, work = grads.pop(j)\n                work.wait()\n"
                 "                irecv((1,), torch.float32, s + 1, tag_gradient(j) + 10**6)"
                 "[1].wait()\n"))),
    Flaw("pipeline", "loss_divided_by_m", clause="loss-scaling", case="pp-values",
         why="scales each micro-batch's loss by 1/m: exact only when the micro-batches are "
             "equal.",
         expect="scaled by n_j / n",
         patch=((SCALED, "                scaled = loss_fn(out, t_mbs[j]) / m\n"),)),
    Flaw("pipeline", "loss_arguments_swapped", clause="loss-scaling", case="pp-values",
         why="calls loss_fn(target, output): the same value for a symmetric loss such as the "
             "mean squared error, another loss and other gradients for any other.",
         expect="the output first",
         patch=((SCALED, "                scaled = loss_fn(t_mbs[j], out) * (t_mbs[j].shape[0] / n)\n"),)),
    Flaw("pipeline", "grads_zeroed", clause="accumulate", case="pp-accumulate",
         why="zeroes the stage's gradients at the start of every step.",
         expect="Gradients accumulate",
         patch=(("    m = check_order(order)\n",
                 "    m = check_order(order)\n    stage_module.zero_grad()\n"),)),
    Flaw("pipeline", "graphs_retained", clause="graph-freed", case="pp-memory",
         why="back-propagates with retain_graph=True (in case a later backward needs the "
             "graph): every micro-batch's saved activations stay alive until the step ends.",
         expect="micro-batches were alive at once",
         patch=(("            torch.autograd.backward(out, grad)\n",
                 "            torch.autograd.backward(out, grad, retain_graph=True)\n"
                 "            live[j + 1000] = (x, out)\n"),)),
    Flaw("pipeline", "inputs_kept", clause="inputs-freed", case="pp-memory",
         why="reads each micro-batch's input and output from its dict at the backward instead "
             "of taking them out, so the dict holds every micro-batch's input until the step "
             "ends: autograd freed the saved tensors, but the activations are all still there.",
         expect="still alive in the process after their backward",
         patch=(("            x, out = live.pop(j)\n", "            x, out = live[j]\n"),)),
    Flaw("pipeline", "losses_with_graph", clause="inputs-freed", case="pp-memory",
         why="keeps every micro-batch's scaled loss, graph and all, to add them up at the end: "
             "each loss's graph leads back to its micro-batch's input, which stays alive.",
         expect="still alive in the process after their backward",
         patch=(("                total += float(scaled.detach())\n",
                 "                losses.append(scaled)\n"),
                ("    return total if last else None\n",
                 "    return float(sum(losses)) if last else None\n"),
                ("    sends, headers, grads, live, total = [], {}, {}, {}, 0.0\n",
                 "    sends, headers, grads, live, total = [], {}, {}, {}, 0.0\n"
                 "    losses = []\n"))),
    Flaw("pipeline", "returns_tensor", clause="returns", case="pp-values",
         why="returns the loss as a tensor.",
         expect="as a Python float",
         patch=(("    return total if last else None\n",
                 "    return torch.tensor(total) if last else None\n"),)),
    Flaw("pipeline", "blocking_sends", clause="no-deadlock", case="pp-values",
         why="sends with blocking dist.send and posts a gradient's receive only when its "
             "backward is due: in 1F1B's steady state two neighbours each wait for the other.",
         expect="hung: a point-to-point deadlock: rank 0 waits in send to rank 1, rank 1 "
                "waits in send to rank 0", timeout=15,
         patch=(("        sends.append((dist.isend(t, dst=dst, tag=tag), t))     # keep t alive "
                 "until waited\n", "        dist.send(t, dst=dst, tag=tag)\n"),
                ("                grads[j] = irecv(out.shape, out.dtype, s + 1, tag_gradient(j))\n",
                 "                grads[j] = (out.shape, out.dtype)\n"),
                ("                grad, work = grads.pop(j)\n",
                 "                grad, work = irecv(*grads.pop(j), s + 1, tag_gradient(j))\n"))),
    Flaw("pipeline", "spins_on_wrong_tag", clause="no-deadlock", case="pp-values",
         why="polls a gradient's receive with `while not work.is_completed(): pass` and posts "
             "it with the activation's tag, which the next stage never sends back: stage s "
             "spins for ever while stage s+1 waits for its next activation.",
         expect="kept looping on the same few lines", timeout=8,
         patch=(("                grads[j] = irecv(out.shape, out.dtype, s + 1, tag_gradient(j))\n",
                 "                grads[j] = irecv(out.shape, out.dtype, s + 1, tag_activation(j))\n"),
                ("                grad, work = grads.pop(j)\n                work.wait()\n",
                 "                grad, work = grads.pop(j)\n"
                 "                while not work.is_completed():\n"
                 "                    pass\n"))),
]
