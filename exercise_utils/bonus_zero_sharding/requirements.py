"""What notebook 07's exercises require, quoted from the notebook's text and docstrings.

``REQUIREMENTS[exercise]`` lists the sentences a correct ``work/07_zero.py`` must satisfy, word
for word as the solution notebook states them. Every one has at least one wrong file in
``tests/wrong/`` whose docstring quotes it and which the exercise's check rejects; every wrong
file quotes one (``tests/test_requirements.py``). A requirement without a wrong file is either
checked next time or deleted from the notebook.

Used in 07_bonus_zero_sharding.
"""
REQUIREMENTS = {
    "memory": [
        "stage 0: (2 + 2 + K) Psi; stage 1: (2 + 2) Psi + K Psi / N_d; stage 2: 2 Psi + "
        "(2 + K) Psi / N_d; stage 3: (2 + 2 + K) Psi / N_d.",
        "k: bytes of optimizer state per parameter (mixed-precision Adam: 12).",
        "ValueError: ``stage`` is not 0, 1, 2 or 3.",
    ],
    "sharded": [
        "Greedy, largest first: take the parameters in order of decreasing size (ties: the "
        "lower index first) and give each to the rank with the fewest elements so far (ties: "
        "the lower rank).",
        "each rank builds `optimizer_cls` over its own shard only, so only it holds that state",
        "After ``step()`` every rank holds every parameter's new value",
        "new parameters (with their own hyper-parameters) join the shards",
        "Its parameters are partitioned with ``partition_parameters``, starting from the "
        "elements each rank already owns (``loads``)",
        "ShardedOptimizer is a ``torch.optim.Optimizer`` (it calls ``Optimizer.__init__``), so "
        "a learning-rate scheduler works with it",
        "A learning-rate scheduler changes them: ``step()`` copies them to the local optimizer "
        "first (``_sync_hyperparameters``, given).",
        "Reset the gradients of ALL parameters (every rank computed all of them).",
    ],
    "checkpoint": [
        "The local state dict's indices (0, 1, ... over this rank's parameters, group after "
        "group) map to global ones in the same order.",
        "Afterwards rank ``to``'s ``state_dict()`` returns the state of every parameter in the "
        "format of the unsharded optimizer",
        "and every group's hyper-parameters (into ``self.param_groups`` too).",
    ],
}
