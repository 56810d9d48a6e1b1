"""Known-wrong files of notebook 07, as patches of the solution (see tests/flaws.py): one flaw
each, the way a student would make it, naming the clause of the contract it breaks
(exercise_utils/bonus_zero_sharding/requirements.py) and the check case that must reject it."""
from flaws import Def, Flaw

SHARDED = ("    sharded = {0: (), 1: (2,), 2: (1, 2), 3: (0, 1, 2)}[stage]\n")
RETURN_BYTES = ("    return float(sum(b / num_devices if i in sharded else b "
                "for i, b in enumerate(parts)))\n")
CHECK_STAGE = ("    if stage not in (0, 1, 2, 3):\n"
               "        raise ValueError(f\"stage must be 0, 1, 2 or 3, not {stage!r}\")\n")
GREEDY_LOOP = "    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):\n"
LEAST = "        rank = min(range(world_size), key=lambda r: (loads[r], r))\n"
LOADS = "    loads = list(loads) if loads is not None else [0] * world_size\n"
ADD_LOCAL = "        self.optim.add_param_group({**_hyperparameters(group), \"params\": mine})\n"
OWNERS = "        self.owners.update({id(p): r for p, r in zip(params, owners)})\n"
FLAT = "            flat = torch.cat([p.detach().reshape(-1) for p in shard])\n"
LOCAL_STEP = ("        loss = self.optim.step(closure) if closure is not None "
              "else self.optim.step()\n")
ZERO_BRANCH = ("                if set_to_none:\n"
               "                    p.grad = None\n"
               "                else:\n"
               "                    p.grad.detach_()\n"
               "                    p.grad.zero_()\n")
GATHER = ("        gathered = [None] * self.world_size if self.rank == to else None\n"
          "        dist.gather_object(mine, gathered, dst=to)\n")
NOT_TO = ("        if self.rank != to:\n"
          "            self._consolidated = None\n"
          "            return\n")
MERGED = ("        self._consolidated = {\"state\": dict(sorted(state.items())), "
          "\"param_groups\": groups}\n")
MINE = "        mine = {glob[i]: state for i, state in local[\"state\"].items()}\n"
ALL_PARAMS = "        params = [p for g in self.param_groups for p in g[\"params\"]]\n"
APPEND_GROUP = ("        self.param_groups.append({**_hyperparameters(self.optim.param_groups[-1]),\n"
                "                                  \"params\": params})\n")
LOAD_ENTRY = ("                if index in state_dict[\"state\"]:\n"
              "                    state[local] = state_dict[\"state\"][index]\n")

FLAWS = [
    # ------------------------------------------------------------------ memory
    Flaw("memory", "double_counted_bytes", clause="num-params", case="memory-stages",
         why="takes num_params for the fp16 model's size in bytes (2 per parameter) and "
             "multiplies by the bytes per parameter again: every stage twice too large.",
         expect="returned 32 bytes",
         patch=(("    parts = (PARAM_BYTES * num_params,",
                 "    num_params = PARAM_BYTES * num_params        # the fp16 model, in bytes\n"
                 "    parts = (PARAM_BYTES * num_params,"),)),
    Flaw("memory", "one_device_rejected", clause="num-devices", case="memory-one-device",
         why="refuses one device (nothing to partition, the student thought): ZeRO on one "
             "device is plain data parallelism, (2 + 2 + K) Psi for every stage.",
         expect="bytes_per_device(0, 1, stage=0, k=12) raised ValueError",
         patch=((CHECK_STAGE, CHECK_STAGE + "    if num_devices < 2:\n"
                 "        raise ValueError(\"ZeRO partitions over at least 2 devices\")\n"),)),
    Flaw("memory", "stage1_grads", clause="stage", case="memory-stages",
         why="takes stage 1 (P_os) to partition the gradients as well as the optimizer states "
             "(it mixes up P_os and P_os+g): 16.6 GB for the paper's stage 1, not 31.4.",
         expect="stage 1, P_os: optimizer states partitioned",
         patch=((SHARDED, "    sharded = {0: (), 1: (1, 2), 2: (1, 2), 3: (0, 1, 2)}[stage]\n"),)),
    Flaw("memory", "ignores_k", clause="k", case="memory-k",
         why="uses the module constant ADAM_K for the optimizer state instead of its argument "
             "k: right for mixed-precision Adam (k = 12), wrong for any other optimizer.",
         expect="use the argument k",
         patch=(("k * num_params)\n", "ADAM_K * num_params)\n"),)),
    Flaw("memory", "stage0_int", clause="float", case="memory-float",
         why="returns the baseline as the integer product (2 + 2 + k) * num_params, with no "
             "division to make it a float: the right number, an int, not the float promised.",
         expect="returned a value of type int",
         patch=((SHARDED, "    if stage == 0:\n"
                          "        return (PARAM_BYTES + GRAD_BYTES + k) * num_params\n"
                 + SHARDED),)),
    Flaw("memory", "returns_gigabytes", clause="float", case="memory-stages",
         why="returns GB (bytes / 1e9), as the paper's figure shows them, instead of bytes.",
         expect="returned 1.6e-08 bytes",
         patch=((RETURN_BYTES, RETURN_BYTES.replace("enumerate(parts)))",
                                                    "enumerate(parts))) / 1e9")),)),
    Flaw("memory", "floor_division", clause="formula", case="memory-stages",
         why="divides the partitioned parts with //, as bytes are whole numbers: the paper's "
             "numbers come out right, but 1,000,003 parameters on 3 devices lose a fraction.",
         expect="bytes_per_device(1, 3, stage=2, k=12) returned 6 bytes",
         patch=((RETURN_BYTES, RETURN_BYTES.replace("b / num_devices", "b // num_devices")),)),
    Flaw("memory", "stage3_as_stage2", clause="paper", case="memory-stages",
         why="stage 3 partitions the gradients and the optimizer states only, as stage 2: the "
             "paper's 7.5B model on 64 devices gives 16.6 GB at stage 3 instead of 1.9.",
         expect="stage 3, P_os+g+p",
         patch=((SHARDED, "    sharded = {0: (), 1: (2,), 2: (1, 2), 3: (1, 2)}[stage]\n"),)),
    Flaw("memory", "baseline_divided", clause="replicated", case="memory-stages",
         why="divides the baseline by the number of devices too (the model 'spread' over "
             "them): plain data parallelism replicates everything on every device.",
         expect="for the baseline",
         patch=((SHARDED, "    sharded = {0: (0, 1, 2), 1: (2,), 2: (1, 2), 3: (0, 1, 2)}[stage]\n"),)),
    Flaw("memory", "no_value_error", clause="value-error", case="memory-invalid-stage",
         why="an if/elif chain whose else is stage 3: stage=4 returns stage 3's bytes instead "
             "of raising ValueError.",
         expect="bytes_per_device(1000, 2, stage=-1) returned",
         patch=((CHECK_STAGE, ""),
                (SHARDED, "    if stage == 0:\n        sharded = ()\n    elif stage == 1:\n"
                          "        sharded = (2,)\n    elif stage == 2:\n"
                          "        sharded = (1, 2)\n    else:\n        sharded = (0, 1, 2)\n"))),
    Flaw("memory", "range_check", clause="value-error", case="memory-invalid-stage",
         why="checks the range 0 <= stage <= 3 only: stage=0.5 or 2.5 slips through and "
             "returns a number.",
         expect="stage=0.5) returned",
         patch=((CHECK_STAGE, "    if not 0 <= stage <= 3:\n"
                              "        raise ValueError(f\"stage must be 0 to 3, not {stage}\")\n"),
                (SHARDED, "    sharded = [(), (2,), (1, 2), (0, 1, 2)][int(stage)]\n"))),
    Flaw("memory", "dict_key_error", clause="value-error", case="memory-invalid-stage",
         why="looks the stage up in a dict and lets the lookup fail: KeyError, not the "
             "ValueError documented.",
         expect="raised KeyError",
         patch=((CHECK_STAGE, ""),)),
    # ------------------------------------------------------------------ partition_parameters
    Flaw("sharded", "unsorted_greedy", clause="greedy", case="partition-greedy",
         why="gives each parameter to the least-loaded rank, but in the order they come "
             "instead of largest first: sizes [1, 2, 10] on 2 ranks give loads 11 and 2.",
         expect="partition_parameters([1, 2, 10], 2, loads=None) returned [0, 1, 0], ranks "
                "holding [2, 11]",
         patch=((GREEDY_LOOP, "    for i in range(len(numels)):\n"),)),
    Flaw("sharded", "unsorted_greedy_optimizer_unfinished", clause="greedy",
         case="partition-greedy",
         why="the same unsorted greedy, with ShardedOptimizer's construction still as released: "
             "the partition's failure is shown, not hidden behind the unfinished class "
             "(issue 39).",
         expect="partition_parameters([1, 2, 10], 2, loads=None) returned [0, 1, 0]",
         patch=((GREEDY_LOOP, "    for i in range(len(numels)):\n"),
                Def("ShardedOptimizer.__init__",
                    "def __init__(self, params, optimizer_cls, **kwargs):\n"
                    "    # YOUR CODE HERE\n    raise NotImplementedError()\n"))),
    Flaw("sharded", "unbalanced", clause="greedy", case="partition-greedy",
         why="deals the parameters out round-robin by COUNT (parameter i to rank i % "
             "world_size), ignoring their sizes.",
         expect="largest first",
         patch=((GREEDY_LOOP + LEAST, "    for i in range(len(numels)):\n"
                                      "        rank = i % world_size\n"),)),
    Flaw("sharded", "reversed_ties", clause="greedy", case="partition-ties",
         why="sorts by size and reverses the list for 'largest first': among equal sizes the "
             "higher index now comes first.",
         expect="ties: the lower index first",
         patch=((GREEDY_LOOP, "    for i in sorted(range(len(numels)), key=lambda i: numels[i])"
                              "[::-1]:\n"),)),
    Flaw("sharded", "random_ties", clause="same-assignment", case="partition-ties",
         why="breaks ties between equally loaded ranks at random (to spread the load): each "
             "rank draws its own owners, so the ranks disagree about who owns what.",
         expect="the same on every rank",
         patch=((LEAST, "        import random\n"
                        "        rank = random.choice([r for r in range(world_size) "
                        "if loads[r] == min(loads)])\n"),)),
    Flaw("sharded", "loads_ignored_partition", clause="loads", case="partition-loads",
         why="starts every partition from zero loads, whatever `loads` says.",
         expect="start from the elements `loads` gives each rank",
         patch=((LOADS, "    loads = [0] * world_size\n"),)),
    Flaw("sharded", "loads_mutated", clause="loads", case="partition-loads-unmodified",
         why="adds the new elements into the caller's `loads` list itself (no copy).",
         expect="changed the caller's loads",
         patch=((LOADS, "    loads = loads if loads is not None else [0] * world_size\n"),)),
    Flaw("sharded", "tensor_owners", clause="owners-list", case="partition-type",
         why="returns the owners as a torch tensor: the right ranks, but not the list[int] "
             "documented.",
         expect="returned a Tensor",
         patch=(("    return owners\n", "    return torch.tensor(owners, dtype=torch.long)\n"),)),
    Flaw("sharded", "numpy_owners", clause="owners-list", case="partition-type",
         why="picks the least-loaded rank with numpy.argmin (the lowest rank among ties, as "
             "asked): the right ranks, but each a numpy.int64, not the int of list[int].",
         expect="['int64']",
         patch=((LEAST, "        rank = __import__(\"numpy\").argmin(loads)\n"),)),
    # ------------------------------------------------------------------ the optimizer
    Flaw("sharded", "not_an_optimizer", clause="optimizer", case="scheduler-accepts",
         why="a plain class that keeps its own param_groups and defaults, without subclassing "
             "torch.optim.Optimizer: it trains like AdamW, but StepLR raises TypeError.",
         expect="is not an Optimizer",
         patch=(("class ShardedOptimizer(torch.optim.Optimizer):\n", "class ShardedOptimizer:\n"),
                ("        self.optimizer_cls, self.owners, self.optim = optimizer_cls, {}, None\n",
                 "        self.optimizer_cls, self.defaults = optimizer_cls, dict(kwargs)\n"
                 "        self.param_groups, self.owners, self.optim = [], {}, None\n"
                 "        self.state = {}\n"),
                ("        super().__init__(params, self.optim.defaults)\n",
                 "        params = list(params)\n"
                 "        for group in (params if isinstance(params[0], dict) "
                 "else [{\"params\": params}]):\n"
                 "            self.add_param_group(group)\n"))),
    Flaw("sharded", "duck_typed", clause="scheduler-lr", case="scheduler-accepts",
         why="a wrapper around the local optimizer with every attribute a scheduler reads "
             "(param_groups, defaults, state), but not a torch.optim.Optimizer: any object "
             "with param_groups would do, the student thought.",
         expect="TypeError",
         patch=(("class ShardedOptimizer(torch.optim.Optimizer):\n", "class ShardedOptimizer:\n"),
                ("        super().__init__(params, self.optim.defaults)\n",
                 "        self.defaults, self.state, self.param_groups = self.optim.defaults, {}, []\n"
                 "        params = list(params)\n"
                 "        if params and not isinstance(params[0], dict):\n"
                 "            params = [{\"params\": params}]\n"
                 "        for group in params:\n"
                 "            self.add_param_group(group)\n"))),
    Flaw("sharded", "scheduler_not_synced", clause="sync", case="scheduler-values",
         why="steps the local optimizer without first copying the hyper-parameters of "
             "param_groups into it: a scheduler's lr never reaches the shard.",
         expect="_sync_hyperparameters",
         patch=(("        self._sync_hyperparameters()\n", ""),)),
    Flaw("sharded", "own_state_alias", clause="own-state", case="state-one-rank",
         why="points the optimizer's own state at the local optimizer's (so that code reading "
             "optimizer.state sees something): the same state now lives in two optimizers.",
         expect="its own state stays empty",
         patch=(("        super().__init__(params, self.optim.defaults)\n",
                 "        super().__init__(params, self.optim.defaults)\n"
                 "        self.state = self.optim.state\n"),)),
    Flaw("sharded", "float32_buffer", clause="any-model", case="float64",
         why="broadcasts the shard through a float32 buffer: float64 parameters are rounded on "
             "the way.",
         expect="never through float32",
         patch=((FLAT, FLAT.replace("for p in shard])", "for p in shard]).float()")),)),
    Flaw("sharded", "view_not_reshape", clause="any-model", case="edge-model",
         why="flattens each parameter with view(-1), which fails on a parameter stored "
             "transposed.",
         expect="view size is not compatible",
         patch=((FLAT, FLAT.replace("reshape(-1)", "view(-1)")),)),
    Flaw("sharded", "zero_fill_in_step", clause="any-model", case="edge-model",
         why="gives every parameter without a gradient a zero one before the local step "
             "('so that every parameter is updated'): weight decay now moves the frozen and "
             "unused parameters.",
         expect="in frozen",
         patch=((LOCAL_STEP, "        for g in self.param_groups:\n"
                             "            for p in g[\"params\"]:\n"
                             "                if p.grad is None:\n"
                             "                    p.grad = torch.zeros_like(p)\n" + LOCAL_STEP),)),
    Flaw("sharded", "empty_shard_cat", clause="empty-rank", case="empty-rank",
         why="concatenates each rank's shard without asking whether the rank owns anything: "
             "torch.cat of an empty list raises when a rank owns no parameter.",
         expect="empty-rank",
         patch=(("            if not shard:\n                continue\n", ""),)),
    Flaw("sharded", "user_group_appended", clause="param-groups", case="param-groups",
         why="appends the group as the caller gave it: the full group lacks the defaults the "
             "local optimizer filled in (lr, betas, ...).",
         expect="param_groups[0] has parameters",
         patch=(("        self.param_groups.append({**_hyperparameters(self.optim.param_groups[-1]),\n"
                 "                                  \"params\": params})\n",
                 "        self.param_groups.append({**group, \"params\": params})\n"),)),
    Flaw("sharded", "sorted_sizes", clause="owners", case="state-owners",
         why="partitions the group's sizes sorted largest first ('as the greedy wants them') "
             "and zips the owners with the parameters in their own order: the owners no longer "
             "belong to the parameters partition_parameters gave them to.",
         expect="the owners partition_parameters gives",
         patch=(("        owners = partition_parameters([p.numel() for p in params], "
                 "self.world_size, loads)\n",
                 "        owners = partition_parameters(sorted([p.numel() for p in params], "
                 "reverse=True),\n"
                 "                                      self.world_size, loads)\n"),)),
    Flaw("sharded", "loads_ignored", clause="add-loads", case="add-group-loads",
         why="partitions an added group's parameters as if no rank owned anything yet "
             "(partition_parameters without loads).",
         expect="as if no rank owned anything yet",
         patch=(("        owners = partition_parameters([p.numel() for p in params], "
                 "self.world_size, loads)\n",
                 "        owners = partition_parameters([p.numel() for p in params], "
                 "self.world_size)\n"),)),
    Flaw("sharded", "skip_empty_local_group", clause="local-optimizer", case="local-groups",
         why="adds a group to the local optimizer only where this rank owns some of it: the "
             "local groups no longer line up with param_groups (_sync_hyperparameters zips "
             "them).",
         expect="even a group where this rank owns no parameter",
         patch=((ADD_LOCAL, "        if mine:\n    " + ADD_LOCAL),
                ("        self.param_groups.append({**_hyperparameters(self.optim.param_groups[-1]),\n",
                 "        self.param_groups.append({**self.optim.defaults, **_hyperparameters(group),\n"))),
    Flaw("sharded", "full_state", clause="own-shard", case="state-one-rank",
         why="every rank builds its local optimizer over ALL the parameters of each group: the "
             "numbers are right, but every rank keeps the whole state.",
         expect="is kept on ranks",
         patch=((ADD_LOCAL, ADD_LOCAL.replace("\"params\": mine", "\"params\": params")),)),
    Flaw("sharded", "round_robin_owners", clause="balanced", case="state-balance",
         why="add_param_group deals the group's parameters to the ranks in turn instead of "
             "calling partition_parameters: weights on even ranks, biases on odd ones.",
         expect="unbalanced partition",
         patch=(("        owners = partition_parameters([p.numel() for p in params], "
                 "self.world_size, loads)\n",
                 "        first = len(self.owners)\n"
                 "        owners = [(first + i) % self.world_size for i in range(len(params))]\n"),)),
    Flaw("sharded", "generator_consumed", clause="params", case="init-params",
         why="keeps a list of all the tensors for later, reading `params` before "
             "Optimizer.__init__ does: a generator such as model.parameters() is then empty.",
         expect="empty parameter list",
         patch=(("        super().__init__(params, self.optim.defaults)\n",
                 "        self.all_tensors = [p for p in params if isinstance(p, torch.Tensor)]\n"
                 "        super().__init__(params, self.optim.defaults)\n"),)),
    Flaw("sharded", "hardcoded_adamw", clause="optimizer-cls", case="optimizer-cls",
         why="builds torch.optim.AdamW whatever optimizer_cls says (the notebook's example).",
         expect="unexpected keyword argument 'momentum'",
         patch=(("        self.optim = optimizer_cls([{\"params\": []}], **kwargs)\n",
                 "        self.optim = torch.optim.AdamW([{\"params\": []}], **kwargs)\n"),)),
    Flaw("sharded", "rebuilt_per_group", clause="optimizer-cls", case="optimizer-cls",
         why="rebuilds the local optimizer over all of this rank's parameters whenever a group "
             "is added: the state of the earlier groups is lost.",
         expect="optimizer_cls was called 2 times",
         patch=((ADD_LOCAL, "        if self.optim.param_groups:     # a fresh one over every group\n"
                            "            self.optim = self.optimizer_cls([dict(g) for g in "
                            "self.optim.param_groups])\n" + ADD_LOCAL),)),
    Flaw("sharded", "kwargs_ignored", clause="kwargs", case="step-values",
         why="builds the local optimizer without the kwargs: AdamW's default lr and weight "
             "decay instead of the ones given.",
         expect="with the kwargs given",
         patch=(("        self.optim = optimizer_cls([{\"params\": []}], **kwargs)\n",
                 "        self.optim = optimizer_cls([{\"params\": []}])\n"),)),
    Flaw("sharded", "list_of_tensor", clause="group", case="add-group-tensor",
         why="turns the group's 'params' into a list with list(): a single tensor becomes the "
             "list of its rows.",
         expect="add-group-tensor",
         patch=(("        params = [params] if isinstance(params, torch.Tensor) else list(params)\n",
                 "        params = list(params)\n"),)),
    Flaw("sharded", "group_defaults", clause="add-group", case="add-group-hyper",
         why="hands the local optimizer only the group's parameters, dropping its "
             "hyper-parameters: a group added with its own lr trains with the defaults.",
         expect="its hyper-parameters must be kept",
         patch=((ADD_LOCAL, "        self.optim.add_param_group({\"params\": mine})\n"),)),
    Flaw("sharded", "closure_ignored", clause="closure", case="step-closure",
         why="steps the local optimizer without the closure: it never runs, no gradient is "
             "computed, nothing is returned.",
         expect="called the closure 0 times",
         patch=((LOCAL_STEP, "        loss = self.optim.step()\n"),)),
    Flaw("sharded", "closure_under_no_grad", clause="closure", case="step-closure",
         why="calls the closure itself first ('to have the gradients'), inside step's "
             "torch.no_grad(): its backward fails.",
         expect="step-closure",
         patch=((LOCAL_STEP, "        loss = closure() if closure is not None else None\n"
                             "        self.optim.step()\n"),)),
    Flaw("sharded", "returns_none", clause="closure", case="step-closure",
         why="step() returns nothing: the closure's loss is lost.",
         expect="returned a NoneType",
         patch=(("        return loss\n", "        return None\n"),)),
    Flaw("sharded", "no_sync", clause="every-value", case="step-broadcast",
         why="updates this rank's shard and stops there, in the belief that DDP keeps the "
             "replicas equal: the parameters a rank does not own never change on it.",
         expect="never changed",
         patch=(Def("ShardedOptimizer.step", """
             @torch.no_grad()
             def step(self, closure=None):
                 self._sync_hyperparameters()
                 return self.optim.step(closure) if closure is not None else self.optim.step()
             """),)),
    Flaw("sharded", "broadcast_from_zero", clause="broadcast", case="step-broadcast",
         why="broadcasts every shard from rank 0, as DDP broadcasts the initial model: the "
             "other owners' updates are overwritten with rank 0's stale values.",
         expect="never changed",
         patch=(("            dist.broadcast(flat, src=owner)\n",
                 "            dist.broadcast(flat, src=0)\n"),)),
    Flaw("sharded", "zero_grad_own_shard", clause="zero-all", case="zero-grad-all",
         why="zero_grad resets only this rank's shard (the local optimizer's zero_grad).",
         expect="reset the gradients of ALL parameters",
         patch=(Def("ShardedOptimizer.zero_grad", """
             def zero_grad(self, set_to_none=True):
                 self.optim.zero_grad(set_to_none=set_to_none)
             """),)),
    Flaw("sharded", "always_zeros", clause="set-to-none", case="zero-grad-none",
         why="always fills the gradients with zeros, whatever set_to_none says.",
         expect="set_to_none=True (the default)",
         patch=((ZERO_BRANCH, "                p.grad.detach_()\n"
                              "                p.grad.zero_()\n"),)),
    Flaw("sharded", "always_none", clause="set-to-none", case="zero-grad-zeros",
         why="always sets the gradients to None, whatever set_to_none says.",
         expect="fills every existing gradient with zeros",
         patch=((ZERO_BRANCH, "                p.grad = None\n"),)),
    Flaw("sharded", "zero_fills_missing", clause="no-grad-stays", case="zero-grad-zeros",
         why="with set_to_none=False gives every parameter a zero gradient, also those that "
             "had none (frozen, unused).",
         expect="got one: leave a missing .grad as None",
         patch=(("                if p.grad is None:\n                    continue\n",
                 "                if p.grad is None:\n"
                 "                    if not set_to_none:\n"
                 "                        p.grad = torch.zeros_like(p)\n"
                 "                    continue\n"),)),
    # ------------------------------------------------------------------ checkpoint
    Flaw("checkpoint", "own_state_only", clause="gather", case="consolidate-values",
         why="rank `to` keeps its own state and never gathers the others' (gather_object "
             "called, its result never merged).",
         expect="its 'state' has entries",
         patch=(("        for part in gathered:\n            state.update(part)\n",
                 "        state.update(mine)\n"),)),
    Flaw("checkpoint", "ignores_to", clause="to", case="consolidate-to",
         why="gathers the state on rank 0 whatever `to` says (the usual checkpointing rank).",
         expect="on rank 1",
         patch=((GATHER + NOT_TO,
                 GATHER.replace("self.rank == to", "self.rank == 0").replace("dst=to", "dst=0")
                 + NOT_TO.replace("self.rank != to", "self.rank != 0")),)),
    Flaw("checkpoint", "local_indices", clause="global-indices", case="consolidate-values",
         why="gathers every rank's local state dict keyed by the LOCAL indices (0, 1, ... on "
             "every rank): the entries overwrite each other.",
         expect="map each rank's local indices to the global ones",
         patch=((MINE, "        mine = dict(local[\"state\"])      # the optimizer's own indices\n"),)),
    Flaw("checkpoint", "positional_state", clause="global-indices", case="checkpoint-edge",
         why="pairs the global indices with the local state's entries in order: right while "
             "every parameter has state, shifted as soon as one has none (frozen, unused).",
         expect="its 'state' has entries",
         patch=((MINE, "        mine = dict(zip(glob, local[\"state\"].values()))\n"),)),
    Flaw("checkpoint", "groups_without_hyper", clause="format", case="consolidate-values",
         why="writes the consolidated groups as their parameter indices only, without the "
             "hyper-parameters.",
         expect="param_groups[0]['lr'] is 'missing'",
         patch=(("            groups.append({**_hyperparameters(group), "
                 "\"params\": list(range(index, index + n))})\n",
                 "            groups.append({\"params\": list(range(index, index + n))})\n"),)),
    Flaw("checkpoint", "float32_state", clause="format", case="checkpoint-float64",
         why="stores the consolidated state in float32 to halve the checkpoint: a float64 "
             "model's moments are rounded.",
         expect="in its own dtype",
         patch=((MINE, "        mine = {glob[i]: {k: v.float() if v.is_floating_point() and "
                       "v.dim() else v\n"
                       "                          for k, v in state.items()}\n"
                       "                for i, state in local[\"state\"].items()}\n"),)),
    Flaw("checkpoint", "state_as_lists", clause="format", case="load-round-trip",
         why="turns the state's tensors into Python lists for a portable checkpoint: the "
             "numbers are right, but such a dict does not load into a torch optimizer.",
         expect="cannot be loaded back",
         patch=((MINE, "        mine = {glob[i]: {k: v.tolist() for k, v in state.items()}\n"
                       "                for i, state in local[\"state\"].items()}\n"),)),
    Flaw("checkpoint", "inner_hyperparameters", clause="fresh", case="consolidate-fresh",
         why="takes the hyper-parameters from the local optimizer's state dict, which catches "
             "up with param_groups only at the next step(): after a scheduler's step the "
             "checkpoint holds the learning rate from before it.",
         expect="halving it again",
         patch=(("        for group in self.param_groups:\n"
                 "            n = len(group[\"params\"])\n"
                 "            groups.append({**_hyperparameters(group), \"params\": "
                 "list(range(index, index + n))})\n",
                 "        for group, inner in zip(self.param_groups, local[\"param_groups\"]):\n"
                 "            n = len(group[\"params\"])\n"
                 "            groups.append({**_hyperparameters(inner), \"params\": "
                 "list(range(index, index + n))})\n"),)),
    Flaw("checkpoint", "cached_consolidation", clause="fresh", case="consolidate-fresh",
         why="keeps the consolidated state once built (rank `to` does not rebuild it): a second "
             "consolidation after more steps returns the old state.",
         expect="as it is now",
         patch=((NOT_TO, NOT_TO + "        if self._consolidated is not None:\n"
                                  "            return\n"),)),
    Flaw("checkpoint", "not_cleared", clause="fresh", case="consolidate-other-ranks",
         why="leaves an earlier consolidation in place on the ranks that are not `to` this "
             "time: state_dict() there returns a stale state instead of raising.",
         expect="returned a state dict",
         patch=((NOT_TO, "        if self.rank != to:\n            return\n"),)),
    Flaw("checkpoint", "everyone_keeps", clause="runtime-error",
         case="consolidate-other-ranks",
         why="all-gathers the state and keeps the merged dict on every rank ('any rank can "
             "save'): every rank holds the whole state, which ZeRO was meant to avoid.",
         expect="after consolidate_state_dict()",
         patch=((GATHER + NOT_TO, "        gathered = [None] * self.world_size\n"
                                  "        dist.all_gather_object(gathered, mine)\n"),)),
    Flaw("checkpoint", "local_fallback", clause="runtime-error", case="state-dict-raises",
         why="state_dict() falls back to the local optimizer's state dict when nothing was "
             "consolidated, so that it never fails.",
         expect="before any consolidate_state_dict returned a state dict",
         patch=(("        if self._consolidated is None:\n            raise RuntimeError(",
                 "        if self._consolidated is None:\n"
                 "            return self.optim.state_dict()\n"
                 "            raise RuntimeError("),)),
    Flaw("checkpoint", "assert_instead", clause="runtime-error", case="state-dict-raises",
         why="asserts that a consolidated state exists: AssertionError, not the RuntimeError "
             "documented.",
         expect="raised AssertionError",
         patch=(("        if self._consolidated is None:\n            raise RuntimeError(",
                 "        assert self._consolidated is not None, (\n"
                 "            \"call consolidate_state_dict first\")\n"
                 "        if self._consolidated is None:\n            raise RuntimeError("),)),
    Flaw("checkpoint", "scalars_dropped", clause="load-format", case="load-values",
         why="loads only the state tensors that have elements along a dimension, dropping "
             "0-d ones such as AdamW's step count.",
         expect="load-values",
         patch=((LOAD_ENTRY, "                if index in state_dict[\"state\"]:\n"
                             "                    state[local] = {k: v for k, v in "
                             "state_dict[\"state\"][index].items()\n"
                             "                                    if torch.is_tensor(v) and "
                             "v.dim()}\n"),)),
    Flaw("checkpoint", "keeps_whole_state", clause="load-shard", case="load-shard-only",
         why="also keeps every loaded entry in the optimizer's own state ('for the next "
             "checkpoint'): every rank holds the whole state again.",
         expect="expected only on its owner",
         patch=(("        self.optim.load_state_dict({\"state\": state, \"param_groups\": groups})\n",
                 "        self.optim.load_state_dict({\"state\": state, \"param_groups\": groups})\n"
                 "        every = [p for g in self.param_groups for p in g[\"params\"]]\n"
                 "        self.state.update({every[i]: s for i, s in "
                 "state_dict[\"state\"].items()})\n"),)),
    Flaw("checkpoint", "hyperparameters_local_only", clause="load-hyper", case="load-hyper",
         why="loads the saved groups' hyper-parameters into the local optimizer only, not into "
             "self.param_groups: the next step() copies the old settings back.",
         expect="into self.param_groups too",
         patch=(("            full.update(_hyperparameters(saved))\n", ""),)),
    Flaw("checkpoint", "load_assumes_every_index", clause="load-missing",
         case="checkpoint-edge",
         why="takes every parameter's entry from the state dict, as if every parameter had "
             "state: KeyError for a frozen or unused one.",
         expect="KeyError",
         patch=((LOAD_ENTRY, "                state[local] = state_dict[\"state\"][index]\n"),)),
    Flaw("checkpoint", "rank0_shard", clause="load-own", case="load-values",
         why="keeps rank 0's shard on every rank (the rank that saved the checkpoint): the "
             "local groups no longer match the loaded ones.",
         expect="load-values",
         patch=(("                if self.owners[id(p)] != self.rank:\n                    continue\n",
                 "                if self.owners[id(p)] != 0:\n                    continue\n"),)),
    # ------------------------------------------------------------------ time-varying gradients
    Flaw("sharded", "broadcast_first_grads", clause="varying", case="step-varying",
         why="broadcasts only the parameters that have a gradient (the others do not change), "
             "found once at the first step and again only when a group is added: a branch that "
             "first gets a gradient at step 2 is updated by its owner and never sent.",
         expect="in b.",
         patch=((APPEND_GROUP, APPEND_GROUP + "        self._updated = None      # the groups "
                 "changed: find them again at the next step\n"),
                (ALL_PARAMS, "        if getattr(self, \"_updated\", None) is None:    # the "
                 "parameters AdamW updates\n"
                 "            self._updated = [p for g in self.param_groups for p in g[\"params\"]\n"
                 "                             if p.grad is not None]\n"
                 "        params = self._updated\n"))),
    Flaw("sharded", "zero_grad_first_grads", clause="varying", case="zero-grad-varying",
         why="zero_grad resets a list of the parameters with a gradient, made at its first call "
             "(and again when a group is added): a branch that first gets a gradient later "
             "keeps it, and the next step adds it again.",
         expect="after step 2 and zero_grad()",
         patch=((APPEND_GROUP, APPEND_GROUP + "        self._with_grad = None    # the groups "
                 "changed: find them again\n"),
                Def("ShardedOptimizer.zero_grad",
                    "def zero_grad(self, set_to_none=True):\n"
                    "    \"\"\"Reset the gradients of the parameters that have one.\"\"\"\n"
                    "    if getattr(self, \"_with_grad\", None) is None:  # those with gradients\n"
                    "        self._with_grad = [p for g in self.param_groups for p in g[\"params\"]\n"
                    "                           if p.grad is not None]\n"
                    "    for p in self._with_grad:\n"
                    "        if set_to_none:\n"
                    "            p.grad = None\n"
                    "        else:\n"
                    "            p.grad.detach_()\n"
                    "            p.grad.zero_()\n"))),
    Flaw("checkpoint", "consolidate_first_keys", clause="fresh", case="checkpoint-varying",
         why="keeps the local indices that have state from the first consolidation and "
             "gathers only those later: a parameter whose first gradient came after it never "
             "appears in the consolidated state.",
         expect="missing: [6, 7]",
         patch=((MINE, "        if getattr(self, \"_stateful\", None) is None:   # which local "
                 "indices have state\n"
                 "            self._stateful = sorted(local[\"state\"])\n"
                 "        mine = {glob[i]: local[\"state\"][i] for i in self._stateful}\n"),)),
    Flaw("checkpoint", "load_empty_entries", clause="load-missing", case="checkpoint-resumed",
         why="gives every parameter of the shard an entry when loading, an empty one where the "
             "state dict has none: training is the same (AdamW fills an empty state at the "
             "first gradient), but the next consolidation lists parameters that never had one.",
         expect="not expected: [8, 9]",
         patch=((LOAD_ENTRY, "                state[local] = state_dict[\"state\"].get(index, {})"
                 "   # none yet: empty\n"),)),
]
