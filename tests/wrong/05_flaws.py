"""Known-wrong files of notebook 05, as patches of the solution (see tests/flaws.py)."""
from flaws import Def, Flaw  # noqa: F401

FLAWS = [
    Flaw('snapshots', 'every_rank_saves', clause='rank-0-writes', case='?',
         why=('every rank writes the snapshot (each to'
              ' the same temporary file, then os.replace over the same snapshot), racing on it.'),
         patch=(
             ("""        # TODO: DDP, the sampler and the loader, then the snapshot (see the docstring).
""",
              """        # TODO: move the model to the device and wrap it in DDP (device_ids=[local_rank] on a
        # GPU, none on the CPU); a DistributedSampler (shuffle, seed=config.seed) over
        # train_set and a DataLoader with config.batch_size examples per worker; then, if
        # the snapshot file config.snapshot exists, load it (self.load_snapshot()).
"""),
             ('        """Write everything needed to resume exactly; rank 0 writes.\n',
              '        """Write everything needed to resume exactly; rank 0 writes, every rank waits.\n'),
             ("""        never leaves a torn snapshot). A barrier after it keeps the other ranks from running
        ahead while rank 0 writes (a courtesy here: DDP's next all-reduce waits for rank 0).
""",
              """        never leaves a torn snapshot); then all ranks meet at a barrier.
"""),
             ("""        dist.all_gather_object(rng, runner.rng_state())
        if self.rank == 0:
            snapshot = {"model": self.model.module.state_dict(),
""",
              """        dist.all_gather_object(rng, runner.rng_state())
        if True:
            snapshot = {"model": self.model.module.state_dict(),
"""),
             ('        """Restore what ``save_snapshot`` wrote, so that training continues exactly where the\n        snapshot was taken: the model (into ``self.model.module``), optimizer, scheduler,\n        counters and this rank\'s entry of "rng" (``runner.set_rng_state``). Load with\n        ``map_location=self.device`` and ``weights_only=False`` (the file holds NumPy random\n        states, which the default ``weights_only=True`` refuses; it is your own file)."""\n',
              '        """Restore what ``save_snapshot`` wrote (``map_location`` = this rank\'s device), so\n        that training continues exactly where the snapshot was taken."""\n'),
             ('        """One pass over this rank\'s part of the data (every rank a different part).\n\n        First tell the sampler which epoch this is (``set_epoch``: a new shuffle every epoch,\n        the same on every rank), before iterating over the loader.\n        """\n        # TODO: the sampler\'s epoch (see the docstring).\n',
              '        """One pass over this rank\'s part of the data (every rank a different part)."""\n        # TODO: tell the sampler which epoch this is (a new shuffle every epoch, the same on\n        # every rank), before iterating over the loader.\n'),
         )),
    Flaw('snapshots', 'in_place', clause='rank-0-writes', case='?',
         why=('rank 0 writes the snapshot directly over the '
              'previous one (no temporary file, no rename): a crash during the write leaves a torn file'
              ' that the restarted job tries to load.'),
         patch=(
             ("""        # TODO: DDP, the sampler and the loader, then the snapshot (see the docstring).
""",
              """        # TODO: move the model to the device and wrap it in DDP (device_ids=[local_rank] on a
        # GPU, none on the CPU); a DistributedSampler (shuffle, seed=config.seed) over
        # train_set and a DataLoader with config.batch_size examples per worker; then, if
        # the snapshot file config.snapshot exists, load it (self.load_snapshot()).
"""),
             ('        """Write everything needed to resume exactly; rank 0 writes.\n',
              '        """Write everything needed to resume exactly; rank 0 writes, every rank waits.\n'),
             ("""        never leaves a torn snapshot). A barrier after it keeps the other ranks from running
        ahead while rank 0 writes (a courtesy here: DDP's next all-reduce waits for rank 0).
""",
              """        never leaves a torn snapshot); then all ranks meet at a barrier.
"""),
             ("""            tmp = f"{self.config.snapshot}.tmp"
            torch.save(snapshot, tmp)
            os.replace(tmp, self.config.snapshot)
""",
              """            torch.save(snapshot, self.config.snapshot)
"""),
             ('        """Restore what ``save_snapshot`` wrote, so that training continues exactly where the\n        snapshot was taken: the model (into ``self.model.module``), optimizer, scheduler,\n        counters and this rank\'s entry of "rng" (``runner.set_rng_state``). Load with\n        ``map_location=self.device`` and ``weights_only=False`` (the file holds NumPy random\n        states, which the default ``weights_only=True`` refuses; it is your own file)."""\n',
              '        """Restore what ``save_snapshot`` wrote (``map_location`` = this rank\'s device), so\n        that training continues exactly where the snapshot was taken."""\n'),
             ('        """One pass over this rank\'s part of the data (every rank a different part).\n\n        First tell the sampler which epoch this is (``set_epoch``: a new shuffle every epoch,\n        the same on every rank), before iterating over the loader.\n        """\n        # TODO: the sampler\'s epoch (see the docstring).\n',
              '        """One pass over this rank\'s part of the data (every rank a different part)."""\n        # TODO: tell the sampler which epoch this is (a new shuffle every epoch, the same on\n        # every rank), before iterating over the loader.\n'),
         )),
    Flaw('snapshots', 'in_place_file_object', clause='rank-0-writes', case='?',
         why=('rank 0 writes the snapshot in place'
              ' through an open file (flush and fsync, but no temporary file and no os.replace), so a '
              'crash during the write leaves a torn snapshot that the restarted job loads.'),
         patch=(
             ("""        # TODO: DDP, the sampler and the loader, then the snapshot (see the docstring).
""",
              """        # TODO: move the model to the device and wrap it in DDP (device_ids=[local_rank] on a
        # GPU, none on the CPU); a DistributedSampler (shuffle, seed=config.seed) over
        # train_set and a DataLoader with config.batch_size examples per worker; then, if
        # the snapshot file config.snapshot exists, load it (self.load_snapshot()).
"""),
             ('        """Write everything needed to resume exactly; rank 0 writes.\n',
              '        """Write everything needed to resume exactly; rank 0 writes, every rank waits.\n'),
             ("""        never leaves a torn snapshot). A barrier after it keeps the other ranks from running
        ahead while rank 0 writes (a courtesy here: DDP's next all-reduce waits for rank 0).
""",
              """        never leaves a torn snapshot); then all ranks meet at a barrier.
"""),
             ("""            tmp = f"{self.config.snapshot}.tmp"
            torch.save(snapshot, tmp)
            os.replace(tmp, self.config.snapshot)
""",
              """            with open(self.config.snapshot, "wb") as out:    # in place: no temporary file
                torch.save(snapshot, out)
                out.flush()
                os.fsync(out.fileno())
"""),
             ('        """One pass over this rank\'s part of the data (every rank a different part).\n\n        First tell the sampler which epoch this is (``set_epoch``: a new shuffle every epoch,\n        the same on every rank), before iterating over the loader.\n        """\n        # TODO: the sampler\'s epoch (see the docstring).\n',
              '        """One pass over this rank\'s part of the data (every rank a different part)."""\n        # TODO: tell the sampler which epoch this is (a new shuffle every epoch, the same on\n        # every rank), before iterating over the loader.\n'),
         )),
    Flaw('snapshots', 'no_optimizer_state', clause='snapshot-dict-torch', case='?',
         why=('the snapshot keeps the model, '
              'scheduler, counters and random states but not the optimizer, so a resumed run restarts '
              'momentum from zero.'),
         patch=(
             ("""        # TODO: DDP, the sampler and the loader, then the snapshot (see the docstring).
""",
              """        # TODO: move the model to the device and wrap it in DDP (device_ids=[local_rank] on a
        # GPU, none on the CPU); a DistributedSampler (shuffle, seed=config.seed) over
        # train_set and a DataLoader with config.batch_size examples per worker; then, if
        # the snapshot file config.snapshot exists, load it (self.load_snapshot()).
"""),
             ('        """Write everything needed to resume exactly; rank 0 writes.\n',
              '        """Write everything needed to resume exactly; rank 0 writes, every rank waits.\n'),
             ("""        never leaves a torn snapshot). A barrier after it keeps the other ranks from running
        ahead while rank 0 writes (a courtesy here: DDP's next all-reduce waits for rank 0).
""",
              """        never leaves a torn snapshot); then all ranks meet at a barrier.
"""),
             ("""                        "optimizer": self.optimizer.state_dict(),
""",
              ''),
             ('        """Restore what ``save_snapshot`` wrote, so that training continues exactly where the\n        snapshot was taken: the model (into ``self.model.module``), optimizer, scheduler,\n        counters and this rank\'s entry of "rng" (``runner.set_rng_state``). Load with\n        ``map_location=self.device`` and ``weights_only=False`` (the file holds NumPy random\n        states, which the default ``weights_only=True`` refuses; it is your own file)."""\n',
              '        """Restore what ``save_snapshot`` wrote (``map_location`` = this rank\'s device), so\n        that training continues exactly where the snapshot was taken."""\n'),
             ("""        self.optimizer.load_state_dict(snapshot["optimizer"])
""",
              ''),
             ('        """One pass over this rank\'s part of the data (every rank a different part).\n\n        First tell the sampler which epoch this is (``set_epoch``: a new shuffle every epoch,\n        the same on every rank), before iterating over the loader.\n        """\n        # TODO: the sampler\'s epoch (see the docstring).\n',
              '        """One pass over this rank\'s part of the data (every rank a different part)."""\n        # TODO: tell the sampler which epoch this is (a new shuffle every epoch, the same on\n        # every rank), before iterating over the loader.\n'),
         )),
    Flaw('snapshots', 'scheduler_not_restored', clause='restore-what-save', case='?',
         why=('the snapshot holds the '
              "scheduler's state but load_snapshot never restores it: after a restart the learning-rate"
              ' warm-up starts again from its first step.'),
         patch=(
             ("""        self.scheduler.load_state_dict(snapshot["scheduler"])
""",
              ''),
         )),
    Flaw('snapshots', 'wrapped_state_dict', clause='snapshot-dict-torch', case='?',
         why=("the snapshot holds the DDP wrapper's "
              "state_dict (self.model.state_dict(): every key starts with 'module.') and loads it back "
              'into the wrapper: resuming works, but the snapshot does not load into the model without '
              'DDP (evaluation, a single-process run).'),
         patch=(
             ("""            snapshot = {"model": self.model.module.state_dict(),
""",
              """            snapshot = {"model": self.model.state_dict(),
"""),
             ("""        self.model.module.load_state_dict(snapshot["model"])
""",
              """        self.model.load_state_dict(snapshot["model"])
"""),
         )),
    Flaw('trainer', 'no_ddp', clause='move-model-device', case='?',
         why=('the model is moved to the device but never wrapped '
              'in DistributedDataParallel, so each rank trains its own model on its own part of the '
              "data (no broadcast of rank 0's initial parameters, no gradient averaging)."),
         patch=(
             ('    """\n    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])\n',
              '    """\n    ### BEGIN SOLUTION\n    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])\n'),
             ("""    return rank, local_rank, world_size, device

""",
              """    return rank, local_rank, world_size, device
    ### END SOLUTION

"""),
             ("""        # TODO: DDP, the sampler and the loader, then the snapshot (see the docstring).
""",
              """        # TODO: move the model to the device and wrap it in DDP (device_ids=[local_rank] on a
        # GPU, none on the CPU); a DistributedSampler (shuffle, seed=config.seed) over
        # train_set and a DataLoader with config.batch_size examples per worker; then, if
        # the snapshot file config.snapshot exists, load it (self.load_snapshot()).
        ### BEGIN SOLUTION
"""),
             ("""        self.model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
""",
              """        self.model = model          # FLAW: not wrapped in DistributedDataParallel
"""),
             ("""            self.load_snapshot()

""",
              """            self.load_snapshot()
        ### END SOLUTION

"""),
             ('        """Write everything needed to resume exactly; rank 0 writes.\n',
              '        """Write everything needed to resume exactly; rank 0 writes, every rank waits.\n'),
             ("""        never leaves a torn snapshot). A barrier after it keeps the other ranks from running
        ahead while rank 0 writes (a courtesy here: DDP's next all-reduce waits for rank 0).
""",
              """        never leaves a torn snapshot); then all ranks meet at a barrier.
"""),
             ('        """\n        rng = [None] * self.world_size\n',
              '        """\n        ### BEGIN SOLUTION\n        rng = [None] * self.world_size\n'),
             ("""            snapshot = {"model": self.model.module.state_dict(),
""",
              """            snapshot = {"model": self.model.state_dict(),
"""),
             ("""        dist.barrier()

""",
              """        dist.barrier()
        ### END SOLUTION

"""),
             ('        """Restore what ``save_snapshot`` wrote, so that training continues exactly where the\n        snapshot was taken: the model (into ``self.model.module``), optimizer, scheduler,\n        counters and this rank\'s entry of "rng" (``runner.set_rng_state``). Load with\n        ``map_location=self.device`` and ``weights_only=False`` (the file holds NumPy random\n        states, which the default ``weights_only=True`` refuses; it is your own file)."""\n',
              '        """Restore what ``save_snapshot`` wrote (``map_location`` = this rank\'s device), so\n        that training continues exactly where the snapshot was taken."""\n        ### BEGIN SOLUTION\n'),
             ("""        self.model.module.load_state_dict(snapshot["model"])
""",
              """        self.model.load_state_dict(snapshot["model"])
"""),
             ("""        runner.set_rng_state(snapshot["rng"][self.rank])
        if self.rank == 0:
""",
              """        runner.set_rng_state(snapshot["rng"][self.rank])
        ### END SOLUTION
        if self.rank == 0:
"""),
             ('        """One pass over this rank\'s part of the data (every rank a different part).\n\n        First tell the sampler which epoch this is (``set_epoch``: a new shuffle every epoch,\n        the same on every rank), before iterating over the loader.\n        """\n        # TODO: the sampler\'s epoch (see the docstring).\n',
              '        """One pass over this rank\'s part of the data (every rank a different part)."""\n        # TODO: tell the sampler which epoch this is (a new shuffle every epoch, the same on\n        # every rank), before iterating over the loader.\n        ### BEGIN SOLUTION\n'),
             ("""        self.sampler.set_epoch(epoch)
        self.model.train()
""",
              """        self.sampler.set_epoch(epoch)
        ### END SOLUTION
        self.model.train()
"""),
         )),
    Flaw('trainer', 'no_set_epoch', clause='first-tell-sampler', case='?',
         why=('the sampler is never told the epoch, so every'
              ' epoch visits the data in the same order.'),
         patch=(
             ("""        # TODO: DDP, the sampler and the loader, then the snapshot (see the docstring).
""",
              """        # TODO: move the model to the device and wrap it in DDP (device_ids=[local_rank] on a
        # GPU, none on the CPU); a DistributedSampler (shuffle, seed=config.seed) over
        # train_set and a DataLoader with config.batch_size examples per worker; then, if
        # the snapshot file config.snapshot exists, load it (self.load_snapshot()).
"""),
             ('        """Write everything needed to resume exactly; rank 0 writes.\n',
              '        """Write everything needed to resume exactly; rank 0 writes, every rank waits.\n'),
             ("""        never leaves a torn snapshot). A barrier after it keeps the other ranks from running
        ahead while rank 0 writes (a courtesy here: DDP's next all-reduce waits for rank 0).
""",
              """        never leaves a torn snapshot); then all ranks meet at a barrier.
"""),
             ('        """Restore what ``save_snapshot`` wrote, so that training continues exactly where the\n        snapshot was taken: the model (into ``self.model.module``), optimizer, scheduler,\n        counters and this rank\'s entry of "rng" (``runner.set_rng_state``). Load with\n        ``map_location=self.device`` and ``weights_only=False`` (the file holds NumPy random\n        states, which the default ``weights_only=True`` refuses; it is your own file)."""\n',
              '        """Restore what ``save_snapshot`` wrote (``map_location`` = this rank\'s device), so\n        that training continues exactly where the snapshot was taken."""\n'),
             ('        """One pass over this rank\'s part of the data (every rank a different part).\n\n        First tell the sampler which epoch this is (``set_epoch``: a new shuffle every epoch,\n        the same on every rank), before iterating over the loader.\n        """\n        # TODO: the sampler\'s epoch (see the docstring).\n        self.sampler.set_epoch(epoch)\n',
              '        """One pass over this rank\'s part of the data (every rank a different part)."""\n        # TODO: tell the sampler which epoch this is (a new shuffle every epoch, the same on\n        # every rank), before iterating over the loader.\n        pass\n'),
         )),
    Flaw('trainer', 'no_timeout', clause='cuda-backend-nccl', case='?',
         why=('ddp_setup joins the group as the seed report '
              'did, init_process_group(backend) without timeout=: the default is 30 minutes, so a rank '
              'that misses a collective hangs the job for half an hour instead of failing after '
              'config.timeout_s seconds.'),
         patch=(
             ("""    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=config.timeout_s))
""",
              """    dist.init_process_group(backend)
"""),
         )),
    Flaw('trainer', 'sampler_ignores_seed', clause='self-sampler-distributedsampler', case='?',
         why=('the DistributedSampler is built '
              "without seed=config.seed, so it shuffles with its default seed 0 whatever the run's "
              'seed: runs with different seeds see the data in the same order.'),
         patch=(
             ("""                                          shuffle=True, seed=config.seed)
""",
              """                                          shuffle=True)
"""),
         )),
]

