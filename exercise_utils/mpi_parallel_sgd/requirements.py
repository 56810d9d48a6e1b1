"""What notebook 01's exercises promise: their contracts, clause by clause, with the check cases
that hold each clause.

``CONTRACT[exercise]`` lists :class:`~exercise_utils.contract.Clause` rows: every Args / Returns
clause of the exercise's docstrings and every behavioural sentence of the notebook, word for
word, and the cases of :mod:`.checks` that exercise it. Every case rejects at least one
known-wrong file of ``tests/wrong/01_flaws.py``, which names the clause it breaks
(``tests/test_requirements.py``, ``tests/test_checks.py``).

Used in 01_mpi_parallel_sgd.
"""
from ..contract import Clause

CONTRACT = {
    "shards": [
        Clause("tile", "Return a list of `size` (start, stop) pairs that tile range(n_samples) in "
               "rank order.", cases=("bounds-count", "bounds-tile")),
        Clause("sizes", "Shard sizes differ by at most one; the first n_samples % size ranks "
               "get one more.", cases=("bounds-sizes", "bounds-larger-first")),
        Clause("any-size", "it works for any `size`, including odd ones and `size > n` (empty "
               "shards).", cases=("bounds-tile", "scatter-empty")),
        Clause("scatter", "On `root`, x and y hold every sample (None elsewhere). Return this "
               "rank's (x, y) shard.", cases=("scatter-shard", "scatter-root")),
        Clause("types", "Returns: (x[start:stop], y[start:stop]) for this rank's bounds, torch "
               "tensors of x's and y's dtypes.", cases=("scatter-type", "scatter-float64")),
        Clause("receive-own", "Every rank receives only its own shard, never the whole dataset.",
               cases=("scatter-received", "scatter-wire")),
    ],
    "broadcast": [
        Clause("equals-root", "After the call, every rank's model.state_dict() equals root's",
               cases=("bcast-values", "bcast-root")),
        Clause("buffers", "copy rank `root`'s parameters **and buffers** (e.g. BatchNorm running "
               "statistics: `model.state_dict()` holds both) into every rank's model.",
               cases=("bcast-values", "bcast-wire")),
        Clause("any-model", "Your function must work for any model: float32 or float64, with "
               "frozen, tied and transposed parameters, and integer buffers.",
               cases=("bcast-float64",)),
        Clause("int-buffer", "BatchNorm's `num_batches_tracked` is an int64 counter: do not send "
               "it through a float32 buffer, which cannot hold every integer above 2**24",
               cases=("bcast-int-buffer",)),
        Clause("in-place", "(tensors updated in place)", cases=("bcast-in-place",)),
    ],
    "convergence": [
        Clause("global", "Return (sum of loss_sum over ranks) / (sum of count over ranks), the "
               "same on every rank.", cases=("global-value", "global-same")),
        Clause("float64", "Add up in float64 (Python floats, or a float64 array): a float32 "
               "buffer rounds large sums.", cases=("global-value",)),
        Clause("edges", "Losses may be negative (a log-likelihood) or zero, and a rank may hold "
               "no samples at all (`count` 0): the formula above handles both.",
               cases=("global-empty-rank", "converged-rule")),
        Clause("rule", "False on the first epoch (prev_loss is None); else abs(prev_loss - loss) "
               "<= rel_tol * abs(prev_loss).", cases=("converged-rule",)),
        Clause("bool", "Returns: a bool.", cases=("converged-bool",)),
    ],
    "allreduce_sgd": [
        Clause("average", "Replace every p.grad by the average of p.grad over all ranks (one "
               "Allreduce in total).", cases=("sgd-values", "sgd-one-allreduce", "sgd-wire")),
        Clause("no-grad", "frozen ones and layers the forward did not use have none: leave "
               "their `.grad` as `None`", cases=("sgd-no-grad",)),
        Clause("varying", "Which parameters have a gradient may change from one step to the "
               "next (a layer frozen or unfrozen, a branch the forward skips): look at `p.grad` "
               "at every call.", cases=("sgd-varying",)),
        Clause("dtype", "Gradients are float32 or float64 (whatever the model's dtype): keep that "
               "dtype all the way, since a float32 buffer or `MPI.FLOAT` rounds float64 "
               "gradients.", cases=("sgd-float64",)),
        Clause("transposed", "A parameter may be stored transposed (not contiguous): `reshape` "
               "works on it, `view(-1)` does not.", cases=("sgd-values",)),
    ],
    "model_averaging": [
        Clause("mean", "After the call every rank's parameters equal the mean over ranks of "
               "their parameters.", cases=("average-values", "average-root", "average-wire")),
        Clause("every-parameter", "Average every parameter, frozen ones included, in the "
               "model's own dtype (float32 or float64).",
               cases=("average-values", "average-float64")),
        Clause("buffers", "but the function must work on a model that has them: BatchNorm's "
               "`num_batches_tracked` is a 0-d int64 tensor.", cases=("average-values",)),
        Clause("in-place", "Copy the mean into the model's own tensors, in place.",
               cases=("average-in-place",)),
    ],
}
