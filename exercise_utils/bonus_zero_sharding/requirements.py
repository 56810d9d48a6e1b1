"""What notebook 07's exercises promise: their contracts, clause by clause, with the check cases
that hold each clause.

``CONTRACT[exercise]`` lists :class:`~exercise_utils.contract.Clause` rows: every Args /
Returns / Raises clause of the exercise's docstrings (the ``%%writefile work/07_zero.py`` cell)
and every behavioural sentence of the notebook, word for word, and the cases of
:mod:`.checks_memory`, :mod:`.checks` / :mod:`.checks_sharded` and :mod:`.checks_checkpoint`
that exercise it. Every case rejects at least one known-wrong file of
``tests/wrong/07_flaws.py``, which names the clause it breaks (``tests/test_requirements.py``,
``tests/test_checks.py``); ``sharded-wire`` and ``checkpoint-wire`` (the bytes on the links,
:mod:`.wire`) each reject a cheat of ``tests/cheats/wire/`` (``tests/test_wire.py``).

Used in 07_bonus_zero_sharding.
"""
from ..contract import Clause

CONTRACT = {
    "memory": [
        Clause("num-params", "num_params: Psi, the number of parameters of the model.",
               cases=("memory-stages",)),
        Clause("num-devices", "num_devices: N_d, the number of data-parallel devices.",
               cases=("memory-stages", "memory-one-device")),
        Clause("stage", "stage: 0 (baseline data parallelism: every device holds everything), "
               "1 (P_os: optimizer states partitioned), 2 (P_os+g: optimizer states and "
               "gradients partitioned) or 3 (P_os+g+p: parameters partitioned too).",
               cases=("memory-stages",)),
        Clause("k", "k: bytes of optimizer state per parameter (mixed-precision Adam: 12).",
               cases=("memory-k",)),
        Clause("float", "float: bytes per device.", cases=("memory-stages", "memory-float")),
        Clause("formula", "stage 0: (2 + 2 + K) Psi; stage 1: (2 + 2) Psi + K Psi / N_d; "
               "stage 2: 2 Psi + (2 + K) Psi / N_d; stage 3: (2 + 2 + K) Psi / N_d.",
               cases=("memory-stages", "memory-k", "memory-one-device")),
        Clause("paper", "(7.5e9 parameters on 64 devices: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB, "
               "with GB = 1e9.)", cases=("memory-stages",)),
        Clause("replicated", "Data parallelism replicates all of it on every one of the `N_d` "
               "devices: `(2 + 2 + K) Ψ` bytes for `Ψ` parameters.",
               cases=("memory-stages",)),
        Clause("value-error", "ValueError: ``stage`` is not 0, 1, 2 or 3.",
               cases=("memory-invalid-stage",)),
    ],
    "sharded": [
        # ------------------------------------------------------------ partition_parameters
        Clause("greedy", "Greedy, largest first: take the parameters in order of decreasing "
               "size (ties: the lower index first) and give each to the rank with the fewest "
               "elements so far (ties: the lower rank).",
               cases=("partition-greedy", "partition-ties")),
        Clause("same-assignment", "Every rank computes the same assignment from the same sizes "
               "(no communication).", cases=("partition-ties",)),
        Clause("loads", "loads: elements already assigned to each rank (e.g. by earlier "
               "parameter groups); ``None``: all zero. Not modified.",
               cases=("partition-loads", "partition-loads-unmodified")),
        Clause("owners-list", "list[int]: the owner rank of each parameter (same length as "
               "``numels``).", cases=("partition-type", "partition-greedy")),
        Clause("balanced", "assign each parameter to a rank so that the shards hold about the "
               "same number of elements: largest first, each to the least-loaded rank. A "
               "round-robin by count ignores sizes (one rank could get all the big matrices).",
               cases=("state-balance",)),
        # ------------------------------------------------------------ the optimizer
        Clause("optimizer", "ShardedOptimizer is a ``torch.optim.Optimizer`` (it calls "
               "``Optimizer.__init__``), so a learning-rate scheduler works with it",
               cases=("scheduler-accepts",)),
        Clause("scheduler-lr", "a learning-rate scheduler (`StepLR`, `LambdaLR`, ...) accepts "
               "only an `Optimizer` (else `TypeError: ShardedOptimizer is not an Optimizer`) "
               "and changes the `lr` in its `param_groups`, the full groups.",
               cases=("scheduler-accepts",)),
        Clause("sync", "`step()` first copies the groups' hyper-parameters into the local "
               "optimizer, so a changed `lr` reaches every rank's shard.",
               cases=("scheduler-values",)),
        Clause("own-state", "its own ``state`` stays empty (the state is in ``optim``).",
               cases=("state-one-rank",)),
        Clause("any-model", "It works for any model: parameters in float32 or float64 (keep "
               "their dtype all the way, never through a float32 buffer), frozen or unused by "
               "the forward (their ``.grad`` stays ``None``: the local optimizer skips them, as "
               "``torch.optim.AdamW`` does), tied (one parameter), stored transposed (not "
               "contiguous: ``reshape``, not ``view``) or 0-d.",
               cases=("float64", "edge-model")),
        Clause("varying", "Which parameters have a gradient may change from one step to the "
               "next (a branch of the forward used at some steps only): look at every "
               "``.grad`` at every step, as ``torch.optim.AdamW`` does.",
               cases=("step-varying", "zero-grad-varying")),
        Clause("empty-rank", "With more ranks than parameters a rank owns none, and still makes "
               "every collective call.", cases=("empty-rank",)),
        Clause("param-groups", "a list of dicts, each with ``\"params\"`` (list of all its "
               "parameters, on every rank) and its hyper-parameters, all of them: those the "
               "group gives, else ``**kwargs``, else ``optimizer_cls``'s defaults (as the local "
               "group has them).", cases=("param-groups",)),
        Clause("owners", "owners: ``{id(parameter): rank}`` for every parameter, from "
               "``partition_parameters`` applied to each group in turn (``loads`` carried from "
               "group to group).", cases=("state-owners", "add-group-loads")),
        Clause("local-optimizer", "optim: the local optimizer, ``optimizer_cls`` over THIS "
               "rank's parameters only: one group per group of ``param_groups`` (same order, "
               "same hyper-parameters, possibly no parameters), so it alone holds the state of "
               "this rank's shard.", cases=("local-groups", "state-one-rank")),
        Clause("own-shard", "each rank builds `optimizer_cls` over its own shard only, so only "
               "it holds that state", cases=("state-one-rank",)),
        Clause("params", "params: an iterable of tensors or of dicts (parameter groups), as for "
               "any ``torch.optim`` optimizer (a generator such as ``model.parameters()`` can "
               "be read only once).", cases=("init-params",)),
        Clause("optimizer-cls", "optimizer_cls: e.g. ``torch.optim.AdamW``; called once, as "
               "``optimizer_cls([{\"params\": []}], **kwargs)``", cases=("optimizer-cls",)),
        Clause("kwargs", "kwargs: the optimizer's defaults (``lr``, ``weight_decay``, ...).",
               cases=("step-values",)),
        # ------------------------------------------------------------ add_param_group
        Clause("group", "group: a dict with ``\"params\"`` (a tensor or a list of tensors, the "
               "same on every rank) and optional hyper-parameters; missing ones take the "
               "defaults.", cases=("add-group-tensor",)),
        Clause("add-group", "new parameters (with their own hyper-parameters) join the shards",
               cases=("add-group-hyper",)),
        Clause("add-loads", "Its parameters are partitioned with ``partition_parameters``, "
               "starting from the elements each rank already owns (``loads``)",
               cases=("add-group-loads",)),
        # ------------------------------------------------------------ step
        Clause("closure", "closure: passed to the local optimizer's ``step`` (rarely used): it "
               "recomputes the loss and the gradients, and the local optimizer calls it once. "
               "Returns: what the local optimizer's ``step`` returned.",
               cases=("step-closure",)),
        Clause("every-value", "After ``step()`` every rank holds every parameter's new value",
               cases=("step-broadcast", "step-values")),
        Clause("broadcast", "every rank updates its shard, then the owner of each parameter "
               "broadcasts the new values.", cases=("step-broadcast", "sharded-wire")),
        # ------------------------------------------------------------ zero_grad
        Clause("zero-all", "Reset the gradients of ALL parameters (every rank computed all of "
               "them).", cases=("zero-grad-all",)),
        Clause("set-to-none", "set_to_none: set ``p.grad = None`` (default) instead of filling "
               "it with zeros.", cases=("zero-grad-none", "zero-grad-zeros")),
        Clause("no-grad-stays", "A parameter without a gradient (frozen, unused) keeps ``None`` "
               "either way.", cases=("zero-grad-zeros",)),
    ],
    "checkpoint": [
        Clause("gather", "Gather every rank's optimizer state on rank ``to``; call it on EVERY "
               "rank.", cases=("consolidate-values", "checkpoint-wire")),
        Clause("to", "to: the rank that will hold the whole state (the one that saves "
               "checkpoints).", cases=("consolidate-to",)),
        Clause("format", "Afterwards rank ``to``'s ``state_dict()`` returns the state of every "
               "parameter in the format of the unsharded optimizer",
               cases=("consolidate-values", "checkpoint-edge", "checkpoint-float64",
                      "load-round-trip")),
        Clause("global-indices", "The local state dict's indices (0, 1, ... over this rank's "
               "parameters, group after group) map to global ones in the same order.",
               cases=("consolidate-values", "checkpoint-edge")),
        Clause("fresh", "Each call gathers the state as it is now (after more steps, call it "
               "again) and replaces what an earlier call left: afterwards only rank ``to`` holds "
               "a consolidated state, and ``state_dict()`` raises RuntimeError on every other "
               "rank.", cases=("consolidate-fresh", "consolidate-other-ranks",
                               "checkpoint-varying")),
        Clause("runtime-error", "RuntimeError: this rank holds no consolidated state (call "
               "``consolidate_state_dict(to=...)`` on every rank first).",
               cases=("state-dict-raises", "consolidate-other-ranks")),
        Clause("load-format", "state_dict: the format of ``state_dict()``, the same on every "
               "rank (e.g. ``torch.load`` of a checkpoint on every rank); its groups must match "
               "``self.param_groups`` (same number of parameters each).",
               cases=("load-values", "load-round-trip")),
        Clause("load-shard", "Each rank keeps only its shard's state", cases=("load-shard-only",)),
        Clause("load-hyper", "and every group's hyper-parameters (into ``self.param_groups`` "
               "too).", cases=("load-hyper",)),
        Clause("load-missing", "A parameter without state (never updated: frozen, unused) has no "
               "entry in ``state_dict[\"state\"]``.",
               cases=("checkpoint-edge", "checkpoint-resumed")),
        Clause("load-own", "`load_state_dict` takes such a dict on every rank and keeps its own "
               "shard.", cases=("load-values", "load-round-trip", "load-shard-only")),
    ],
}
