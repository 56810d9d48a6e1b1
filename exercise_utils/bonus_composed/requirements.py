"""What notebook 11's exercises promise: their contracts, clause by clause, with the check cases
that hold each clause.

``CONTRACT[exercise]`` lists :class:`~exercise_utils.contract.Clause` rows: the Args / Returns /
Raises clauses of the docstrings of ``work/11_composed.py`` and the behavioural sentences of the
notebook, word for word, and the cases of :mod:`.checks` that exercise them. Every case rejects
at least one known-wrong file of ``tests/wrong/11_flaws.py``, which names the clause it breaks
(``tests/test_requirements.py``, ``tests/test_checks.py``).

Used in 11_bonus_composed.
"""
from ..contract import Clause

CONTRACT = {
    "mesh": [
        Clause("coords", "The coordinates ``(d, p, t)`` of global ``rank`` on the ``dp x pp x "
               "tp`` grid, ``tp`` varying fastest: ``rank = (d * pp + p) * tp + t``.",
               cases=("mesh-pure", "mesh-groups")),
        Clause("coords-returns", "Returns a tuple of three ints; ValueError if ``rank`` is not "
               "in ``[0, dp * pp * tp)``", cases=("mesh-pure",)),
        Clause("lines", "the lists of global ranks that share the other two coordinates, each "
               "list ordered by the coordinate ``dim``, the lists in increasing order of their "
               "first rank.", cases=("mesh-pure",)),
        Clause("lines-returns", "Returns a new list of lists of ints; ValueError for another "
               "``dim`` or invalid sizes.", cases=("mesh-pure",)),
        Clause("ranks", "ranks: ``{dim: the global ranks of this rank's group of dim}``, its "
               "line of ``mesh_lines(dim, ...)``.", cases=("mesh-groups",)),
        Clause("groups", "groups: ``{dim: the process group of those ranks}``, made by "
               "``dist.new_group``.", cases=("mesh-comm",)),
        Clause("neighbours", "prev, next: the global rank of the previous and of the next "
               "pipeline stage (same ``d`` and ``t``); None on the first and on the last "
               "stage.", cases=("mesh-groups",)),
        Clause("order", "every rank makes every group of every dimension, dimension by "
               "dimension in the order of ``DIMS``, each dimension's groups in the order of "
               "``mesh_lines``, and keeps its own. Nothing else is made.",
               cases=("mesh-groups",)),
        Clause("sizes", "``dp``, ``pp``, ``tp`` positive ints whose product is the world size "
               "(ValueError otherwise, before any group is made: call ``check_sizes``).",
               cases=("mesh-groups",)),
    ],
    "vocab_parallel": [
        Clause("group-sum", "returns a new tensor, the sum of ``x`` over the ranks of "
               "``group`` (one ``dist.all_reduce`` on a copy: ``x`` itself is not modified); "
               "its backward returns the incoming gradient as it is (and None for ``group``).",
               cases=("vp-group",)),
        Clause("emb-rows", "group rank ``r`` (``dist.get_rank(group)``) holds rows ``[r*k, "
               "(r+1)*k)`` of the full table (``weight``: ``(k, d)``; ``start = r*k``).",
               cases=("vp-embedding",)),
        Clause("emb-copy", "This rank's shard of the ``nn.Embedding`` ``emb`` (a copy, of its "
               "dtype; the new weight requires grad; ``emb`` itself is left as it is).",
               cases=("vp-embedding",)),
        Clause("emb-divisible", "``emb.num_embeddings`` not divisible by the group's size.",
               cases=("vp-embedding",)),
        Clause("emb-forward", "returns ``(..., d)``, the full table's embedding of every token, "
               "the same on every rank: each rank looks up the tokens in its rows (zeros for "
               "the others)", cases=("vp-embedding",)),
        Clause("emb-one-all-reduce", "``ReduceFromGroup`` sums them, one ``dist.all_reduce`` "
               "in the forward and none in the backward.", cases=("vp-collectives",)),
        Clause("emb-grad", "Each rank's ``weight.grad`` is its rows of the full table's "
               "gradient.", cases=("vp-embedding",)),
        Clause("loss-value", "the mean over the rows of ``-log softmax(full logits)[target]``, "
               "the same on every rank, and stable for logits of any size (subtract each row's "
               "maximum over all ``V`` columns before ``exp``).", cases=("vp-loss",)),
        Clause("loss-columns", "``logits`` ``(N, k)`` are this rank's columns ``[r*k, "
               "(r+1)*k)`` of the full ``(N, V)`` logits", cases=("vp-loss",)),
        Clause("loss-returns", "Returns a 0-dim tensor of the logits' dtype",
               cases=("vp-loss",)),
        Clause("loss-inputs", "Neither input is modified.", cases=("vp-loss",)),
        Clause("loss-three", "in the forward exactly three ``dist.all_reduce`` over ``group``, "
               "each of ``N`` numbers: the rows' maxima (``op=dist.ReduceOp.MAX``), the rows' "
               "sums of exponentials, and the target logits (each from the rank that holds the "
               "target's column, zero on the others).",
               cases=("vp-collectives", "vp-loss", "vp-wire")),
        Clause("loss-backward", "None in the backward, which returns ``logits.grad`` = this "
               "rank's columns of the full gradient, ``(softmax(full logits) - "
               "one_hot(targets)) / N`` times the incoming gradient",
               cases=("vp-loss", "vp-collectives")),
    ],
}

CONTRACT["ring_attention"] = [
    Clause("merge", "``lse = log(exp(lse) + exp(lse_b))``, and each side's output weighted by "
           "``exp(its lse - lse)``.", cases=("ring-pure",)),
    Clause("merge-inf", "A side with ``lse = -inf`` (no visible key) weighs 0; both at -inf "
           "give ``lse = -inf`` and ``out = 0``. Never NaN; the inputs are not modified.",
           cases=("ring-pure",)),
    Clause("balanced", "cut ``torch.arange(S)`` into ``2c`` chunks with ``torch.tensor_split`` "
           "(sizes differing by at most one); rank ``r`` holds chunk ``r`` then chunk ``2c - 1 "
           "- r``.", cases=("ring-pure",)),
    Clause("balanced-errors", "Raises ValueError unless ``S`` and ``c`` are ints (a bool is "
           "not one) with ``c >= 1`` and ``S >= 2c``.", cases=("ring-pure",)),
    Clause("pairs-full", "Not causal: one product of the whole blocks, ``[(slice(None), "
           "slice(None), None)]``.", cases=("ring-pure",)),
    Clause("pairs-causal", "one product per pair of a query run and a key run of "
           "``contiguous_runs`` (query runs in order, and for each the key runs in order), "
           "leaving out every pair in which no query sees any key", cases=("ring-pure",
                                                                             "ring-work")),
    Clause("pairs-mask", "``mask`` is None where every query of the pair sees every key, else "
           "the ``(Lq, Lk)`` bool tensor ``q_pos[qs, None] >= k_pos[None, ks]``.",
           cases=("ring-pure",)),
    Clause("values", "Returns ``out`` ``(B, H, L, hd)``, what attention over all the ``S`` "
           "tokens gives this rank's queries; its backward returns the gradients of ``q``, "
           "``k`` and ``v`` (None for the other three).", cases=("ring-values",)),
    Clause("forward-ring", "at step ``i = 0 .. c-1`` the rank holds the keys and values of "
           "group rank ``(me - i) mod c`` (at step 0 its own).", cases=("ring-values",)),
    Clause("overlap", "Before computing with the held block it starts passing it on: "
           "``dist.isend`` to the next rank and ``dist.irecv`` of the following block from the "
           "previous one (``ring_peers``), waited on after the compute.",
           cases=("ring-messages",)),
    Clause("backward-ring", "after ``c`` steps each block's gradient is back on its own rank.",
           cases=("ring-values",)),
    Clause("messages", "Only ``dist.isend`` / ``dist.irecv`` (or ``send`` / ``recv``) with the "
           "two ring neighbours, no collective; per message at most one block's keys and "
           "values (and, in the backward, their gradients).",
           cases=("ring-messages", "ring-wire")),
    Clause("memory", "What the forward keeps for the backward is this rank's own ``q``, ``k``, "
           "``v``, ``out`` and the log-sum-exp, never a block received from another rank",
           cases=("ring-memory",)),
    Clause("block-functions", "Every pair of ``block_pairs`` is computed with "
           "``block_forward`` and merged with ``merge_blocks``.", cases=("ring-work",)),
    Clause("balance", "with `balanced_positions` and `S` a multiple of `2c`, every rank's "
           "entries within one chunk's square of every other rank's.",
           cases=("ring-pure", "ring-work")),
]

CONTRACT["sequence_parallel"] = [
    Clause("gather", "returns the whole ``(S, ...)`` on every rank of ``group``, the ranks' "
           "rows in group-rank order (one ``dist.all_gather_into_tensor``).",
           cases=("sp-values",)),
    Clause("gather-backward", "the gradient of ``x`` is the sum of the ranks' gradients, rows "
           "of this rank only (one ``dist.reduce_scatter_tensor``).", cases=("sp-values",
                                                                            "sp-collectives")),
    Clause("scatter", "returns this rank's rows ``(S/t, ...)`` of the sum over the ranks (one "
           "``dist.reduce_scatter_tensor``).", cases=("sp-values", "sp-collectives")),
    Clause("scatter-backward", "Backward: the gradient of this rank's rows, gathered from every "
           "rank (one ``dist.all_gather_into_tensor``).", cases=("sp-values",)),
    Clause("rows", "returns the same rows of the block's output.", cases=("sp-values",)),
    Clause("bias-once", "``b2`` is added once, after it.", cases=("sp-values",)),
    Clause("no-all-reduce", "One all-gather and one reduce-scatter in the forward, one of each "
           "in the backward, no all-reduce.", cases=("sp-collectives", "sp-wire")),
    Clause("replicated", "Sum, over ``module.group``, the gradient of every parameter in "
           "``module.replicated``", cases=("sp-replicated", "sp-collectives")),
]

CONTRACT["composed_step"] = [
    Clause("copy-forward", "``CopyToGroup.apply(x, group)`` returns ``x``'s values (a new "
           "tensor or a view; ``x`` is not modified) in the forward", cases=("step-values",)),
    Clause("copy-backward", "its backward returns the sum over the ranks of ``group`` of their "
           "incoming gradients (one ``dist.all_reduce``, on a copy: the incoming gradient is "
           "not modified)", cases=("step-values",)),
    Clause("tp-block", "returns the block's output, the same on every rank.",
           cases=("step-values",)),
    Clause("tp-bias-once", "``ReduceFromGroup`` of the partial output projection (or fc2), "
           "then the bias once and the residual", cases=("step-values",)),
    Clause("tp-collectives", "one all-reduce per half in the forward, one per half in the "
           "backward.", cases=("step-collectives",)),
    Clause("stage-head", "the last stage returns its columns of the logits, ``(b, S, V/t)`` "
           "(the norm, ``CopyToGroup``, the head's rows: the head is column-parallel, so its "
           "input's gradient is a sum over the group)", cases=("step-values",)),
    Clause("replica-rows", "Replica ``d`` (``mesh.coords[\"dp\"]``) takes rows ``[d*B/dp, "
           "(d+1)*B/dp)``.", cases=("step-values", "step-messages")),
    Clause("inputs", "the whole batch, the same on every rank (not modified)",
           cases=("step-values",)),
    Clause("pipeline", "a stage that is not the first receives its input ``(B/dp, S, d)`` (of "
           "the stage's parameters' dtype) from ``mesh.prev`` (``dist.recv``, or any other "
           "point-to-point form); a stage that is not the last sends its output to "
           "``mesh.next`` and receives the output's gradient back from it",
           cases=("step-messages", "step-values")),
    Clause("dp-average", "Then every parameter's gradient is averaged over the data-parallel "
           "group (``dist.all_reduce`` over ``mesh.groups[\"dp\"]``, divided by ``dp``).",
           cases=("step-values", "step-collectives")),
    Clause("returns", "Returns the whole batch's mean loss as a Python float, the same on "
           "every rank", cases=("step-values",)),
    Clause("state", "its parameters' ``.grad`` are None when called.", cases=("step-values",)),
    Clause("neighbours", "Messages only to and from the pipeline neighbours (``mesh.prev``, "
           "``mesh.next``); every collective over one of the mesh's groups.",
           cases=("step-messages", "step-collectives", "step-wire")),
]
