"""What notebook 10's exercises promise: their contracts, clause by clause, with the check cases
that hold each clause.

``CONTRACT[exercise]`` lists :class:`~exercise_utils.contract.Clause` rows: the Args / Returns /
Raises clauses of the docstrings of ``work/10_model_parallel.py`` (the functions and methods the
student writes) and the behavioural sentences of the notebook, word for word, and the cases of
:mod:`.checks` and :mod:`.checks_pp` that exercise them. Every case rejects at least one
known-wrong file of ``tests/wrong/10_flaws.py``, which names the clause it breaks
(``tests/test_requirements.py``, ``tests/test_checks.py``).

Used in 10_bonus_model_parallel.
"""
from ..contract import Clause

CONTRACT = {
    "tensor_parallel": [
        Clause("f", "Megatron's \"f\": identity in the forward pass, all-reduce (sum) of the "
               "gradient in the backward pass.", cases=("tp-f-g", "tp-collectives")),
        Clause("f-copy", "its backward returns the incoming gradient summed over the ranks by "
               "one ``dist.all_reduce`` (on a copy: never modify the incoming gradient in "
               "place).", cases=("tp-f-g",)),
        Clause("g", "Megatron's \"g\": all-reduce (sum) in the forward pass, identity in the "
               "backward pass.", cases=("tp-f-g",)),
        Clause("g-new", "returns a new tensor, the sum of ``x`` over the ranks (one "
               "``dist.all_reduce``; ``x`` itself is not modified)", cases=("tp-f-g",)),
        Clause("column-shard", "rank ``r`` holds rows ``[r*k, (r+1)*k)`` of the full weight "
               "(``weight``: ``(k, in_features)``) and the same entries of the bias (``bias``: "
               "``(k,)``, None if the layer has none).", cases=("tp-layers", "tp-mlp-values")),
        Clause("row-shard", "rank ``r`` holds columns ``[r*k, (r+1)*k)`` of the full weight "
               "(``weight``: ``(out_features, k)``) and the whole bias (``bias``: "
               "``(out_features,)``, None if the layer has none).",
               cases=("tp-layers", "tp-attention-values")),
        Clause("copy", "This rank's shard of ``linear`` (a copy, of its dtype; the new "
               "parameters require grad;", cases=("tp-layers",)),
        Clause("leave-source", "``linear`` itself is left as it is", cases=("tp-layers",)),
        Clause("leave-mlp", "``mlp`` itself is left as it is", cases=("tp-layers",)),
        Clause("leave-attention", "``attn`` itself is left as it is", cases=("tp-layers",)),
        Clause("not-divisible", "`ValueError` from each of the four `from_*` methods when the "
               "split width does not divide by N", cases=("tp-layers",)),
        Clause("hidden-width", "the hidden width ``h`` not divisible by N.",
               cases=("tp-layers",)),
        Clause("mlp-act", "any module with ``fc1``, an elementwise ``act`` without parameters "
               "and ``fc2``, computing ``fc2(act(fc1(x)))``", cases=("tp-mlp-values",)),
        Clause("mlp-shape", "``forward(x)``: ``x`` is ``(..., d)``, the same on every rank",
               cases=("tp-mlp-values",)),
        Clause("bias-once", "The bias is added once, after the all-reduce (adding it before "
               "would count it N times), so every rank's ``bias.grad`` is the full layer's "
               "bias gradient.", cases=("tp-layers", "tp-mlp-values")),
        Clause("mlp-one-plus-one", "returns ``(..., d)``, the full MLP output, the same on "
               "every rank, with exactly one ``dist.all_reduce`` in the forward (g) and one in "
               "the backward (f, on the gradient of ``x``).",
               cases=("tp-collectives", "tp-mlp-values", "tp-wire")),
        Clause("heads-split", "rank ``r`` computes heads ``[r*H/N, (r+1)*H/N)``: q, k and v "
               "are column-parallel (their rows ``[r*d/N, (r+1)*d/N)`` are exactly those "
               "heads' features), o is row-parallel, and ``n_heads`` is the LOCAL head count "
               "``H/N``.", cases=("tp-attention-values",)),
        Clause("attention-one-plus-one", "with one ``dist.all_reduce`` in the forward (in o) "
               "and one in the backward (f, shared by q, k and v: they read the same "
               "``f(x)``).", cases=("tp-collectives", "tp-wire")),
        Clause("float64", "the judge's own MLP and attention blocks (float64 and float32; the "
               "MLP also on a 2-D input, attention also causal)",
               cases=("tp-layers", "tp-mlp-values", "tp-attention-values")),
    ],
    "schedules": [
        Clause("gpipe", "all forwards in micro-batch order, then all backwards in reverse "
               "micro-batch order", cases=("schedule-gpipe",)),
        Clause("1f1b", "a warm-up of ``w = min(p - stage - 1, m)`` forwards F0 .. F(w-1); then, "
               "for ``j = w .. m-1``, the pair F(j), B(j-w); then the remaining backwards in "
               "order.", cases=("schedule-1f1b",)),
        Clause("in-flight", "At most ``p - stage`` micro-batches are in flight (forward done, "
               "backward not yet) at any time.", cases=("schedule-1f1b",)),
        Clause("list", "Returns a new list of ``2m`` tuples ``(kind, j)``, kind ``\"F\"`` or "
               "``\"B\"``", cases=("schedule-gpipe", "schedule-1f1b")),
        Clause("errors", "`ValueError` for invalid arguments (`p` or `m` below 1, a stage "
               "outside `[0, p)`, floats, bools, strings, `None`)", cases=("schedule-errors",)),
    ],
    "pipeline": [
        Clause("order", "it runs the ops of ``order`` in that order", cases=("pp-order",)),
        Clause("neighbours", "receives activations from rank ``s-1`` and sends its outputs to "
               "rank ``s+1`` (and gradients the other way), nothing else.",
               cases=("pp-messages", "pp-wire")),
        Clause("messages", "only point-to-point messages and only with the neighbouring stages "
               "(per micro-batch its activation in one message, after at most one header, "
               "forward, and its gradient in one message back; nothing else, no collective)",
               cases=("pp-messages", "pp-wire")),
        Clause("loss-scaling", "The last stage back-propagates ``loss_fn(out_j, tgt_j) * n_j / "
               "n`` for micro-batch ``j`` of ``n_j`` of the ``n`` samples, so that the gradients "
               "are the whole batch's (also when the micro-batches are uneven).",
               cases=("pp-values",)),
        Clause("accumulate", "The gradients are accumulated (``+=``) into ``.grad`` of "
               "``stage_module``'s parameters, never zeroed.", cases=("pp-accumulate",)),
        Clause("graph-freed", "A micro-batch's graph is freed by its backward (no "
               "``retain_graph``): under 1F1B a stage then holds the saved activations of at "
               "most ``p - s`` micro-batches at once.", cases=("pp-memory",)),
        Clause("inputs-freed", "Once its backward is done, the stage keeps nothing that holds a "
               "micro-batch's input: not the tensor (in a dict or a list), not its receive's "
               "Work, not its output or its loss with their graph (the graph leads back to the "
               "input: keep ``.item()`` or ``.detach()``, and send ``out.detach()``).",
               cases=("pp-memory",)),
        Clause("returns", "On the last stage, the whole batch's loss as a Python float; None on "
               "the other stages.", cases=("pp-values",)),
        Clause("no-deadlock", "A deadlock is reported as a hang, with a hint.",
               cases=("pp-values",)),
    ],
}
