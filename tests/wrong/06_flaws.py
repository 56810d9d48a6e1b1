"""Known-wrong files of notebook 06, as patches of the solution (see tests/flaws.py): one flaw
each, the way a student would write it, each naming the clause of the contract
(exercise_utils/build_your_own_ddp/requirements.py) it breaks and the case that rejects it."""
from flaws import Def, Flaw  # noqa: F401

INIT_ENV = (
    '    rank = _first_env(("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK"), 0)\n'
    '    world_size = _first_env(("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"), 1)\n'
    '    local_rank = _first_env(("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK"), 0)\n')
SAMPLER = ("    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,\n"
           "                                 seed=seed, drop_last=True)\n")
STUB = "{}\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"    # (as released)
# part 2 of the file as released: broadcast_parameters and DistributedOptimizer
PART2_STUBS = (Def("broadcast_parameters", STUB.format("def broadcast_parameters(model, root=0):")),
               Def("DistributedOptimizer.__init__",
                   STUB.format("def __init__(self, optimizer, model, strategy=\"naive\"):")),
               Def("DistributedOptimizer.step", STUB.format("def step(self, closure=None):")),
               Def("DistributedOptimizer.zero_grad",
                   STUB.format("def zero_grad(self, set_to_none=True):")))
BROADCAST = ("    with torch.no_grad():\n"
             "        for tensor in list(model.parameters()) + list(model.buffers()):\n"
             "            dist.broadcast(tensor, src=root)\n")
HOOKS_OVERLAP = ("        for p in module.parameters():\n"
                 "            if p.requires_grad:\n"
                 "                p.register_post_accumulate_grad_hook(self._on_grad_ready)\n")
BUCKET_RAISE = '''        arrived, self._arrived = self._arrived, set()
        missing = [name for names, params in zip(self.buckets, self._bucket_params)
                   for name, p in zip(names, params) if id(p) not in arrived]
        if arrived and missing:
            raise RuntimeError(
                f"BucketDDP: the trainable parameters {missing} got no gradient in this "
'''

FLAWS = [
    # ------------------------------------------------------------------ api: init
    Flaw("api", "init_returns_without_group", clause="join", case="init-torchrun",
         why="a single process needs no process group, so init returns (0, 1, device) at once "
             "when the world size is 1; partition_dataset and broadcast_parameters then fail.",
         expect="joined no process group",
         patch=(("    if not dist.is_initialized():\n",
                 "    if world_size == 1:\n        return 0, 1, device\n"
                 "    if not dist.is_initialized():\n"),)),
    Flaw("api", "init_torchrun_only", clause="launcher-env", case="init-mpiexec",
         why="init reads only torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK), as most "
             "tutorials do. Under torchrun it works; under mpiexec (PMI_RANK, PMI_SIZE) every "
             "process believes it is rank 0 of 1.",
         expect="under MPICH's mpiexec",
         patch=((INIT_ENV,
                 '    rank = int(os.environ.get("RANK", 0))\n'
                 '    world_size = int(os.environ.get("WORLD_SIZE", 1))\n'
                 '    local_rank = int(os.environ.get("LOCAL_RANK", 0))\n'),)),
    Flaw("api", "init_no_openmpi", clause="launcher-env", case="init-openmpi",
         why="init knows torchrun's and MPICH's variables but not Open MPI's: under Open MPI's "
             "mpiexec every process is rank 0 of 1.",
         expect="under Open MPI's mpiexec",
         patch=((INIT_ENV,
                 '    rank = _first_env(("RANK", "PMI_RANK"), 0)\n'
                 '    world_size = _first_env(("WORLD_SIZE", "PMI_SIZE"), 1)\n'
                 '    local_rank = _first_env(("LOCAL_RANK", "MPI_LOCALRANKID"), 0)\n'),)),
    Flaw("api", "init_no_default_address", clause="no-launcher", case="init-no-launcher",
         why="init leaves MASTER_ADDR and MASTER_PORT to the launcher: a script started with "
             "plain `python` has neither, and init_process_group('env://') fails.",
         expect="without any launcher",
         patch=(('    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")\n'
                 '    os.environ.setdefault("MASTER_PORT", "29500")\n', ""),)),
    Flaw("api", "init_nccl_default", clause="backend", case="init-backend-default",
         why="backend None means NCCL, DDP's backend, whether or not there is a GPU: on a CPU "
             "machine init_process_group fails.",
         expect="backend left None",
         patch=(('        backend = "nccl" if torch.cuda.is_available() else "gloo"\n',
                 '        backend = "nccl"\n'),)),
    Flaw("api", "init_always_gloo", clause="backend", case="init-gpu-device",
         why="backend None always means gloo, as on the course's laptops: on a GPU machine "
             "the gradients never use NCCL.",
         expect="expected nccl",
         patch=(('        backend = "nccl" if torch.cuda.is_available() else "gloo"\n',
                 '        backend = "gloo"\n'),)),
    Flaw("api", "init_global_rank_device", clause="returns", case="init-gpu-device",
         why="the device is cuda:<rank>, the global rank: right on one host, but on the second "
             "host the ranks 2 and 3 ask for GPUs 2 and 3 of a 2-GPU machine.",
         expect="returned the device 'cuda:2'",
         patch=(('        device = torch.device("cuda", local_rank)\n',
                 '        device = torch.device("cuda", rank)\n'),)),
    Flaw("api", "init_no_set_device", clause="returns", case="init-gpu-device",
         why="init returns cuda:<local rank> but never makes it the current device: NCCL then "
             "guesses the device, and every rank of a host uses GPU 0.",
         expect="called torch.cuda.set_device with []",
         patch=(("        torch.cuda.set_device(device)\n", ""),)),
    Flaw("api", "init_initialises_twice", clause="initialise-once", case="init-twice",
         why="init always calls init_process_group: a second call (a library that calls init "
             "again) raises.",
         expect="trying to initialize the default process group twice",
         patch=(("    if not dist.is_initialized():\n"
                 '        dist.init_process_group(backend, init_method="env://", rank=rank,\n'
                 "                                world_size=world_size,\n"
                 "                                timeout=datetime.timedelta(seconds=timeout_s))\n",
                 '    dist.init_process_group(backend, init_method="env://", rank=rank,\n'
                 "                            world_size=world_size,\n"
                 "                            timeout=datetime.timedelta(seconds=timeout_s))\n"),)),
    Flaw("api", "init_ignores_timeout", clause="timeout", case="init-timeout",
         why="init never passes timeout_s on: the group keeps gloo's default of 30 minutes, and "
             "a bug hangs that long.",
         expect="pass timeout=datetime.timedelta(seconds=timeout_s)",
         patch=(("                                world_size=world_size,\n"
                 "                                timeout=datetime.timedelta(seconds=timeout_s))\n",
                 "                                world_size=world_size)\n"),)),
    # ------------------------------------------------------------------ api: broadcast
    Flaw("api", "no_broadcast", clause="bcast-copy", case="bcast-values",
         why="broadcast_parameters does nothing, in the belief that seeding every process alike "
             "makes the replicas equal; but the ranks' models were initialised from different "
             "random states, so they start, and stay, different.",
         expect="every rank must hold rank 0's parameters",
         patch=((BROADCAST, "    return      # every rank seeds alike: the replicas are equal\n"),)),
    Flaw("api", "bcast_parameters_only", clause="bcast-copy", case="bcast-buffers",
         why="broadcasts model.parameters() only: BatchNorm's running statistics stay each "
             "rank's own.",
         expect="buffers too",
         patch=(("        for tensor in list(model.parameters()) + list(model.buffers()):\n",
                 "        for tensor in model.parameters():\n"),)),
    Flaw("api", "bcast_root_ignored", clause="bcast-root", case="bcast-root",
         why="broadcasts from rank 0 whatever root says.",
         expect="every rank must hold rank 1's parameters",
         patch=(("            dist.broadcast(tensor, src=root)\n",
                 "            dist.broadcast(tensor, src=0)\n"),)),
    Flaw("api", "bcast_float32_buffer", clause="bcast-any-model", case="bcast-float64",
         why="one broadcast of one float32 buffer holding every parameter (fewer messages), "
             "buffers one by one: a float64 model comes back rounded.",
         expect="float64",
         patch=((BROADCAST,
                 "    with torch.no_grad():\n"
                 "        params = list(model.parameters())\n"
                 "        flat = torch.cat([p.reshape(-1) for p in params]).float()\n"
                 "        dist.broadcast(flat, src=root)\n"
                 "        for p, piece in zip(params, _unflatten_dense_tensors(flat, params)):\n"
                 "            p.copy_(piece)\n"
                 "        for tensor in model.buffers():\n"
                 "            dist.broadcast(tensor, src=root)\n"),)),
    Flaw("api", "bcast_counter_as_float", clause="bcast-any-model", case="bcast-int-buffer",
         why="every tensor travels as float32 (the dtype gloo handles best, the student "
             "thought) and is copied back: BatchNorm's int64 counter above 2**24 is rounded.",
         expect="integer buffers exactly",
         patch=(("            dist.broadcast(tensor, src=root)\n",
                 "            buf = tensor.float()\n"
                 "            dist.broadcast(buf, src=root)\n"
                 "            tensor.copy_(buf)\n"),)),
    Flaw("api", "bcast_rebinds", clause="bcast-copy", case="bcast-in-place",
         why="receives into a fresh copy and rebinds tensor.data to it: the values are right, "
             "but the model's tensors are new ones and an optimizer built before updates the old.",
         expect="replaced the model's tensors",
         patch=(("            dist.broadcast(tensor, src=root)\n",
                 "            received = tensor.detach().clone()\n"
                 "            dist.broadcast(received, src=root)\n"
                 "            tensor.data = received\n"),)),
    # ------------------------------------------------------------------ api: partition
    Flaw("api", "partition_no_value_error", clause="partition-raises",
         case="partition-indivisible",
         why="rounds the per-rank batch down instead of refusing a batch size the world size "
             "does not divide: the global batch silently shrinks.",
         expect="expected ValueError",
         patch=(("    if batch_size % world_size:\n"
                 '        raise ValueError(f"batch_size {batch_size} is not divisible by the world size "\n'
                 '                         f"{world_size}: every rank must take the same share of a step")\n',
                 ""),)),
    Flaw("api", "per_rank_is_batch_size", clause="partition-global-batch",
         case="partition-sizes",
         why="treats batch_size as each rank's batch (as the PyTorch DDP tutorial does): the "
             "global batch grows with the number of ranks.",
         expect="returned per_rank_batch=12",
         patch=(("    per_rank = batch_size // world_size\n", "    per_rank = batch_size\n"),)),
    Flaw("api", "returns_global_batch", clause="partition-returns", case="partition-sizes",
         why="batches by batch_size // world_size but returns batch_size as the second value.",
         expect="returned per_rank_batch=12",
         patch=(("    return DataLoader(dataset, batch_size=per_rank, sampler=sampler, drop_last=True), per_rank\n",
                 "    return DataLoader(dataset, batch_size=per_rank, sampler=sampler, drop_last=True), batch_size\n"),)),
    Flaw("api", "sampler_pads", clause="partition-same-count", case="partition-sizes",
         why="DistributedSampler with its default drop_last=False pads the shares with repeated "
             "examples (47 -> 48): every rank yields one step more than len(dataset) // "
             "batch_size, the last one with a repeated example.",
         expect="expected 6 and 3 batches",
         patch=((SAMPLER, SAMPLER.replace(", drop_last=True)", ")")),)),
    Flaw("api", "partition_rank_seed", clause="partition-step-k", case="partition-disjoint",
         why="seeds each rank's shuffle with seed + rank, so that the ranks see different "
             "data: their shares overlap.",
         expect="the shares must be disjoint",
         patch=((SAMPLER, SAMPLER.replace("seed=seed,", "seed=seed + rank,")),)),
    Flaw("api", "partition_unshuffled", clause="partition-shuffled", case="partition-shuffled",
         why="DistributedSampler(shuffle=False): the ranks split the dataset in its original "
             "order.",
         expect="original order",
         patch=((SAMPLER, SAMPLER.replace("shuffle=True", "shuffle=False")),)),
    Flaw("api", "partition_unshuffled_part2_unfinished", clause="partition-shuffled",
         case="partition-shuffled",
         why="the same unshuffled sampler, with broadcast_parameters and DistributedOptimizer "
             "still as released: a finished piece's failure is shown, not hidden behind the "
             "unfinished ones (issue 39).",
         expect="original order",
         patch=((SAMPLER, SAMPLER.replace("shuffle=True", "shuffle=False")), *PART2_STUBS)),
    Flaw("api", "contiguous_blocks", clause="partition-step-k", case="partition-same-steps",
         why="shuffles with a generator seeded by `seed` and gives each rank one contiguous "
             "block of the order: disjoint, the same number of steps, but step k's global batch "
             "now depends on the number of ranks.",
         expect="with 2 ranks, but on",
         patch=((SAMPLER + "    return DataLoader(dataset, batch_size=per_rank, sampler=sampler, "
                 "drop_last=True), per_rank\n",
                 "    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))\n"
                 "    share = len(dataset) // world_size\n"
                 "    mine = order[rank * share:(rank + 1) * share].tolist()\n"
                 "    subset = torch.utils.data.Subset(dataset, mine)\n"
                 "    return DataLoader(subset, batch_size=per_rank, shuffle=False, drop_last=True), "
                 "per_rank\n"),)),
    Flaw("api", "ignores_seed", clause="partition-seed", case="partition-seed",
         why="builds its DistributedSampler without passing `seed` on (the sampler's default is "
             "0): the same order for every seed.",
         expect="gave the same batches",
         patch=((SAMPLER, SAMPLER.replace("seed=seed, ", "")),)),
    # ------------------------------------------------------------------ api: optimizer
    Flaw("api", "dopt_steps_first", clause="dopt-step", case="dopt-naive",
         why="step() takes the local optimizer's step first and averages afterwards: every rank "
             "steps with its own gradients.",
         expect="expected ['optimizer.zero_grad(set_to_none=True)', 'backward', 'naive",
         patch=(("        self.reduce(self.params)\n        stepped = self.optimizer.step()\n",
                 "        stepped = self.optimizer.step()\n        self.reduce(self.params)\n"),)),
    Flaw("api", "dopt_always_naive", clause="dopt-strategy", case="dopt-flat",
         why="the strategy argument is kept but never used: step() always calls "
             "allreduce_naive.",
         expect="'flat of 10 gradients'",
         patch=(("        self.reduce = _reduce_function(strategy)\n",
                 "        self.reduce = allreduce_naive\n"),)),
    Flaw("api", "dopt_names_only", clause="dopt-strategy", case="dopt-callable",
         why="looks the strategy up in a dict of names, so a function passed as strategy "
             "raises KeyError.",
         expect="dopt-callable",
         patch=(("        self.reduce = _reduce_function(strategy)\n",
                 '        self.reduce = {"naive": allreduce_naive, "flat": allreduce_flat}[strategy]\n'),)),
    Flaw("api", "dopt_ignores_closure", clause="dopt-closure", case="dopt-closure",
         why="step(closure=None) accepts a closure and never calls it: the step uses the "
             "previous step's gradients.",
         expect="dopt.step(closure)",
         patch=(("        if closure is not None:\n"
                 "            with torch.enable_grad():\n"
                 "                loss = closure()\n", ""),)),
    Flaw("api", "dopt_closure_to_optimizer", clause="dopt-closure", case="dopt-closure",
         why="averages, then hands the closure to optimizer.step, as torch.optim's wrappers do: "
             "the closure recomputes local gradients after the averaging.",
         expect="dopt.step(closure)",
         patch=(Def("DistributedOptimizer.step", '''
             def step(self, closure=None):
                 """Average the gradients over the ranks, then take the local optimizer's step."""
                 self.reduce(self.params)
                 return self.optimizer.step(closure)
             '''),)),
    Flaw("api", "dopt_closure_loss_dropped", clause="dopt-closure", case="dopt-closure",
         why="calls the closure first, averages and steps, but returns what optimizer.step() "
             "returns (None), not the closure's loss.",
         expect="expected the closure's loss",
         patch=(("        return loss if closure is not None else stepped\n",
                 "        return stepped\n"),)),
    Flaw("api", "dopt_zero_grad_ignores_argument", clause="dopt-zero-grad",
         case="dopt-zero-grad",
         why="zero_grad(set_to_none=True) calls the optimizer's zero_grad() without passing "
             "set_to_none on: set_to_none=False still drops the gradients.",
         expect="optimizer.zero_grad(set_to_none=False)",
         patch=(("        self.optimizer.zero_grad(set_to_none=set_to_none)\n",
                 "        self.optimizer.zero_grad()\n"),)),
    Flaw("api", "dopt_zero_grad_default_false", clause="dopt-zero-grad", case="dopt-naive",
         why="zero_grad's default is set_to_none=False (the old torch default): gradients are "
             "zeroed instead of dropped.",
         expect="optimizer.zero_grad(set_to_none=True)",
         patch=(("    def zero_grad(self, set_to_none=True):\n",
                 "    def zero_grad(self, set_to_none=False):\n"),)),
    # ------------------------------------------------------------------ naive
    Flaw("naive", "sum_not_averaged", clause="average", case="naive-values",
         why="sums each gradient over the ranks with one all_reduce per parameter but never "
             "divides by the world size.",
         expect="gradients summed, not averaged?",
         patch=(("            dist.all_reduce(p.grad)\n            p.grad.div_(world_size)\n",
                 "            dist.all_reduce(p.grad)          # the sum over ranks\n"),)),
    Flaw("naive", "one_flat_buffer", clause="one-per-parameter", case="naive-calls",
         why="averages everything with one flat buffer, the faster way, although this stage "
             "asks for one all_reduce per parameter.",
         expect="one all_reduce per parameter with a gradient",
         patch=(Def("allreduce_naive", '''
             def allreduce_naive(params):
                 grads = [p.grad for p in params if p.grad is not None]
                 flat = _flatten_dense_tensors(grads)
                 dist.all_reduce(flat)
                 flat.div_(dist.get_world_size())
                 for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
                     grad.copy_(synced)
             '''),)),
    Flaw("naive", "zero_fills_none", clause="skip-none", case="naive-no-grad",
         why="gives every parameter without a gradient a zero one and all-reduces it too, so "
             "that every rank makes the same calls: frozen and unused parameters now have "
             "gradients.",
         expect="the parameters without a gradient were []",
         patch=(("        if p.grad is not None:\n"
                 "            dist.all_reduce(p.grad)\n            p.grad.div_(world_size)\n",
                 "        if p.grad is None:\n            p.grad = torch.zeros_like(p)\n"
                 "        dist.all_reduce(p.grad)\n        p.grad.div_(world_size)\n"),)),
    Flaw("naive", "requires_grad_filter", clause="skip-none", case="naive-unused",
         why="skips the parameters with requires_grad False instead of those whose grad is "
             "None: a trainable parameter the forward did not use has grad None, and "
             "dist.all_reduce(None) raises.",
         expect="in check case 'naive-unused'",
         patch=(("        if p.grad is not None:\n", "        if p.requires_grad:\n"),)),
    Flaw("naive", "rebinds_gradient", clause="average", case="naive-in-place",
         why="divides out of place, p.grad = p.grad / world_size: right values in new tensors.",
         expect="new gradient tensors",
         patch=(("            p.grad.div_(world_size)\n",
                 "            p.grad = p.grad / world_size\n"),)),
    Flaw("naive", "view_flat", clause="any-gradient", case="naive-edge-model",
         why="all-reduces a flat view of each gradient (p.grad.view(-1)), which fails on a "
             "gradient stored transposed.",
         expect="in check case 'naive-edge-model'",
         patch=(("            dist.all_reduce(p.grad)\n            p.grad.div_(world_size)\n",
                 "            flat = p.grad.view(-1)\n"
                 "            dist.all_reduce(flat)\n            flat.div_(world_size)\n"),)),
    Flaw("naive", "contiguous_copy", clause="any-model", case="naive-edge-model",
         why="all-reduces p.grad.contiguous() (gloo wants contiguous tensors, the student "
             "thought) and divides that: for a gradient stored transposed it is a copy, and the "
             "average never reaches p.grad.",
         expect="in the gradient of proj",
         patch=(("            dist.all_reduce(p.grad)\n            p.grad.div_(world_size)\n",
                 "            g = p.grad.contiguous()\n"
                 "            dist.all_reduce(g)\n            g.div_(world_size)\n"),)),
    Flaw("naive", "float32_copy", clause="any-gradient", case="naive-float64",
         why="reduces a float32 copy of each gradient (gloo's usual dtype) and copies it back: "
             "float64 gradients are rounded.",
         expect="float64",
         patch=(("            dist.all_reduce(p.grad)\n            p.grad.div_(world_size)\n",
                 "            g = p.grad.float()\n            dist.all_reduce(g)\n"
                 "            p.grad.copy_(g / world_size)\n"),)),
    # ------------------------------------------------------------------ flat
    Flaw("flat", "no_copy_back", clause="copy-back", case="flat-values",
         why="all-reduces and averages a torch.cat copy of the gradients, then 'copies back' by "
             "rebinding the loop variable (grad = piece): the gradients stay local.",
         expect="Copy the reduced values back into each p.grad",
         patch=(("    for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):\n"
                 "        grad.copy_(synced)\n",
                 "    for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):\n"
                 "        grad = synced\n"),)),
    Flaw("flat", "chunked_buffer", clause="one-buffer", case="flat-one-buffer",
         why="all-reduces the flat buffer in chunks of at most 64 elements, to bound the "
             "memory of one message: several messages instead of one.",
         expect="exactly one all_reduce of one flat buffer",
         patch=(("    dist.all_reduce(flat)\n",
                 "    for chunk in flat.split(64):\n        dist.all_reduce(chunk)\n"),)),
    Flaw("flat", "zero_fills_none", clause="skip-none", case="flat-no-grad",
         why="puts zeros in the flat buffer for every parameter without a gradient (and gives "
             "it a zero gradient), so that the buffer has the same layout everywhere.",
         expect="the parameters without a gradient were []",
         patch=(("    grads = [p.grad for p in params if p.grad is not None]\n",
                 "    for p in params:\n        if p.grad is None:\n"
                 "            p.grad = torch.zeros_like(p)\n    grads = [p.grad for p in params]\n"),)),
    Flaw("flat", "requires_grad_filter", clause="skip-none", case="flat-unused",
         why="collects the gradients of the parameters with requires_grad True: a trainable "
             "parameter without gradient puts None in the list, and flattening it raises.",
         expect="in check case 'flat-unused'",
         patch=(("    grads = [p.grad for p in params if p.grad is not None]\n",
                 "    grads = [p.grad for p in params if p.requires_grad]\n"),)),
    Flaw("flat", "copies_back_by_position", clause="copy-back", case="flat-unused",
         why="flattens the gradients that exist, but copies the pieces back walking over the "
             "trainable parameters: after a parameter without gradient every piece lands on the "
             "wrong parameter.",
         expect="in the gradient of out.weight",
         patch=(("    for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):\n"
                 "        grad.copy_(synced)\n",
                 "    offset = 0\n"
                 "    for p in params:\n"
                 "        if p.requires_grad:\n"
                 "            n = p.numel()\n"
                 "            piece = flat[offset:offset + n]\n"
                 "            if p.grad is not None and piece.numel() == n:\n"
                 "                p.grad.copy_(piece.view_as(p.grad))\n"
                 "            offset += n\n"),)),
    Flaw("flat", "rebinds_views", clause="in-place", case="flat-in-place",
         why="points each p.grad at its view of the flat buffer (p.grad = view) instead of "
             "copying into it.",
         expect="new gradient tensors",
         patch=(("    grads = [p.grad for p in params if p.grad is not None]\n",
                 "    with_grad = [p for p in params if p.grad is not None]\n"
                 "    grads = [p.grad for p in with_grad]\n"),
                ("    for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):\n"
                 "        grad.copy_(synced)\n",
                 "    for p, synced in zip(with_grad, _unflatten_dense_tensors(flat, grads)):\n"
                 "        p.grad = synced\n"))),
    Flaw("flat", "vector_to_parameters", clause="in-place", case="flat-in-place",
         why="flattens with torch.nn.utils.parameters_to_vector (on contiguous gradients, as "
             "it needs) and puts the averages back with vector_to_parameters, which repoints "
             "each gradient's .data at its slice of the buffer instead of copying into it.",
         expect="new gradient tensors",
         patch=(Def("allreduce_flat", '''
             def allreduce_flat(params):
                 grads = [p.grad for p in params if p.grad is not None]
                 if grads:
                     dense = [g.contiguous() for g in grads]   # parameters_to_vector views
                     vec = torch.nn.utils.parameters_to_vector(dense)
                     dist.all_reduce(vec)
                     vec /= dist.get_world_size()
                     torch.nn.utils.vector_to_parameters(vec, dense)
             '''),)),
    Flaw("flat", "view_flatten", clause="any-gradient", case="flat-edge-model",
         why="flattens with torch.cat of g.view(-1): a gradient stored transposed cannot be "
             "viewed flat.",
         expect="in check case 'flat-edge-model'",
         patch=(("    flat = _flatten_dense_tensors(grads)\n",
                 "    flat = torch.cat([g.view(-1) for g in grads])\n"),)),
    Flaw("flat", "float32_buffer", clause="any-gradient", case="flat-float64",
         why="a float32 flat buffer (half the bytes of float64): float64 gradients are rounded "
             "on the way.",
         expect="float64",
         patch=(("    flat = _flatten_dense_tensors(grads)\n",
                 "    flat = _flatten_dense_tensors(grads).float()\n"),)),
    Flaw("flat", "preallocated_float32", clause="any-model", case="flat-float64",
         why="preallocates the flat buffer with torch.zeros(total) (float32, torch's default "
             "dtype) and copies the gradients in: float64 gradients are rounded.",
         expect="float64",
         patch=(("    flat = _flatten_dense_tensors(grads)\n",
                 "    flat = torch.zeros(sum(g.numel() for g in grads))\n"
                 "    offset = 0\n"
                 "    for g in grads:\n"
                 "        flat[offset:offset + g.numel()].copy_(g.reshape(-1))\n"
                 "        offset += g.numel()\n"),)),
    # ------------------------------------------------------------------ overlap
    Flaw("overlap", "no_broadcast", clause="broadcast-and-hooks", case="overlap-broadcast",
         why="registers its hooks but does not broadcast rank 0's parameters and buffers at "
             "construction: ranks that start from different models stay different.",
         expect="right after OverlapDDP(model) every rank must hold rank 0's",
         patch=(("        broadcast_parameters(module)\n        self._pending = []\n",
                 "        self._pending = []\n"),)),
    Flaw("overlap", "hooks_per_module", clause="broadcast-and-hooks", case="overlap-calls",
         why="registers the hooks module by module (modules(), parameters(recurse=False)): the "
             "tied weight, owned by two modules, gets two hooks and is all-reduced twice.",
         expect="expected one all_reduce per parameter with a gradient",
         patch=((HOOKS_OVERLAP,
                 "        for m in module.modules():\n"
                 "            for p in m.parameters(recurse=False):\n"
                 "                if p.requires_grad:\n"
                 "                    p.register_post_accumulate_grad_hook(self._on_grad_ready)\n"),)),
    Flaw("overlap", "blocking_in_hook", clause="hook-async", case="overlap-async",
         why="the hook all-reduces each gradient with a blocking dist.all_reduce (and divides at "
             "once): right numbers, but backward stops at every hook.",
         expect="are blocking (async_op=False)",
         patch=(("        self._pending.append((param, dist.all_reduce(param.grad, async_op=True)))\n",
                 "        dist.all_reduce(param.grad)\n"
                 "        param.grad.div_(dist.get_world_size())\n"),)),
    Flaw("overlap", "wait_in_hook", clause="hook-async", case="overlap-async",
         why="starts the all_reduce with async_op=True but waits for it in the hook at once, "
             "as blocking as a blocking call.",
         expect="waited for an all_reduce during backward",
         patch=(("        self._pending.append((param, dist.all_reduce(param.grad, async_op=True)))\n",
                 "        work = dist.all_reduce(param.grad, async_op=True)\n"
                 "        work.wait()\n"
                 "        self._pending.append((param, work))\n"),)),
    Flaw("overlap", "launch_in_finish", clause="hook-async", case="overlap-during-backward",
         why="the hook only notes the parameter; finish_gradient_synchronization starts every "
             "all_reduce (async) and waits: nothing travels during backward.",
         expect="after backward had finished",
         patch=(("        self._pending.append((param, dist.all_reduce(param.grad, async_op=True)))\n",
                 "        self._pending.append((param, None))\n"),
                ("        for param, work in self._pending:\n"
                 "            work.wait()\n"
                 "            param.grad.div_(world_size)\n",
                 "        works = [(p, dist.all_reduce(p.grad, async_op=True)) for p, _ in self._pending]\n"
                 "        for param, work in works:\n"
                 "            work.wait()\n"
                 "            param.grad.div_(world_size)\n"))),
    Flaw("overlap", "no_division", clause="finish", case="overlap-values",
         why="waits for every handle but forgets to divide: the sums, world_size times the "
             "average.",
         expect="gradients summed, not averaged?",
         patch=(("            work.wait()\n            param.grad.div_(world_size)\n",
                 "            work.wait()\n"),)),
    Flaw("overlap", "pending_not_cleared", clause="finish", case="overlap-second-step",
         why="never clears the list of pending (parameter, handle) pairs: from the second step on "
             "it waits for the old handles again and divides the new gradients once more per "
             "earlier step.",
         expect="in step 1 (step 0 was right",
         patch=(("            param.grad.div_(world_size)\n        self._pending.clear()\n",
                 "            param.grad.div_(world_size)\n"),)),
    Flaw("overlap", "float32_staging", clause="any-model", case="overlap-float64",
         why="copies each gradient into a preallocated staging buffer (torch.zeros(numel), "
             "float32 by default) and all-reduces that, so that backward cannot touch what is "
             "in flight: float64 gradients are rounded.",
         expect="float64",
         patch=(("        self._pending.append((param, dist.all_reduce(param.grad, async_op=True)))\n",
                 "        buf = torch.zeros(param.numel())\n"
                 "        buf.copy_(param.grad.reshape(-1))\n"
                 "        self._pending.append((param, buf, dist.all_reduce(buf, async_op=True)))\n"),
                ("        for param, work in self._pending:\n"
                 "            work.wait()\n"
                 "            param.grad.div_(world_size)\n",
                 "        for param, buf, work in self._pending:\n"
                 "            work.wait()\n"
                 "            param.grad.copy_(buf.view_as(param.grad) / world_size)\n"))),
    # ------------------------------------------------------------------ buckets
    Flaw("buckets", "forward_order", clause="reverse-order", case="buckets-packing",
         why="packs the parameters in registration (forward) order: the first bucket is the "
             "last to fill.",
         expect="expected reverse registration order",
         patch=(("        for name, p in reversed(named):\n", "        for name, p in named:\n"),)),
    Flaw("buckets", "closed_at_cap", clause="greedy", case="buckets-exact-cap",
         why="starts a new bucket as soon as the next parameter would bring the bucket TO the "
             "cap (>=), so a bucket never holds exactly the cap.",
         expect="a bucket may hold exactly the cap",
         patch=(("            if current and used + nbytes > cap:\n",
                 "            if current and used + nbytes >= cap:\n"),)),
    Flaw("buckets", "cap_decimal_mb", clause="cap-mib", case="buckets-cap-mib",
         why="reads bucket_cap_mb in decimal megabytes (bucket_cap_mb * 10**6 bytes) instead of "
             "MiB.",
         expect="bucket_cap_mb * 10**6 bytes",
         patch=(("        cap = bucket_cap_mb * 1024 * 1024\n", "        cap = bucket_cap_mb * 1e6\n"),)),
    Flaw("buckets", "four_bytes", clause="bytes", case="buckets-float64",
         why="counts 4 bytes per element, as for float32: float64 buckets hold twice the cap.",
         expect="4 bytes per element",
         patch=(("            nbytes = p.numel() * p.element_size()\n",
                 "            nbytes = p.numel() * 4\n"),)),
    Flaw("buckets", "no_broadcast", clause="broadcast", case="buckets-broadcast",
         why="builds the buckets and hooks but never broadcasts rank 0's model.",
         expect="right after BucketDDP(model)",
         patch=(("        broadcast_parameters(module)\n"
                 "        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]\n",
                 "        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]\n"),)),
    Flaw("buckets", "per_gradient", clause="one-per-bucket", case="buckets-calls",
         why="all-reduces each gradient in its hook as it arrives (async) and uses the buckets "
             "only to count: one message per parameter, not per bucket.",
         expect="expected one all_reduce per bucket",
         patch=(("        self._ready[i] += 1\n",
                 "        self._ready[i] += 1\n"
                 "        self._pending.append((None, param, dist.all_reduce(param.grad, async_op=True)))\n"
                 "        return\n"),
                ("        for i, flat, work in self._pending:\n"
                 "            work.wait()\n",
                 "        for i, flat, work in self._pending:\n"
                 "            work.wait()\n"
                 "            if i is None:\n"
                 "                flat.grad.div_(world_size)\n"
                 "                continue\n"))),
    Flaw("buckets", "blocking_bucket", clause="one-per-bucket", case="buckets-async",
         why="the bucket's all_reduce is a blocking call in the hook: backward waits for every "
             "bucket.",
         expect="are blocking",
         patch=(("            self._pending.append((i, flat, dist.all_reduce(flat, async_op=True)))\n",
                 "            dist.all_reduce(flat)\n"
                 "            self._pending.append((i, flat, None))\n"),
                ("        for i, flat, work in self._pending:\n"
                 "            work.wait()\n",
                 "        for i, flat, work in self._pending:\n"))),
    Flaw("buckets", "launch_in_finish", clause="one-per-bucket", case="buckets-during-backward",
         why="the hooks only count; finish_gradient_synchronization flattens and all-reduces "
             "every complete bucket: one message per bucket, but none during backward.",
         expect="did not start as soon as its last gradient was ready",
         patch=(("            flat = _flatten_dense_tensors([p.grad for p in self._bucket_params[i]])\n"
                 "            self._pending.append((i, flat, dist.all_reduce(flat, async_op=True)))\n",
                 "            self._pending.append((i, None, None))\n"),
                ("        for i, flat, work in self._pending:\n"
                 "            work.wait()\n",
                 "        launched = []\n"
                 "        for i, _, _ in self._pending:\n"
                 "            flat = _flatten_dense_tensors([p.grad for p in self._bucket_params[i]])\n"
                 "            launched.append((i, flat, dist.all_reduce(flat, async_op=True)))\n"
                 "        for i, flat, work in launched:\n"
                 "            work.wait()\n"))),
    Flaw("buckets", "large_param_crash", clause="larger-than-cap", case="buckets-values",
         why="gives every bucket a preallocated flat buffer of exactly the cap and copies each "
             "gradient into its slot: a parameter larger than the cap does not fit.",
         expect="in check case 'buckets-values'",
         patch=(("        cap = bucket_cap_mb * 1024 * 1024\n",
                 "        cap = bucket_cap_mb * 1024 * 1024\n        self._cap_bytes = cap\n"),
                ("            flat = _flatten_dense_tensors([p.grad for p in self._bucket_params[i]])\n",
                 "            flat = torch.zeros(int(self._cap_bytes) // 4)   # one fixed-size buffer\n"
                 "            offset = 0\n"
                 "            for p in self._bucket_params[i]:\n"
                 "                flat[offset:offset + p.numel()].copy_(p.grad.reshape(-1))\n"
                 "                offset += p.numel()\n"
                 "            flat = flat[:offset]\n"))),
    Flaw("buckets", "no_division", clause="finish", case="buckets-values",
         why="waits and copies each bucket back but never divides: the sums.",
         expect="gradients summed, not averaged?",
         patch=(("            work.wait()\n            flat.div_(world_size)\n",
                 "            work.wait()\n"),)),
    Flaw("buckets", "float32_buckets", clause="any-model", case="buckets-float64",
         why="flattens each bucket into a float32 buffer (torch.cat(...).float(), as gloo "
             "prefers): float64 gradients are rounded.",
         expect="float64",
         patch=(("            flat = _flatten_dense_tensors([p.grad for p in self._bucket_params[i]])\n",
                 "            flat = _flatten_dense_tensors([p.grad for p in self._bucket_params[i]]).float()\n"),)),
    Flaw("buckets", "counter_not_reset", clause="finish", case="buckets-second-step",
         why="waits, divides and copies back, but never resets the buckets' ready counters: from "
             "the second step on no bucket is ever complete again.",
         expect="in step 1 (step 0 was right",
         patch=(("        self._pending.clear()\n        self._ready = [0] * len(self.buckets)\n",
                 "        self._pending.clear()\n"),)),
    Flaw("buckets", "no_sync_counts", clause="no-sync", case="buckets-no-sync",
         why="the hook counts every gradient and only the launch looks at no_sync(): a backward "
             "inside it fills the counters, so the next one counts past the buckets' sizes.",
         expect="accumulated over a backward inside no_sync() and one outside",
         patch=(("        if not self._sync:\n            return\n", ""),
                ("        if self._ready[i] == len(self._bucket_params[i]):\n",
                 "        if self._sync and self._ready[i] == len(self._bucket_params[i]):\n"))),
    Flaw("buckets", "no_sync_ignored", clause="no-sync", case="buckets-no-sync",
         why="no_sync sets a flag (require_backward_grad_sync, torch DDP's name) that the hooks "
             "never read: a backward inside it still all-reduces.",
         expect="a backward inside BucketDDP.no_sync()",
         patch=(("        previous, self._sync = self._sync, False\n",
                 "        self.require_backward_grad_sync = False\n"),
                ("            self._sync = previous\n",
                 "            self.require_backward_grad_sync = True\n"))),
    Flaw("buckets", "tensor_hooks", clause="no-sync", case="buckets-no-sync",
         why="reduces the gradient each tensor hook (p.register_hook) receives, the gradient of "
             "this backward only, and writes the average into p.grad: what a no_sync() "
             "backward accumulated there is overwritten, not averaged.",
         expect="accumulated over a backward inside no_sync() and one outside",
         patch=(("        for _, p in named:\n"
                 "            p.register_post_accumulate_grad_hook(self._on_grad_ready)\n",
                 "        self._fresh = {}\n"
                 "        for _, p in named:\n"
                 "            p.register_hook(lambda grad, p=p: self._on_grad_ready(p, grad))\n"),
                Def("BucketDDP._on_grad_ready", '''
                    def _on_grad_ready(self, param, grad):
                        """Hook: count ``param``'s gradient; start its bucket's all-reduce when complete."""
                        if not self._sync:
                            return grad
                        self._arrived.add(id(param))
                        self._fresh[id(param)] = grad
                        i = self._bucket_of[id(param)]
                        self._ready[i] += 1
                        if self._ready[i] == len(self._bucket_params[i]):
                            flat = _flatten_dense_tensors([self._fresh[id(p)]
                                                           for p in self._bucket_params[i]])
                            self._pending.append((i, flat, dist.all_reduce(flat, async_op=True)))
                        return grad
                    '''))),
    Flaw("buckets", "nested_no_sync", clause="nested-no-sync", case="buckets-nested-no-sync",
         why="no_sync switches communication back on when it ends, whatever it was before: "
             "after an inner no_sync() block, the rest of the outer one communicates.",
         expect="after the inner of two nested no_sync() blocks ended",
         patch=(("        previous, self._sync = self._sync, False\n",
                 "        self._sync = False\n"),
                ("            self._sync = previous\n", "            self._sync = True\n"))),
    Flaw("buckets", "idle_finish_raises", clause="idle-finish", case="buckets-idle-finish",
         why="raises whenever some trainable parameter got no gradient since the last call, "
             "also when none did at all (a call after backward passes inside no_sync()).",
         expect="with nothing arrived it must do nothing",
         patch=(("        if arrived and missing:\n", "        if missing:\n"),)),
    Flaw("buckets", "names_first_missing", clause="unused-raises", case="buckets-unused-error",
         why="the RuntimeError names only the first parameter without gradient.",
         expect="expected a RuntimeError whose message names",
         patch=(('                f"BucketDDP: the trainable parameters {missing} got no gradient in this "\n',
                 '                f"BucketDDP: the trainable parameter {missing[0]} got no gradient in this "\n'),)),
    Flaw("buckets", "names_whole_buckets", clause="unused-raises", case="buckets-unused-error",
         why="the RuntimeError names every parameter of the buckets that were never reduced, "
             "the ones that did get their gradient too.",
         expect="which got theirs",
         patch=(("        missing = [name for names, params in zip(self.buckets, self._bucket_params)\n"
                 "                   for name, p in zip(names, params) if id(p) not in arrived]\n",
                 "        missing = [name for names, params in zip(self.buckets, self._bucket_params)\n"
                 "                   if any(id(p) not in arrived for p in params) for name in names]\n"),)),
    Flaw("buckets", "names_started_buckets_only", clause="unused-raises",
         case="buckets-unused-error",
         why="looks for missing gradients only in the buckets that started counting (some but "
             "not all gradients arrived): a bucket whose every parameter was skipped is never "
             "named.",
         expect="expected a RuntimeError whose message names",
         patch=(("                   for name, p in zip(names, params) if id(p) not in arrived]\n",
                 "                   for name, p in zip(names, params) if id(p) not in arrived\n"
                 "                   and any(id(q) in arrived for q in params)]\n"),)),
    Flaw("buckets", "value_error", clause="unused-raises", case="buckets-unused-error",
         why="raises ValueError (a wrong value: a gradient is missing) instead of RuntimeError.",
         expect="expected a RuntimeError",
         patch=(("            raise RuntimeError(\n", "            raise ValueError(\n"),)),
    Flaw("buckets", "unused_param_drifts", clause="unused-raises", case="buckets-unused-error",
         why="never notices a trainable parameter that got no gradient: that bucket is never "
             "reduced, finish returns normally, and the replicas drift apart silently.",
         expect="returned normally",
         patch=(("        if arrived and missing:\n", "        if False:\n"),)),
    Flaw("buckets", "missing_by_grad_none", clause="unused-raises", case="buckets-unused-stale",
         why="finds the parameters without gradient by p.grad is None, not by which hooks fired "
             "in this backward: a stale gradient (zero_grad(set_to_none=False), or one "
             "accumulated inside no_sync()) hides a skipped layer, whose bucket is never reduced.",
         expect="got no gradient in that backward",
         patch=(("                   for name, p in zip(names, params) if id(p) not in arrived]\n",
                 "                   for name, p in zip(names, params) if p.grad is None]\n"),)),
    Flaw("buckets", "raise_before_reset", clause="reset-first", case="buckets-after-error",
         why="checks for missing gradients first and raises before resetting the counters: the "
             "next backward counts on top of the old counts.",
         expect="buckets-after-error",
         patch=((BUCKET_RAISE,
                 "        missing = [name for names, params in zip(self.buckets, self._bucket_params)\n"
                 "                   for name, p in zip(names, params) if id(p) not in self._arrived]\n"
                 "        if self._arrived and missing:\n"
                 "            raise RuntimeError(\n"
                 '                f"BucketDDP: the trainable parameters {missing} got no gradient in this "\n'),
                ("        self._pending.clear()\n        self._ready = [0] * len(self.buckets)\n",
                 "        self._pending.clear()\n"),
                ('                "or use them in every forward")\n',
                 '                "or use them in every forward")\n'
                 "        self._ready = [0] * len(self.buckets)\n"
                 "        self._arrived = set()\n"))),
]
