"""What notebook 03's exercises require, quoted from the notebook's text and docstrings.

``REQUIREMENTS[exercise]`` lists the sentences a correct file must satisfy, word for word as
the solution notebook states them. Every one has at least one wrong file in ``tests/wrong/``
whose docstring quotes it and which the exercise's check rejects; every wrong file quotes one
(``tests/test_requirements.py``). A requirement without a wrong file is either checked next
time or deleted from the notebook.

Used in 03_torch_distributed_collectives.
"""
from ..contract import Clause

CONTRACT = {
    "ring_allreduce": [
        Clause("tensor-itself-holding", "``tensor`` itself, holding the element-wise sum of every rank's input.",
               cases=()),
        Clause("only-dist-send",
               "Only ``dist.send``/``dist.recv``/``dist.isend``/``dist.irecv`` may communicate "
               "(no collective such as ``dist.all_reduce``)",
               cases=()),
        Clause("rank-sends-2",
               "Each rank sends ``2 * (world_size - 1)`` messages of about ``numel / "
               "world_size`` elements",
               cases=()),
        Clause("rank-sends-only",
               "Every rank sends only to its right neighbour ``(rank + 1) % world_size`` and "
               "receives only from its left neighbour ``(rank - 1) % world_size``, one chunk per"
               " message",
               cases=()),
        Clause("gloo-send-starts",
               "With gloo, a send starts only once the peer has posted the matching receive (the"
               " receiver tells the sender over the connection they share): if every rank first "
               "sends with the blocking ``dist.send`` and then receives, all of them wait "
               "forever.",
               cases=()),
        Clause("sum-over-ranks", "Sum over the ranks of ``group`` only",
               cases=()),
        Clause("send-recv-take",
               "``send``/``recv`` take global ranks: translate the group rank ``r`` with "
               "``dist.get_global_rank(group, r)``",
               cases=()),
    ],
    "partition": [
        Clause("samples-left-over",
               "the samples left over (fewer than ``len(fractions)``) are then given one each to"
               " the parts with the largest fractional parts ``f * n - floor(f * n)``, ties to "
               "the lower index, so the sizes add up to ``n``.",
               cases=()),
        Clause("sum-within-1e", "(a sum within 1e-9 of 1 counts as 1)",
               cases=()),
        Clause("valueerror-fraction-negative", "ValueError: a fraction is negative or the fractions sum to more than 1.",
               cases=()),
        Clause("shuffle-uses-own",
               "The shuffle uses its own generator (e.g. ``random.Random(seed)`` or a "
               "``torch.Generator``) and leaves the global random state (``random``, ``numpy``, "
               "``torch``) untouched, so every rank computes the same partitions whatever its "
               "global seed.",
               cases=()),
        Clause("part-i-holds",
               "part ``i`` holds the next ``partition_sizes(...)[i]`` indices of the shuffled "
               "``range(len(data))``.",
               cases=()),
        Clause("parts-are-disjoint", "The parts are disjoint; they cover every index when the fractions sum to 1.",
               cases=()),
        Clause("sorted-distinct-labels",
               "the sorted distinct labels are split into ``num_partitions`` contiguous groups "
               "as equal as possible, the earlier groups one larger (like ``numpy.array_split``)",
               cases=()),
    ],
    "average_gradients": [
        Clause("return-rank-s",
               "On return every rank's ``p.grad`` holds ``sum_r (n_r / N) * g_r``, with ``N`` "
               "the total number of samples, itself obtained with an ``all_reduce``.",
               cases=()),
        Clause("parameters-whose-grad", "Parameters whose ``grad`` is ``None`` (frozen or unused) are skipped.",
               cases=()),
        Clause("average-over-ranks", "average over the ranks of ``group`` only.",
               cases=()),
    ],
    "sync_batchnorm": [
        Clause("mean-biased-variance", "mean and biased variance per channel over all ranks' samples (and positions)",
               cases=()),
        Clause("local-batch-sizes", "Local batch sizes may differ.",
               cases=()),
        Clause("from-differentiable-torch",
               "from a differentiable ``torch.distributed.nn.functional.all_reduce`` (SUM) of "
               "the count, the sum and the sum of squares (one call can carry all three), so "
               "``backward`` is right on every rank",
               cases=()),
        Clause("running-mean-running",
               "``running_mean`` / ``running_var`` move towards the global mean and the "
               "*unbiased* global variance (``var * N / (N - 1)``, N the global count per "
               "channel)",
               cases=()),
        Clause("momentum-none-cumulative", "(``momentum=None``: cumulative average, factor ``1 / num_batches_tracked``)",
               cases=()),
        Clause("statistics-span-batches", "the statistics span the batches of its ranks only.",
               cases=()),
    ],
}
