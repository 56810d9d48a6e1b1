"""Known-wrong files of notebook 02, as patches of the solution (see tests/flaws.py)."""
from flaws import Def, Flaw  # noqa: F401

FLAWS = [
    Flaw('hogwild', 'ignores_crash', clause='raise-runtimeerror-naming', case='?',
         why='joins the workers but never looks at their exit codes: a crashed worker goes unnoticed.',
         patch=(
             ("""    failed = [f"rank {rank} (exit code {p.exitcode})" for rank, p in enumerate(procs)
              if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"Hogwild worker(s) failed: {', '.join(failed)}")
""",
              ''),
         )),
    Flaw('hogwild', 'momentum', clause='epoch-range-epochs', case='?',
         why=("the usual training loop's SGD with momentum=0.9: every worker keeps its own private "
              'momentum buffer, which is no longer the algorithm of the paper (and not what was asked).'),
         patch=(
             ("""    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
""",
              """    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
"""),
         )),
    Flaw('hogwild', 'no_set_epoch', clause='epoch-range-epochs', case='?',
         why="never calls sampler.set_epoch(epoch): every epoch repeats epoch 0's order and partition.",
         patch=(
             ("""        sampler.set_epoch(epoch)
""",
              ''),
         )),
    Flaw('hogwild', 'one_at_a_time', clause='start-them-all', case='?',
         why=('starts each worker and joins it before starting the next, so the workers train one after'
              ' the other: every worker reads its partition and the model is trained, but nothing runs '
              'in parallel (it is serial training, slowed down by the process start-ups).'),
         patch=(
             ("""    procs = [ctx.Process(target=train_worker, args=(rank, num_workers, model, dataset, epochs,
                                                    batch_size, lr, seed, threads))
             for rank in range(num_workers)]
    for p in procs:
""",
              """    for rank in range(num_workers):
        p = ctx.Process(target=train_worker, args=(rank, num_workers, model, dataset, epochs,
                                                   batch_size, lr, seed, threads))
"""),
             ("""        p.start()
    for p in procs:
        p.join()
""",
              """        p.start()
        p.join()
"""),
             ("""    failed = [f"rank {rank} (exit code {p.exitcode})" for rank, p in enumerate(procs)
              if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"Hogwild worker(s) failed: {', '.join(failed)}")
""",
              """        if p.exitcode != 0:
            raise RuntimeError(f"Hogwild worker {rank} failed with exit code {p.exitcode}")
"""),
         )),
    Flaw('hogwild', 'private_copies', clause='update-model-itself', case='?',
         why=('starts the workers with fork and never calls model.share_memory(): every worker trains '
              "its own copy-on-write copy, and the parent's model never changes."),
         patch=(
             ("""    model.share_memory()
    ctx = mp.get_context("spawn")
""",
              """    ctx = mp.get_context("fork")     # starts in milliseconds, unlike spawn
"""),
         )),
    Flaw('hogwild', 'same_data', clause='train-model-place', case='?',
         why=('every worker shuffles and trains on the whole dataset (no DistributedSampler), so the '
              'workers read the same samples and an epoch is num_workers passes over the data.'),
         patch=(
             ("""from torch.utils.data import DataLoader, DistributedSampler
""",
              """from torch.utils.data import DataLoader
"""),
             ("""    sampler = DistributedSampler(dataset, num_replicas=num_workers, rank=rank, shuffle=True,
                                 seed=seed)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
""",
              """    torch.manual_seed(seed + rank)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
"""),
             ("""        sampler.set_epoch(epoch)
""",
              ''),
         )),
    Flaw('hogwild', 'threads_all_cores', clause='torch-set-num', case='?',
         why=('with threads=None every worker gets all the cores (os.cpu_count() threads) instead of '
              'its share, so num_workers processes oversubscribe the machine (section 5 measures the '
              'cost).'),
         patch=(
             ("""    threads = threads or max(1, (os.cpu_count() or 1) // num_workers)
""",
              """    threads = threads or os.cpu_count()
"""),
         )),
    Flaw('sampler', 'contiguous_blocks', clause='this-replica-s', case='?',
         why=("gives every replica a contiguous block of the padded order (like notebook 01's shards) "
              'instead of every num_replicas-th index: the same lengths, other samples.'),
         patch=(
             ("""        total = (dataset_len // num_replicas) * num_replicas
        order = order[:total]
""",
              """        per = dataset_len // num_replicas
        order = order[:per * num_replicas]
"""),
             ("""        total = math.ceil(dataset_len / num_replicas) * num_replicas
        while len(order) < total:
            order += order[:total - len(order)]
    return order[rank:total:num_replicas]
""",
              """        per = math.ceil(dataset_len / num_replicas)
        while len(order) < per * num_replicas:
            order += order[:per * num_replicas - len(order)]
    return order[rank * per:(rank + 1) * per]
"""),
             ("""
class PartitionSampler(torch.utils.data.Sampler):
    '''A Sampler built on partition_indices: set_epoch only stores the epoch that __iter__ uses.'''

    def __init__(self, dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False):
        self.args = dict(dataset_len=dataset_len, num_replicas=num_replicas, rank=rank,
                         shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        return iter(partition_indices(epoch=self.epoch, **self.args))

    def __len__(self):
        return len(partition_indices(epoch=self.epoch, **self.args))
""",
              ''),
         )),
    Flaw('sampler', 'drops_before_shuffle', clause='drop-last-true', case='?',
         why=('with drop_last it shuffles only the samples it keeps, so the same last samples of the '
              'dataset are dropped in every epoch (DistributedSampler shuffles first, then cuts the '
              'tail).'),
         patch=(
             ("""    '''
    if shuffle:
""",
              """    '''
    if drop_last:
        used = (dataset_len // num_replicas) * num_replicas
    else:
        used = dataset_len
    if shuffle:
"""),
             ("""        order = torch.randperm(dataset_len, generator=g).tolist()
""",
              """        order = torch.randperm(used, generator=g).tolist()
"""),
             ("""        order = list(range(dataset_len))
    if drop_last:
        total = (dataset_len // num_replicas) * num_replicas
        order = order[:total]
    else:
        total = math.ceil(dataset_len / num_replicas) * num_replicas
        while len(order) < total:
            order += order[:total - len(order)]
""",
              """        order = list(range(used))
    total = math.ceil(used / num_replicas) * num_replicas
    while len(order) < total:
        order += order[:total - len(order)]
"""),
             ("""
class PartitionSampler(torch.utils.data.Sampler):
    '''A Sampler built on partition_indices: set_epoch only stores the epoch that __iter__ uses.'''

    def __init__(self, dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False):
        self.args = dict(dataset_len=dataset_len, num_replicas=num_replicas, rank=rank,
                         shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        return iter(partition_indices(epoch=self.epoch, **self.args))

    def __len__(self):
        return len(partition_indices(epoch=self.epoch, **self.args))
""",
              ''),
         )),
    Flaw('sampler', 'global_rng', clause='order-if-shuffle', case='?',
         why=("seeds torch's global random number generator (torch.manual_seed) instead of a "
              'torch.Generator of its own. The indices are right, but every call resets the random '
              'state of the whole training process (initialisation, dropout, augmentation) to seed + '
              'epoch.'),
         patch=(
             ("""        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(dataset_len, generator=g).tolist()
""",
              """        torch.manual_seed(seed + epoch)
        order = torch.randperm(dataset_len).tolist()
"""),
             ("""
class PartitionSampler(torch.utils.data.Sampler):
    '''A Sampler built on partition_indices: set_epoch only stores the epoch that __iter__ uses.'''

    def __init__(self, dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False):
        self.args = dict(dataset_len=dataset_len, num_replicas=num_replicas, rank=rank,
                         shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        return iter(partition_indices(epoch=self.epoch, **self.args))

    def __len__(self):
        return len(partition_indices(epoch=self.epoch, **self.args))
""",
              ''),
         )),
    Flaw('sampler', 'ignores_epoch', clause='order-if-shuffle', case='?',
         why='shuffles with the seed alone, ignoring the epoch: every epoch repeats the same order.',
         patch=(
             ("""        g.manual_seed(seed + epoch)
""",
              """        g.manual_seed(seed)
"""),
             ("""
class PartitionSampler(torch.utils.data.Sampler):
    '''A Sampler built on partition_indices: set_epoch only stores the epoch that __iter__ uses.'''

    def __init__(self, dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False):
        self.args = dict(dataset_len=dataset_len, num_replicas=num_replicas, rank=rank,
                         shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        return iter(partition_indices(epoch=self.epoch, **self.args))

    def __len__(self):
        return len(partition_indices(epoch=self.epoch, **self.args))
""",
              ''),
         )),
    Flaw('sampler', 'pads_last_sample', clause='equal-lengths-drop', case='?',
         why='pads by repeating the last sample of the order instead of the order from its start.',
         patch=(
             ("""        while len(order) < total:
            order += order[:total - len(order)]
""",
              """        if order:
            order += [order[-1]] * (total - len(order))
"""),
             ("""
class PartitionSampler(torch.utils.data.Sampler):
    '''A Sampler built on partition_indices: set_epoch only stores the epoch that __iter__ uses.'''

    def __init__(self, dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False):
        self.args = dict(dataset_len=dataset_len, num_replicas=num_replicas, rank=rank,
                         shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        return iter(partition_indices(epoch=self.epoch, **self.args))

    def __len__(self):
        return len(partition_indices(epoch=self.epoch, **self.args))
""",
              ''),
         )),
    Flaw('sampler', 'pads_once', clause='equal-lengths-drop', case='?',
         why=('pads by appending the start of the order once, which is enough unless the dataset is '
              'smaller than half the padded length (2 samples, 5 replicas: 4 indices instead of 5).'),
         patch=(
             ("""        while len(order) < total:
            order += order[:total - len(order)]
""",
              """        order += order[:total - len(order)]
"""),
             ("""
class PartitionSampler(torch.utils.data.Sampler):
    '''A Sampler built on partition_indices: set_epoch only stores the epoch that __iter__ uses.'''

    def __init__(self, dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False):
        self.args = dict(dataset_len=dataset_len, num_replicas=num_replicas, rank=rank,
                         shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        return iter(partition_indices(epoch=self.epoch, **self.args))

    def __len__(self):
        return len(partition_indices(epoch=self.epoch, **self.args))
""",
              ''),
         )),
]

