"""Known-wrong files of notebook 07, as patches of the solution (see tests/flaws.py)."""
from flaws import Def, Flaw  # noqa: F401

FLAWS = [
    Flaw('checkpoint', 'hyperparameters_local_only', clause='group-s-hyper', case='?',
         why=('load_state_dict loads the '
              "saved groups' hyper-parameters into the local optimizer only, not into "
              "self.param_groups: the next step() copies the param_groups' old settings back into the "
              'local optimizer (_sync_hyperparameters), so the loaded lr is lost.'),
         patch=(
             ("""            full.update(_hyperparameters(saved))
""",
              ''),
         )),
    Flaw('checkpoint', 'ignores_to', clause='afterwards-rank-s', case='?',
         why=('consolidate_state_dict gathers the state on '
              'rank 0 whatever `to` says (the usual checkpointing rank): when asked for to=1, rank 1 '
              'has no consolidated state and state_dict() raises there.'),
         patch=(
             ("""        gathered = [None] * self.world_size if self.rank == to else None
        dist.gather_object(mine, gathered, dst=to)
        if self.rank != to:
""",
              """        gathered = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if self.rank != 0:
"""),
         )),
    Flaw('checkpoint', 'local_indices', clause='local-state-dict', case='?',
         why=('consolidate_state_dict gathers every '
              "rank's local state dict as it is, keyed by the LOCAL indices (0, 1, ... on every rank): "
              "the ranks' entries overwrite each other and the parameters are numbered wrongly."),
         patch=(
             ("""        mine = {glob[i]: state for i, state in local["state"].items()}
""",
              """        mine = dict(local["state"])      # the indices are the optimizer's own
"""),
             ('        order, and every group\'s hyper-parameters (into ``self.param_groups`` too).\n        """\n',
              '        order, and every group\'s hyper-parameters (into ``self.param_groups`` too).\n        Raises:\n            ValueError: the groups do not match (their number, or their sizes).\n        """\n'),
         )),
    Flaw('memory', 'ignores_k', clause='k-bytes-optimizer', case='?',
         why=('bytes_per_device uses the module constant ADAM_K '
              'for the optimizer state instead of its argument k: right for mixed-precision Adam (k = '
              '12), wrong for any other optimizer (k = 8 for fp32 weights plus momentum, say).'),
         patch=(
             ("""    parts = (PARAM_BYTES * num_params, GRAD_BYTES * num_params, k * num_params)
""",
              """    parts = (PARAM_BYTES * num_params, GRAD_BYTES * num_params, ADAM_K * num_params)
"""),
         )),
    Flaw('memory', 'no_value_error', clause='valueerror-stage-not', case='?',
         why=('bytes_per_device treats every stage above 2 '
              "as stage 3 (an if/elif chain whose else is stage 3), so stage=4 returns stage 3's bytes "
              'instead of raising ValueError.'),
         patch=(
             ("""    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0, 1, 2 or 3, not {stage!r}")
""",
              ''),
             ("""    sharded = {0: (), 1: (2,), 2: (1, 2), 3: (0, 1, 2)}[stage]
""",
              """    if stage == 0:
        sharded = ()
    elif stage == 1:
        sharded = (2,)
    elif stage == 2:
        sharded = (1, 2)
    else:
        sharded = (0, 1, 2)
"""),
         )),
    Flaw('memory', 'stage1_grads', clause='stage-0-2', case='?',
         why=('bytes_per_device takes stage 1 (P_os) to '
              'partition the gradients as well as the optimizer states (it mixes up P_os and P_os+g): '
              "stage 1 comes out as 2 Psi + 14 Psi / N_d (16.6 GB for the paper's 7.5B model on 64 "
              'devices, not 31.4).'),
         patch=(
             ("""    sharded = {0: (), 1: (2,), 2: (1, 2), 3: (0, 1, 2)}[stage]
""",
              """    sharded = {0: (), 1: (1, 2), 2: (1, 2), 3: (0, 1, 2)}[stage]
"""),
             ('        order, and every group\'s hyper-parameters (into ``self.param_groups`` too).\n        """\n',
              '        order, and every group\'s hyper-parameters (into ``self.param_groups`` too).\n        Raises:\n            ValueError: the groups do not match (their number, or their sizes).\n        """\n'),
         )),
    Flaw('sharded', 'full_state', clause='rank-builds-optimizer', case='?',
         why=('every rank builds its local optimizer over ALL '
              'the parameters of each group (and steps them all): the numbers are right, since every '
              'rank computes the same update and the broadcasts from the owners change nothing, but '
              'every rank keeps the whole optimizer state: no memory is saved, which was the point.'),
         patch=(
             ("""        self.optim.add_param_group({**_hyperparameters(group), "params": mine})
""",
              """        self.optim.add_param_group({**_hyperparameters(group), "params": params})
"""),
             ('        order, and every group\'s hyper-parameters (into ``self.param_groups`` too).\n        """\n',
              '        order, and every group\'s hyper-parameters (into ``self.param_groups`` too).\n        Raises:\n            ValueError: the groups do not match (their number, or their sizes).\n        """\n'),
         )),
    Flaw('sharded', 'group_defaults', clause='new-parameters-their', case='?',
         why=('add_param_group hands the local optimizer '
              "only the group's parameters, dropping its hyper-parameters: a group added with its own "
              'lr and weight_decay trains with the defaults instead.'),
         patch=(
             ("""        self.optim.add_param_group({**_hyperparameters(group), "params": mine})
""",
              """        self.optim.add_param_group({"params": mine})
"""),
             ('        order, and every group\'s hyper-parameters (into ``self.param_groups`` too).\n        """\n',
              '        order, and every group\'s hyper-parameters (into ``self.param_groups`` too).\n        Raises:\n            ValueError: the groups do not match (their number, or their sizes).\n        """\n'),
         )),
    Flaw('sharded', 'loads_ignored', clause='parameters-are-partitioned', case='?',
         why=("add_param_group partitions the new group's "
              'parameters as if no rank owned anything yet (partition_parameters without loads): the '
              'largest parameter of every added group lands on rank 0, however much it already holds.'),
         patch=(
             ("""        loads = [0] * self.world_size
        for g in self.param_groups:
            for p in g["params"]:
                loads[self.owners[id(p)]] += p.numel()
        owners = partition_parameters([p.numel() for p in params], self.world_size, loads)
""",
              """        owners = partition_parameters([p.numel() for p in params], self.world_size)
"""),
         )),
    Flaw('sharded', 'no_sync', clause='after-step-rank', case='?',
         why=("step() updates this rank's shard and stops there, "
              "in the belief that DDP's gradient all-reduce keeps the replicas equal: the parameters a "
              'rank does not own are never updated on it (the ranks drift apart).'),
         patch=(
             ("""        params = [p for g in self.param_groups for p in g["params"]]
        for owner in range(self.world_size):
            shard = [p for p in params if self.owners[id(p)] == owner]
            if not shard:
                continue
            flat = torch.cat([p.detach().reshape(-1) for p in shard])
            dist.broadcast(flat, src=owner)
            offset = 0
            for p in shard:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            del flat         # freed before the next rank's: at most 1/N of the model extra
""",
              """        # the gradients were averaged (DDP): every replica makes the same update anyway
"""),
             ('        order, and every group\'s hyper-parameters (into ``self.param_groups`` too).\n        """\n',
              '        order, and every group\'s hyper-parameters (into ``self.param_groups`` too).\n        Raises:\n            ValueError: the groups do not match (their number, or their sizes).\n        """\n'),
         )),
    Flaw('sharded', 'not_an_optimizer', clause='shardedoptimizer-torch-optim', case='?',
         why=('ShardedOptimizer is a plain class that '
              'keeps its own param_groups and defaults and adds the groups itself, without subclassing '
              'torch.optim.Optimizer (the behaviour before issue 15): it trains exactly like AdamW, but'
              ' torch.optim.lr_scheduler.StepLR(ShardedOptimizer(...), ...) raises "TypeError: '
              'ShardedOptimizer is not an Optimizer", so no learning-rate scheduler can drive it.'),
         patch=(
             ("""class ShardedOptimizer(torch.optim.Optimizer):
""",
              """class ShardedOptimizer:
"""),
             ("""        self.optimizer_cls, self.owners, self.optim = optimizer_cls, {}, None
""",
              """        self.optimizer_cls, self.defaults = optimizer_cls, dict(kwargs)
        self.param_groups, self.owners, self.optim = [], {}, None
"""),
             ("""        self._consolidated = None
        # TODO: self.optim = optimizer_cls over a placeholder group without parameters; clear
""",
              """        self._consolidated = None
        params = list(params)
        groups = params if params and isinstance(params[0], dict) else [{"params": params}]
        # TODO: self.optim = optimizer_cls over a placeholder group without parameters; clear
"""),
             ("""        super().__init__(params, self.optim.defaults)
""",
              """        for group in groups:
            self.add_param_group(group)
"""),
             ('        order, and every group\'s hyper-parameters (into ``self.param_groups`` too).\n        """\n',
              '        order, and every group\'s hyper-parameters (into ``self.param_groups`` too).\n        Raises:\n            ValueError: the groups do not match (their number, or their sizes).\n        """\n'),
         )),
    Flaw('sharded', 'scheduler_not_synced', clause='learning-rate-scheduler', case='?',
         why=('step() steps the local optimizer '
              'without first copying the hyper-parameters of param_groups into it: a learning-rate '
              "scheduler changes the lr in ShardedOptimizer.param_groups, but every rank's local "
              'optimizer keeps training with the initial lr (without a scheduler it trains exactly like'
              ' AdamW).'),
         patch=(
             ("""        self._sync_hyperparameters()
""",
              ''),
             ('        order, and every group\'s hyper-parameters (into ``self.param_groups`` too).\n        """\n',
              '        order, and every group\'s hyper-parameters (into ``self.param_groups`` too).\n        Raises:\n            ValueError: the groups do not match (their number, or their sizes).\n        """\n'),
         )),
    Flaw('sharded', 'unbalanced', clause='greedy-largest-first', case='?',
         why=('partition_parameters deals the parameters out '
              'round-robin by COUNT (parameter i to rank i % world_size), ignoring their sizes: with '
              'weight, bias, weight, bias, ... and 2 ranks, rank 0 gets every weight matrix and rank 1 '
              'every bias vector.'),
         patch=(
             ("""    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
""",
              """    for i in range(len(numels)):
        rank = i % world_size
"""),
             ('        order, and every group\'s hyper-parameters (into ``self.param_groups`` too).\n        """\n',
              '        order, and every group\'s hyper-parameters (into ``self.param_groups`` too).\n        Raises:\n            ValueError: the groups do not match (their number, or their sizes).\n        """\n'),
         )),
    Flaw('sharded', 'unsorted_greedy', clause='greedy-largest-first', case='?',
         why=('partition_parameters gives each parameter '
              'to the least-loaded rank, but in the order they come instead of largest first: on the '
              "probe's model the shards still come out within 10% of each other, but sizes [1, 1, 10] "
              'on 2 ranks give loads 11 and 1.'),
         patch=(
             ("""    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
""",
              """    for i in range(len(numels)):
"""),
         )),
    Flaw('sharded', 'zero_grad_own_shard', clause='reset-gradients-all', case='?',
         why=('zero_grad resets only the gradients of'
              " this rank's shard (the local optimizer's zero_grad): the other parameters keep their "
              'gradients, which the next backward adds to.'),
         patch=(
             ("""        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_()
                    p.grad.zero_()
""",
              """        self.optim.zero_grad(set_to_none=set_to_none)
"""),
         )),
]

