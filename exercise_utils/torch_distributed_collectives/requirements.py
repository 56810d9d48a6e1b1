"""What notebook 03's exercises promise: their contracts, clause by clause, with the check cases
that hold each clause.

``CONTRACT[exercise]`` lists :class:`~exercise_utils.contract.Clause` rows: every Args /
Returns / Raises clause of the exercise's docstrings and every behavioural sentence of the
notebook, word for word, and the cases of :mod:`.checks_ring` and :mod:`.checks` that exercise
it. Every case rejects at least one known-wrong file of ``tests/wrong/03_flaws.py``, which
names the clause it breaks (``tests/test_requirements.py``, ``tests/test_checks.py``). The
given code (``Partition``, ``convert_batchnorm``) is not an exercise and has no rows.

Used in 03_torch_distributed_collectives.
"""
from ..contract import Clause

CONTRACT = {
    "ring_allreduce": [
        Clause("returns", "``tensor`` itself, holding the element-wise sum of every rank's input.",
               cases=("ring-sum",)),
        Clause("in-place", "Sum ``tensor`` over all ranks, in place, with a ring of "
               "``send``/``recv`` messages.", cases=("ring-in-place",)),
        Clause("chunks", "The flattened tensor is cut into ``world_size`` chunks "
               "(``torch.tensor_split``: the first ``numel % world_size`` chunks are one element "
               "longer).", cases=("ring-uneven",)),
        Clause("any-tensor", "a contiguous tensor (any shape, any dtype gloo can send) with the "
               "same shape and dtype on every rank.", cases=("ring-shape", "ring-float64")),
        Clause("small", "(lengths need not divide evenly; some chunks may be empty)",
               cases=("ring-small",)),
        Clause("integers", "Add in the tensor's own dtype: integer tensors come out exact, never "
               "through a float buffer (float64 holds every integer only up to 2**53).",
               cases=("ring-integer",)),
        Clause("p2p-only", "Only ``dist.send``/``dist.recv``/``dist.isend``/``dist.irecv`` may "
               "communicate (``dist.P2POp`` with ``dist.batch_isend_irecv`` too; no collective "
               "such as ``dist.all_reduce``)",
               cases=("ring-p2p-only", "ring-wire")),
        Clause("messages", "Each rank sends ``2 * (world_size - 1)`` messages of about ``numel / "
               "world_size`` elements", cases=("ring-messages", "ring-wire")),
        Clause("neighbours", "Every rank sends only to its right neighbour ``(rank + 1) % "
               "world_size`` and receives only from its left neighbour ``(rank - 1) % "
               "world_size``, one chunk per message", cases=("ring-neighbours", "ring-wire")),
        Clause("deadlock", "With gloo, a send starts only once the peer has posted the matching "
               "receive (the receiver tells the sender over the connection they share): if "
               "every rank first sends with the blocking ``dist.send`` and then receives, all of "
               "them wait forever.", cases=("ring-deadlock",)),
        Clause("group", "Sum over the ranks of ``group`` only", cases=("ring-group",)),
        Clause("global-ranks", "``send``/``recv`` take global ranks: translate the group rank "
               "``r`` with ``dist.get_global_rank(group, r)``", cases=("ring-group",)),
        Clause("any-group", "inside process groups whose ranks are not consecutive, ranks 0, 2 "
               "and 3 beside rank 1 alone, each summing its own ranks only",
               cases=("ring-group",)),
    ],
    "partition": [
        Clause("n", "n: number of samples (>= 0).", cases=("sizes-sum-one",)),
        Clause("fractions", "fractions: non-negative fractions summing to at most 1",
               cases=("sizes-sum-one",)),
        Clause("near-one", "(a sum within 1e-9 of 1 counts as 1)", cases=("sizes-near-one",)),
        Clause("floor", "list[int]: ``floor(f * n)`` for every fraction ``f``;",
               cases=("sizes-sum-one", "sizes-below-one", "sizes-int")),
        Clause("left-over", "when the fractions sum to 1, the samples left over (fewer than "
               "``len(fractions)``) are then given one each to the parts with the largest "
               "fractional parts ``f * n - floor(f * n)``, ties to the lower index, so the sizes "
               "add up to ``n``.", cases=("sizes-sum-one",)),
        Clause("every-sample", "Use the largest-remainder rule of the docstring, so fractions "
               "that sum to 1 use every sample.", cases=("sizes-sum-one",)),
        Clause("rest-left-out", "When they sum to less than 1 the rest of the samples is left "
               "out.", cases=("sizes-below-one",)),
        Clause("raises", "ValueError: a fraction is negative or the fractions sum to more than "
               "1.", cases=("sizes-raises",)),
        Clause("data", "data: a dataset (anything with ``len``).", cases=("parts-sizes",)),
        Clause("sizes", "the part sizes are ``partition_sizes(len(data), sizes)``.",
               cases=("parts-sizes",)),
        Clause("seed", "seed: seed of the shuffle.", cases=("parts-seed",)),
        Clause("own-generator", "The shuffle uses its own generator (e.g. ``random.Random(seed)`` "
               "or a ``torch.Generator``) and leaves the global random state (``random``, "
               "``numpy``, ``torch``) untouched, so every rank computes the same partitions "
               "whatever its global seed.", cases=("parts-rng-kept",)),
        Clause("private", "shuffle with a *private* generator (`random.Random(seed)`), never "
               "`random.shuffle`", cases=("parts-same-on-ranks",)),
        Clause("next-indices", "part ``i`` holds the next ``partition_sizes(...)[i]`` indices of "
               "the shuffled ``range(len(data))``.", cases=("parts-shuffled",)),
        Clause("disjoint", "The parts are disjoint; they cover every index when the fractions "
               "sum to 1.", cases=("parts-disjoint",)),
        Clause("use", "Return part ``i`` as a :class:`Partition` of ``data``.",
               cases=("parts-use",)),
        Clause("labels", "labels: the label of every sample (list or 1-D tensor of ints).",
               cases=("labels-tensor",)),
        Clause("num-partitions", "num_partitions: number of parts.", cases=("labels-groups",)),
        Clause("groups", "the sorted distinct labels are split into ``num_partitions`` contiguous "
               "groups as equal as possible, the earlier groups one larger (like "
               "``numpy.array_split``)", cases=("labels-groups",)),
        Clause("increasing", "part ``r`` holds, in increasing order, the indices of the samples "
               "whose label is in group ``r``.", cases=("labels-order",)),
        Clause("lists", "list[list[int]]:", cases=("labels-type",)),
    ],
    "average_gradients": [
        Clause("weighted", "The gradient of the mean loss over all ``N = sum n_r`` samples is "
               "``sum_r (n_r / N) * g_r``: a plain average ``sum_r g_r / world_size`` is only "
               "right when every ``n_r`` is the same.", cases=("avg-values",)),
        Clause("returns", "On return every rank's ``p.grad`` holds ``sum_r (n_r / N) * g_r``, "
               "with ``N`` the total number of samples, itself obtained with an ``all_reduce``.",
               cases=("avg-values", "avg-wire")),
        Clause("may-differ", "num_samples: number of samples this rank's loss averaged over (may "
               "differ between ranks).", cases=("avg-values",)),
        Clause("skipped", "Parameters whose ``grad`` is ``None`` (frozen or unused) are skipped.",
               cases=("avg-no-grad",)),
        Clause("varying", "Which parameters have a gradient may change from one call to the "
               "next (a layer the forward skips in some steps, one frozen for a while): look at "
               "``p.grad`` in every call.", cases=("avg-varying",)),
        Clause("any-model", "Any model: frozen, unused, tied, transposed (non-contiguous: "
               "``reshape`` works, ``view(-1)`` does not) and 0-d parameters, float32 or float64 "
               "gradients, whose dtype you keep (no float32 buffer for float64 gradients).",
               cases=("avg-model", "avg-float64")),
        Clause("zero-samples", "It may be 0 on a rank that has no sample (its gradients are then "
               "zeros); that rank still takes part in every ``all_reduce``.",
               cases=("avg-empty-rank",)),
        Clause("group", "average over the ranks of ``group`` only.", cases=("avg-group",)),
    ],
    "sync_batchnorm": [
        Clause("as-batchnorm", "num_features, eps, momentum, affine, track_running_stats: as in "
               "``nn.BatchNorm1d``", cases=("bn-momentum", "bn-no-stats")),
        Clause("momentum-none", "(``momentum=None``: cumulative average, factor ``1 / "
               "num_batches_tracked``)", cases=("bn-momentum",)),
        Clause("group", "the statistics span the batches of its ranks only.",
               cases=("bn-group",)),
        Clause("inputs", "BatchNorm over the union of all ranks' batches (inputs ``(N, C)`` or "
               "``(N, C, ...)``).", cases=("bn-spatial",)),
        Clause("no-stats", "Training-mode forward (``training`` or no running statistics):",
               cases=("bn-no-stats",)),
        Clause("global-stats", "mean and biased variance per channel over all ranks' samples "
               "(and positions)", cases=("bn-output", "bn-spatial")),
        Clause("differentiable", "from a differentiable ``torch.distributed.nn.functional."
               "all_reduce`` (SUM) of the count, the sum and the sum of squares (one call can "
               "carry all three), so ``backward`` is right on every rank",
               cases=("bn-backward", "bn-wire")),
        Clause("output", "output ``(x - mean) / sqrt(var + eps) * weight + bias``.",
               cases=("bn-eps",)),
        Clause("local-sizes", "Local batch sizes may differ; a rank's batch may even be empty.",
               cases=("bn-output", "bn-empty-rank")),
        Clause("dtype", "Inputs are float32 or float64: the output, the gradients and the running "
               "statistics keep that dtype (no float32 statistics for float64 inputs).",
               cases=("bn-float64",)),
        Clause("running", "When tracking, ``num_batches_tracked += 1`` and ``running_mean`` / "
               "``running_var`` move towards the global mean and the *unbiased* global variance "
               "(``var * N / (N - 1)``, N the global count per channel), exactly as a single "
               "``nn.BatchNorm`` on the concatenated batch would.", cases=("bn-running",)),
        Clause("eval", "Eval mode (given): normalises with the running statistics.",
               cases=("bn-eval",)),
    ],
}
