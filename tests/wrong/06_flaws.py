"""Known-wrong files of notebook 06, as patches of the solution (see tests/flaws.py)."""
from flaws import Def, Flaw  # noqa: F401

FLAWS = [
    Flaw('api', 'contiguous_blocks', clause='step-k-k', case='?',
         why=('partition_dataset shuffles the indices with '
              'a generator seeded by `seed` (the same order on every rank) and gives each rank one '
              'contiguous block of it, len(dataset) // world_size examples, batched in order. The '
              "shares are disjoint and every rank runs the same number of steps, but step k's global "
              'batch now depends on the number of ranks: with 2 ranks step 0 takes positions 0-5 and '
              '25-30 of the order, with 3 ranks 0-3, 16-19 and 32-35, so 1, 2 or 4 ranks no longer '
              'train alike.'),
         patch=(
             ("""from torch.utils.data import DataLoader, DistributedSampler
""",
              """from torch.utils.data import DataLoader
"""),
             ("""    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=seed, drop_last=True)
    return DataLoader(dataset, batch_size=per_rank, sampler=sampler, drop_last=True), per_rank
""",
              """    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))
    share = len(dataset) // world_size
    mine = order[rank * share:(rank + 1) * share].tolist()
    subset = torch.utils.data.Subset(dataset, mine)
    return DataLoader(subset, batch_size=per_rank, shuffle=False, drop_last=True), per_rank
"""),
         )),
    Flaw('api', 'ignores_seed', clause='order-depends-another', case='?',
         why=('partition_dataset builds its DistributedSampler '
              "without passing `seed` on (the sampler's default seed is 0): the ranks agree on one "
              'shuffled order, but it is the same order for every seed, so partition_dataset(..., '
              'seed=1) repeats the batches of seed=0.'),
         patch=(
             ("""                                 seed=seed, drop_last=True)
""",
              """                                 drop_last=True)
"""),
         )),
    Flaw('api', 'init_torchrun_only', clause='rank-world-size', case='?',
         why=("init reads only torchrun's variables (RANK,"
              ' WORLD_SIZE, LOCAL_RANK), as most tutorials do. Under torchrun it works; under mpiexec '
              '(PMI_RANK, PMI_SIZE) every process believes it is rank 0 of 1.'),
         patch=(
             ("""    rank = _first_env(("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK"), 0)
    world_size = _first_env(("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"), 1)
    local_rank = _first_env(("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK"), 0)
""",
              """    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
"""),
         )),
    Flaw('api', 'no_broadcast', clause='copy-rank-root', case='?',
         why=('broadcast_parameters does nothing, in the belief '
              "that seeding every process alike makes the replicas equal; but the ranks' models were "
              'initialised from different random states (as they are after any rank-dependent random '
              'call), so they start, and stay, different.'),
         patch=(
             ("""        seed: seed of the shuffle. The order depends on it (another seed, another order)
            and on nothing else: not on the rank, not on the world size.
""",
              """        seed: seed of the shuffle; every rank must use the same shuffled order.
"""),
             ("""        dataset's items, batched by ``DataLoader``). Step k (the k-th batch of every rank)
        trains on the examples at positions ``k * batch_size`` to ``(k + 1) * batch_size - 1``
        of the shuffled order, each rank taking a disjoint ``per_rank_batch`` of them
        (``DistributedSampler`` does so: rank r takes the positions r, r + world_size, ...),
        so that 1, 2 or 4 ranks train on the same global batches. Every rank yields the same
        number of batches, ``len(dataset) // batch_size`` (an extra batch on one rank would
        leave it alone in an all-reduce, hanging); an incomplete last batch is dropped, so
        every step trains on exactly ``batch_size`` examples.
""",
              """        dataset's items, batched by ``DataLoader``). The ranks take disjoint shares of one
        shuffled order, each ``len(dataset) // world_size`` examples, and every rank yields
        the same number of batches (an extra batch on one rank would leave it alone in an
        all-reduce, hanging); an incomplete last batch is dropped, so every step trains on
        exactly ``batch_size`` examples.
"""),
             ("""    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor, src=root)
""",
              """    # Every rank calls torch.manual_seed(0) before building its model, so the replicas
    # already start equal: nothing to send.
    return
"""),
         )),
    Flaw('api', 'sampler_pads', clause='rank-yields-same', case='?',
         why=('partition_dataset uses DistributedSampler and '
              'DataLoader with their defaults: the sampler pads the shares with repeated examples (25 '
              'per rank from 50) and the loader keeps the incomplete last batch, so every rank ends the'
              ' epoch with a batch of 1 example (BatchNorm cannot even train on it) and the global '
              'batch is not batch_size.'),
         patch=(
             ("""        seed: seed of the shuffle. The order depends on it (another seed, another order)
            and on nothing else: not on the rank, not on the world size.
""",
              """        seed: seed of the shuffle; every rank must use the same shuffled order.
"""),
             ("""        dataset's items, batched by ``DataLoader``). Step k (the k-th batch of every rank)
        trains on the examples at positions ``k * batch_size`` to ``(k + 1) * batch_size - 1``
        of the shuffled order, each rank taking a disjoint ``per_rank_batch`` of them
        (``DistributedSampler`` does so: rank r takes the positions r, r + world_size, ...),
        so that 1, 2 or 4 ranks train on the same global batches. Every rank yields the same
        number of batches, ``len(dataset) // batch_size`` (an extra batch on one rank would
        leave it alone in an all-reduce, hanging); an incomplete last batch is dropped, so
        every step trains on exactly ``batch_size`` examples.
""",
              """        dataset's items, batched by ``DataLoader``). The ranks take disjoint shares of one
        shuffled order, each ``len(dataset) // world_size`` examples, and every rank yields
        the same number of batches (an extra batch on one rank would leave it alone in an
        all-reduce, hanging); an incomplete last batch is dropped, so every step trains on
        exactly ``batch_size`` examples.
"""),
             ("""                                 seed=seed, drop_last=True)
    return DataLoader(dataset, batch_size=per_rank, sampler=sampler, drop_last=True), per_rank
""",
              """                                 seed=seed)
    return DataLoader(dataset, batch_size=per_rank, sampler=sampler), per_rank
"""),
         )),
    Flaw('buckets', 'cap_decimal_mb', clause='bucket-cap-mb', case='?',
         why=('BucketDDP reads bucket_cap_mb in decimal '
              'megabytes (bucket_cap_mb * 10**6 bytes) instead of MiB: every cap is 4.6% smaller than '
              "DistributedDataParallel's, and a bucket that fills between the two closes one parameter "
              'early.'),
         patch=(
             ("""        cap = bucket_cap_mb * 1024 * 1024
""",
              """        cap = bucket_cap_mb * 1e6
"""),
         )),
    Flaw('buckets', 'counter_not_reset', clause='finish-gradient-synchronization', case='?',
         why=('finish_gradient_synchronization waits, '
              "divides and copies back, but does not reset the buckets' ready counters: in the next "
              "backward they count past the bucket's size, no bucket is ever complete again, and from "
              'the second step on nothing is all-reduced.'),
         patch=(
             ("""        self._pending.clear()
        self._ready = [0] * len(self.buckets)
        arrived, self._arrived = self._arrived, set()
""",
              """        self._pending.clear()
        arrived, self._arrived = self._arrived, set()
"""),
         )),
    Flaw('buckets', 'forward_order', clause='take-parameters-that', case='?',
         why=('BucketDDP packs the parameters into buckets '
              'in registration (forward) order instead of reverse order. Backward produces the last '
              "layer's gradients first, so the first bucket (the first layers) is the last to fill: its"
              ' all-reduce waits for the end of backward.'),
         patch=(
             ("""        seed: seed of the shuffle. The order depends on it (another seed, another order)
            and on nothing else: not on the rank, not on the world size.
""",
              """        seed: seed of the shuffle; every rank must use the same shuffled order.
"""),
             ("""        dataset's items, batched by ``DataLoader``). Step k (the k-th batch of every rank)
        trains on the examples at positions ``k * batch_size`` to ``(k + 1) * batch_size - 1``
        of the shuffled order, each rank taking a disjoint ``per_rank_batch`` of them
        (``DistributedSampler`` does so: rank r takes the positions r, r + world_size, ...),
        so that 1, 2 or 4 ranks train on the same global batches. Every rank yields the same
        number of batches, ``len(dataset) // batch_size`` (an extra batch on one rank would
        leave it alone in an all-reduce, hanging); an incomplete last batch is dropped, so
        every step trains on exactly ``batch_size`` examples.
""",
              """        dataset's items, batched by ``DataLoader``). The ranks take disjoint shares of one
        shuffled order, each ``len(dataset) // world_size`` examples, and every rank yields
        the same number of batches (an extra batch on one rank would leave it alone in an
        all-reduce, hanging); an incomplete last batch is dropped, so every step trains on
        exactly ``batch_size`` examples.
"""),
             ("""        for name, p in reversed(named):
""",
              """        for name, p in named:
"""),
         )),
    Flaw('buckets', 'large_param_crash', clause='parameter-larger-than', case='?',
         why=('BucketDDP gives every bucket a '
              'preallocated flat buffer of exactly the cap (bucket_cap_mb) and copies each gradient '
              'into its slot; a parameter larger than the cap does not fit in the buffer, and its hook '
              'crashes during backward.'),
         patch=(
             ("""        seed: seed of the shuffle. The order depends on it (another seed, another order)
            and on nothing else: not on the rank, not on the world size.
""",
              """        seed: seed of the shuffle; every rank must use the same shuffled order.
"""),
             ("""        dataset's items, batched by ``DataLoader``). Step k (the k-th batch of every rank)
        trains on the examples at positions ``k * batch_size`` to ``(k + 1) * batch_size - 1``
        of the shuffled order, each rank taking a disjoint ``per_rank_batch`` of them
        (``DistributedSampler`` does so: rank r takes the positions r, r + world_size, ...),
        so that 1, 2 or 4 ranks train on the same global batches. Every rank yields the same
        number of batches, ``len(dataset) // batch_size`` (an extra batch on one rank would
        leave it alone in an all-reduce, hanging); an incomplete last batch is dropped, so
        every step trains on exactly ``batch_size`` examples.
""",
              """        dataset's items, batched by ``DataLoader``). The ranks take disjoint shares of one
        shuffled order, each ``len(dataset) // world_size`` examples, and every rank yields
        the same number of batches (an extra batch on one rank would leave it alone in an
        all-reduce, hanging); an incomplete last batch is dropped, so every step trains on
        exactly ``batch_size`` examples.
"""),
             ("""        cap = bucket_cap_mb * 1024 * 1024
        self.buckets, current, used = [], [], 0
""",
              """        cap = bucket_cap_mb * 1024 * 1024
        self._cap_bytes = cap
        self.buckets, current, used = [], [], 0
"""),
             ("""            flat = _flatten_dense_tensors([p.grad for p in self._bucket_params[i]])
""",
              """            flat = torch.zeros(int(self._cap_bytes) // 4)     # one fixed-size buffer per bucket
            offset = 0
            for p in self._bucket_params[i]:
                flat[offset:offset + p.numel()].copy_(p.grad.view(-1))
                offset += p.numel()
            flat = flat[:offset]
"""),
         )),
    Flaw('buckets', 'no_sync_counts', clause='no-sync-context', case='?',
         why=('the hook counts every gradient, and only '
              'the launch of the all-reduce looks at no_sync(): a backward inside no_sync() fills the '
              "counters without communicating, so in the next backward they count past the buckets' "
              'sizes and the accumulated gradients are never reduced.'),
         patch=(
             ("""        if not self._sync:
            return
""",
              ''),
             ("""        if self._ready[i] == len(self._bucket_params[i]):
""",
              """        if self._sync and self._ready[i] == len(self._bucket_params[i]):
"""),
         )),
    Flaw('buckets', 'no_sync_ignored', clause='no-sync-context', case='?',
         why=('BucketDDP.no_sync sets a flag '
              "(require_backward_grad_sync, the name torch's DDP uses) that the hooks never read, so a "
              'backward inside no_sync() still all-reduces every bucket; the accumulated gradients are '
              'then reduced twice over.'),
         patch=(
             ("""        seed: seed of the shuffle. The order depends on it (another seed, another order)
            and on nothing else: not on the rank, not on the world size.
""",
              """        seed: seed of the shuffle; every rank must use the same shuffled order.
"""),
             ("""        dataset's items, batched by ``DataLoader``). Step k (the k-th batch of every rank)
        trains on the examples at positions ``k * batch_size`` to ``(k + 1) * batch_size - 1``
        of the shuffled order, each rank taking a disjoint ``per_rank_batch`` of them
        (``DistributedSampler`` does so: rank r takes the positions r, r + world_size, ...),
        so that 1, 2 or 4 ranks train on the same global batches. Every rank yields the same
        number of batches, ``len(dataset) // batch_size`` (an extra batch on one rank would
        leave it alone in an all-reduce, hanging); an incomplete last batch is dropped, so
        every step trains on exactly ``batch_size`` examples.
""",
              """        dataset's items, batched by ``DataLoader``). The ranks take disjoint shares of one
        shuffled order, each ``len(dataset) // world_size`` examples, and every rank yields
        the same number of batches (an extra batch on one rank would leave it alone in an
        all-reduce, hanging); an incomplete last batch is dropped, so every step trains on
        exactly ``batch_size`` examples.
"""),
             ("""        previous, self._sync = self._sync, False
""",
              """        self.require_backward_grad_sync = False
"""),
             ("""            self._sync = previous
""",
              """            self.require_backward_grad_sync = True
"""),
         )),
    Flaw('buckets', 'unused_param_drifts', clause='if-some-did', case='?',
         why=('BucketDDP counts the gradients of each'
              ' bucket and reduces a bucket when its last one arrives, but never notices a trainable '
              'parameter that got no gradient (the behaviour before issue 15): when the forward skips a'
              " layer, that layer's bucket is never all-reduced, finish_gradient_synchronization() "
              'returns normally, and every rank steps with its own local gradients for the other '
              'parameters of that bucket: the replicas drift apart silently.'),
         patch=(
             ("""        seed: seed of the shuffle. The order depends on it (another seed, another order)
            and on nothing else: not on the rank, not on the world size.
""",
              """        seed: seed of the shuffle; every rank must use the same shuffled order.
"""),
             ("""        dataset's items, batched by ``DataLoader``). Step k (the k-th batch of every rank)
        trains on the examples at positions ``k * batch_size`` to ``(k + 1) * batch_size - 1``
        of the shuffled order, each rank taking a disjoint ``per_rank_batch`` of them
        (``DistributedSampler`` does so: rank r takes the positions r, r + world_size, ...),
        so that 1, 2 or 4 ranks train on the same global batches. Every rank yields the same
        number of batches, ``len(dataset) // batch_size`` (an extra batch on one rank would
        leave it alone in an all-reduce, hanging); an incomplete last batch is dropped, so
        every step trains on exactly ``batch_size`` examples.
""",
              """        dataset's items, batched by ``DataLoader``). The ranks take disjoint shares of one
        shuffled order, each ``len(dataset) // world_size`` examples, and every rank yields
        the same number of batches (an extra batch on one rank would leave it alone in an
        all-reduce, hanging); an incomplete last batch is dropped, so every step trains on
        exactly ``batch_size`` examples.
"""),
             ("""        self._arrived = set()                # ids of the parameters whose gradient arrived
""",
              ''),
             ("""        self._arrived.add(id(param))
""",
              ''),
             ("""        arrived, self._arrived = self._arrived, set()
        missing = [name for names, params in zip(self.buckets, self._bucket_params)
                   for name, p in zip(names, params) if id(p) not in arrived]
        if arrived and missing:
            raise RuntimeError(
                f"BucketDDP: the trainable parameters {missing} got no gradient in this "
                "backward, so their buckets were never all-reduced and the replicas would "
                "drift apart. Freeze them (p.requires_grad_(False)) before wrapping the model, "
                "or use them in every forward")
""",
              ''),
         )),
    Flaw('flat', 'no_copy_back', clause='divide-world-size', case='?',
         why=('allreduce_flat all-reduces and averages a '
              "torch.cat copy of the gradients, then 'copies back' by rebinding the loop variable (grad"
              ' = piece) instead of writing into p.grad: the gradients stay local, each rank trains on '
              'its own data only.'),
         patch=(
             ("""        seed: seed of the shuffle. The order depends on it (another seed, another order)
            and on nothing else: not on the rank, not on the world size.
""",
              """        seed: seed of the shuffle; every rank must use the same shuffled order.
"""),
             ("""        dataset's items, batched by ``DataLoader``). Step k (the k-th batch of every rank)
        trains on the examples at positions ``k * batch_size`` to ``(k + 1) * batch_size - 1``
        of the shuffled order, each rank taking a disjoint ``per_rank_batch`` of them
        (``DistributedSampler`` does so: rank r takes the positions r, r + world_size, ...),
        so that 1, 2 or 4 ranks train on the same global batches. Every rank yields the same
        number of batches, ``len(dataset) // batch_size`` (an extra batch on one rank would
        leave it alone in an all-reduce, hanging); an incomplete last batch is dropped, so
        every step trains on exactly ``batch_size`` examples.
""",
              """        dataset's items, batched by ``DataLoader``). The ranks take disjoint shares of one
        shuffled order, each ``len(dataset) // world_size`` examples, and every rank yields
        the same number of batches (an extra batch on one rank would leave it alone in an
        all-reduce, hanging); an incomplete last batch is dropped, so every step trains on
        exactly ``batch_size`` examples.
"""),
             ("""    flat = _flatten_dense_tensors(grads)
""",
              """    flat = torch.cat([g.reshape(-1) for g in grads])
"""),
             ("""    for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        grad.copy_(synced)
""",
              """    offset = 0
    for grad in grads:
        grad = flat[offset:offset + grad.numel()].view_as(grad)
        offset += grad.numel()
"""),
         )),
    Flaw('flat', 'requires_grad_filter', clause='params-parameters-those', case='?',
         why=('allreduce_flat collects the gradients of'
              ' the parameters with requires_grad True instead of those whose grad is not None: a '
              'trainable parameter that got no gradient in this backward puts None in the list, and '
              'flattening it raises.'),
         patch=(
             ("""    grads = [p.grad for p in params if p.grad is not None]
""",
              """    grads = [p.grad for p in params if p.requires_grad]
"""),
         )),
    Flaw('flat', 'zero_fills_none', clause='params-parameters-those', case='?',
         why=('allreduce_flat puts zeros in the flat buffer '
              'for every parameter without a gradient (and gives it a zero gradient), so that the '
              'buffer has the same layout on every rank whatever its gradients. The averages are right,'
              " but the buffer carries the frozen parameters' elements too: more bytes than the "
              'gradients.'),
         patch=(
             ("""    grads = [p.grad for p in params if p.grad is not None]
""",
              """    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
"""),
         )),
    Flaw('naive', 'requires_grad_filter', clause='params-parameters-those', case='?',
         why=('allreduce_naive skips the parameters '
              'with requires_grad False instead of those whose grad is None. Frozen parameters are '
              'skipped alike, but a trainable parameter that got no gradient in this backward (a layer '
              'the forward did not use) has grad None, and dist.all_reduce(None) raises.'),
         patch=(
             ("""        if p.grad is not None:
""",
              """        if p.requires_grad:
"""),
         )),
    Flaw('naive', 'sum_not_averaged', clause='return-p-grad', case='?',
         why=('allreduce_naive sums each gradient over the'
              ' ranks with one all_reduce per parameter but never divides by the world size, so every '
              'update is world_size times too large.'),
         patch=(
             ("""        seed: seed of the shuffle. The order depends on it (another seed, another order)
            and on nothing else: not on the rank, not on the world size.
""",
              """        seed: seed of the shuffle; every rank must use the same shuffled order.
"""),
             ("""        dataset's items, batched by ``DataLoader``). Step k (the k-th batch of every rank)
        trains on the examples at positions ``k * batch_size`` to ``(k + 1) * batch_size - 1``
        of the shuffled order, each rank taking a disjoint ``per_rank_batch`` of them
        (``DistributedSampler`` does so: rank r takes the positions r, r + world_size, ...),
        so that 1, 2 or 4 ranks train on the same global batches. Every rank yields the same
        number of batches, ``len(dataset) // batch_size`` (an extra batch on one rank would
        leave it alone in an all-reduce, hanging); an incomplete last batch is dropped, so
        every step trains on exactly ``batch_size`` examples.
""",
              """        dataset's items, batched by ``DataLoader``). The ranks take disjoint shares of one
        shuffled order, each ``len(dataset) // world_size`` examples, and every rank yields
        the same number of batches (an extra batch on one rank would leave it alone in an
        all-reduce, hanging); an incomplete last batch is dropped, so every step trains on
        exactly ``batch_size`` examples.
"""),
             ("""            dist.all_reduce(p.grad)
            p.grad.div_(world_size)
""",
              """            dist.all_reduce(p.grad)          # the sum over ranks
"""),
         )),
    Flaw('naive', 'zero_fills_none', clause='params-parameters-those', case='?',
         why=('allreduce_naive gives every parameter '
              'without a gradient a zero gradient and all-reduces it too, so that every rank makes the '
              'same calls whatever its gradients. The averages are right, but frozen parameters are '
              'communicated (one all_reduce per parameter, not per parameter with a gradient) and get a'
              ' gradient.'),
         patch=(
             ("""        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(world_size)
""",
              """        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)
        p.grad.div_(world_size)
"""),
         )),
    Flaw('overlap', 'blocking_in_hook', clause='hook-runs-as', case='?',
         why=("OverlapDDP's hook all-reduces each "
              'gradient with a blocking dist.all_reduce (and divides at once), and '
              'finish_gradient_synchronization has nothing left to do. The numbers are right, but '
              'backward stops at every hook until that gradient has travelled: nothing overlaps, '
              'although it is claimed as overlap.'),
         patch=(
             ("""        seed: seed of the shuffle. The order depends on it (another seed, another order)
            and on nothing else: not on the rank, not on the world size.
""",
              """        seed: seed of the shuffle; every rank must use the same shuffled order.
"""),
             ("""        dataset's items, batched by ``DataLoader``). Step k (the k-th batch of every rank)
        trains on the examples at positions ``k * batch_size`` to ``(k + 1) * batch_size - 1``
        of the shuffled order, each rank taking a disjoint ``per_rank_batch`` of them
        (``DistributedSampler`` does so: rank r takes the positions r, r + world_size, ...),
        so that 1, 2 or 4 ranks train on the same global batches. Every rank yields the same
        number of batches, ``len(dataset) // batch_size`` (an extra batch on one rank would
        leave it alone in an all-reduce, hanging); an incomplete last batch is dropped, so
        every step trains on exactly ``batch_size`` examples.
""",
              """        dataset's items, batched by ``DataLoader``). The ranks take disjoint shares of one
        shuffled order, each ``len(dataset) // world_size`` examples, and every rank yields
        the same number of batches (an extra batch on one rank would leave it alone in an
        all-reduce, hanging); an incomplete last batch is dropped, so every step trains on
        exactly ``batch_size`` examples.
"""),
             ("""        self._pending.append((param, dist.all_reduce(param.grad, async_op=True)))
""",
              """        dist.all_reduce(param.grad)          # reduce as soon as the gradient is ready
        param.grad.div_(dist.get_world_size())
"""),
         )),
    Flaw('overlap', 'no_broadcast', clause='at-construction-broadcast', case='?',
         why=('OverlapDDP registers its hooks but does not '
              "broadcast rank 0's parameters and buffers at construction (as if the gradient averaging "
              'alone kept the replicas equal): ranks that start from different models get equal '
              'gradients and stay different.'),
         patch=(
             ("""        #       self._on_grad_ready as post-accumulate-grad hook of each trainable parameter.
        broadcast_parameters(module)
        self._pending = []
""",
              """        #       self._on_grad_ready as post-accumulate-grad hook of each trainable parameter.
        self._pending = []
"""),
         )),
    Flaw('overlap', 'pending_not_cleared', clause='finish-gradient-synchronization', case='?',
         why=('finish_gradient_synchronization waits '
              'for the handles and divides, but never clears the list of pending (parameter, handle) '
              'pairs: from the second step on it waits for the old handles again and divides the new '
              'gradients once more per earlier step, so they are too small.'),
         patch=(
             ("""            param.grad.div_(world_size)
        self._pending.clear()

""",
              """            param.grad.div_(world_size)

"""),
         )),
]

