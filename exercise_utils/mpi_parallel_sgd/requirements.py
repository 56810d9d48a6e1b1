"""What notebook 01's exercises require, quoted from the notebook's text and docstrings.

``REQUIREMENTS[exercise]`` lists the sentences a correct file must satisfy, word for word as
the solution notebook states them. Every one has at least one wrong file in ``tests/wrong/``
whose docstring quotes it and which the exercise's check rejects; every wrong file quotes one
(``tests/test_requirements.py``). A requirement without a wrong file is either checked next
time or deleted from the notebook.

Used in 01_mpi_parallel_sgd.
"""
REQUIREMENTS = {
    "shards": [
        "Return a list of `size` (start, stop) pairs that tile range(n_samples) in rank order.",
        "Shard sizes differ by at most one; the first n_samples % size ranks get one more.",
        "On `root`, x and y hold every sample (None elsewhere). Return this rank's (x, y) shard.",
        "Every rank receives only its own shard, never the whole dataset.",
    ],
    "broadcast": [
        "After the call, every rank's model.state_dict() equals root's",
        "(tensors updated in place)",
    ],
    "convergence": [
        "Return (sum of loss_sum over ranks) / (sum of count over ranks), the same on every rank.",
        "False on the first epoch (prev_loss is None); else abs(prev_loss - loss) <= rel_tol * "
        "abs(prev_loss).",
    ],
    "allreduce_sgd": [
        "Replace every p.grad by the average of p.grad over all ranks (one Allreduce in total).",
    ],
    "model_averaging": [
        "After the call every rank's parameters equal the mean over ranks of their parameters.",
        "Copy the mean into the model's own tensors, in place.",
    ],
}
