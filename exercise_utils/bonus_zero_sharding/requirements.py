"""What notebook 07's exercises require, quoted from the notebook's text and docstrings.

``REQUIREMENTS[exercise]`` lists the sentences a correct ``work/07_zero.py`` must satisfy, word
for word as the solution notebook states them. Every one has at least one wrong file in
``tests/wrong/`` whose docstring quotes it and which the exercise's check rejects; every wrong
file quotes one (``tests/test_requirements.py``). A requirement without a wrong file is either
checked next time or deleted from the notebook.

Used in 07_bonus_zero_sharding.
"""
from ..contract import Clause

CONTRACT = {
    "memory": [
        Clause("stage-0-2",
               "stage 0: (2 + 2 + K) Psi; stage 1: (2 + 2) Psi + K Psi / N_d; stage 2: 2 Psi + "
               "(2 + K) Psi / N_d; stage 3: (2 + 2 + K) Psi / N_d.",
               cases=()),
        Clause("k-bytes-optimizer", "k: bytes of optimizer state per parameter (mixed-precision Adam: 12).",
               cases=()),
        Clause("valueerror-stage-not", "ValueError: ``stage`` is not 0, 1, 2 or 3.",
               cases=()),
    ],
    "sharded": [
        Clause("greedy-largest-first",
               "Greedy, largest first: take the parameters in order of decreasing size (ties: "
               "the lower index first) and give each to the rank with the fewest elements so far"
               " (ties: the lower rank).",
               cases=()),
        Clause("rank-builds-optimizer",
               "each rank builds `optimizer_cls` over its own shard only, so only it holds that "
               "state",
               cases=()),
        Clause("after-step-rank", "After ``step()`` every rank holds every parameter's new value",
               cases=()),
        Clause("new-parameters-their", "new parameters (with their own hyper-parameters) join the shards",
               cases=()),
        Clause("parameters-are-partitioned",
               "Its parameters are partitioned with ``partition_parameters``, starting from the "
               "elements each rank already owns (``loads``)",
               cases=()),
        Clause("shardedoptimizer-torch-optim",
               "ShardedOptimizer is a ``torch.optim.Optimizer`` (it calls "
               "``Optimizer.__init__``), so a learning-rate scheduler works with it",
               cases=()),
        Clause("learning-rate-scheduler",
               "A learning-rate scheduler changes them: ``step()`` copies them to the local "
               "optimizer first (``_sync_hyperparameters``, given).",
               cases=()),
        Clause("reset-gradients-all", "Reset the gradients of ALL parameters (every rank computed all of them).",
               cases=()),
    ],
    "checkpoint": [
        Clause("local-state-dict",
               "The local state dict's indices (0, 1, ... over this rank's parameters, group "
               "after group) map to global ones in the same order.",
               cases=()),
        Clause("afterwards-rank-s",
               "Afterwards rank ``to``'s ``state_dict()`` returns the state of every parameter "
               "in the format of the unsharded optimizer",
               cases=()),
        Clause("group-s-hyper", "and every group's hyper-parameters (into ``self.param_groups`` too).",
               cases=()),
    ],
}
