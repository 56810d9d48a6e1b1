"""Known-wrong files of notebook 05, as patches of the solution (see tests/flaws.py): one flaw
each, the way a student would make it, naming the clause of the contract it breaks
(exercise_utils/ddp_torchrun_fault_tolerance/requirements.py) and the check case that must
reject it."""
from flaws import Flaw

SETUP = '    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])\n'
CUDA = '        backend, device = "nccl", torch.device("cuda", local_rank)\n'
INIT = '    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=config.timeout_s))\n'
WRAP = ('        self.model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else '
        'None)\n')
LOADER = ('        self.loader = DataLoader(train_set, batch_size=config.batch_size, '
          'sampler=self.sampler)\n')
RESUME = '        if os.path.exists(config.snapshot):\n            self.load_snapshot()\n'
SET_EPOCH = '        self.sampler.set_epoch(epoch)\n'
WRITE = ('            tmp = f"{self.config.snapshot}.tmp"\n            torch.save(snapshot, tmp)\n'
         '            os.replace(tmp, self.config.snapshot)\n')
IF_RANK0 = '        if self.rank == 0:\n            snapshot = {"model"'
GATHER = '        rng = [None] * self.world_size\n        dist.all_gather_object(rng, runner.rng_state())\n'
LOAD = ('        snapshot = torch.load(self.config.snapshot, map_location=self.device,\n'
        '                              weights_only=False)\n')
SET_RNG = '        runner.set_rng_state(snapshot["rng"][self.rank])\n'

FLAWS = [
    # ------------------------------------------------------------------ ddp_setup (simulated)
    Flaw("trainer", "setup_local_rank_as_rank", clause="returns", case="setup-rank",
         why="takes the rank from LOCAL_RANK: right on one node, but on the second node worker "
             "3 calls itself rank 1.",
         expect="returned [1, 1, 4, 'cpu']",
         patch=((SETUP, '    rank = local_rank = int(os.environ["LOCAL_RANK"])\n'),)),
    Flaw("trainer", "setup_gloo_always", clause="backend", case="setup-cuda",
         why="chooses gloo on GPUs too (it works on CPUs, so the student never saw it fail).",
         expect="chose the backend 'gloo'; expected 'nccl'",
         patch=((CUDA, CUDA.replace('"nccl"', '"gloo"')),)),
    Flaw("trainer", "setup_nccl_if_available", clause="backend", case="setup-cpu",
         why="picks NCCL whenever torch was built with it (dist.is_nccl_available()), which is "
             "also true on a machine without a GPU.",
         expect="chose the backend 'nccl'; expected 'gloo'",
         patch=(("    if torch.cuda.is_available():\n",
                 "    if dist.is_nccl_available():\n"),)),
    Flaw("trainer", "setup_no_set_device", clause="gpu", case="setup-cuda",
         why="returns cuda:LOCAL_RANK but never calls torch.cuda.set_device, so NCCL's "
             "collectives of every worker of a node run on GPU 0.",
         expect="set_device with nothing; expected LOCAL_RANK (1)",
         patch=(("        torch.cuda.set_device(local_rank)\n", ""),)),
    Flaw("trainer", "setup_gpu_by_rank", clause="gpu", case="setup-cuda",
         why="the GPU is numbered by the global rank: worker 3 asks for cuda:3 on a node of 2 GPUs.",
         expect="returned the device 'cuda:3'; expected 'cuda:1'",
         patch=((CUDA, CUDA.replace('torch.device("cuda", local_rank)',
                                    'torch.device("cuda", rank)')),)),
    Flaw("trainer", "setup_no_timeout", clause="timeout", case="setup-timeout",
         why="init_process_group(backend) without timeout=, as the seed report did: a rank that "
             "misses a collective hangs the job for 30 minutes.",
         expect="timeout None s; expected config.timeout_s = 20 s",
         patch=((INIT, "    dist.init_process_group(backend)\n"),)),
    Flaw("trainer", "setup_timeout_minutes", clause="short-timeout", case="setup-timeout",
         why="timedelta(minutes=config.timeout_s): the timeout is 20 minutes instead of 20 s.",
         expect="timeout 1200.0 s",
         patch=((INIT, INIT.replace("seconds=", "minutes=")),)),
    # ------------------------------------------------------------------ __init__
    Flaw("trainer", "no_ddp", clause="ddp", case="trainer-ddp",
         why="moves the model to the device but never wraps it in DistributedDataParallel: each "
             "rank trains its own model on its own part of the data.",
         expect="self.model is not a DistributedDataParallel",
         patch=((WRAP, "        self.model = model\n"),)),
    Flaw("trainer", "device_ids_always", clause="ddp", case="trainer-ddp",
         why="passes device_ids=[local_rank] on the CPU too: DDP refuses device_ids for a CPU "
             "module.",
         expect="while your code ran init",
         patch=((WRAP, "        self.model = DDP(model, device_ids=[local_rank])\n"),)),
    Flaw("trainer", "gpu_device_ids_rank", clause="gpu", case="trainer-gpu-ddp",
         why="device_ids=[rank] on a GPU: the global rank, not the GPU of this node.",
         expect="device_ids=['3']); expected device_ids=[local_rank] = [1]",
         patch=((WRAP, WRAP.replace("device_ids=[local_rank]", "device_ids=[rank]")),)),
    Flaw("trainer", "model_not_moved", clause="ddp", case="trainer-gpu-ddp",
         why="never moves the model to the device (nothing changes on a CPU; on a GPU DDP gets "
             "a CPU model).",
         expect="moved the model to nowhere",
         patch=(("        model = model.to(device)\n", ""),)),
    Flaw("trainer", "no_sync_everywhere", clause="replicas", case="trainer-ddp",
         why="trains inside model.no_sync() (read as 'faster'): DDP never all-reduces, the "
             "replicas drift apart.",
         expect="the replicas differ at the end",
         patch=(("        for x, y in self.loader:\n            x, y = x.to(self.device), "
                 "y.to(self.device)\n",
                 "        with self.model.no_sync():\n          for x, y in self.loader:\n"
                 "            x, y = x.to(self.device), y.to(self.device)\n"),)),
    Flaw("trainer", "sampler_ignores_seed", clause="sampler", case="trainer-sampler",
         why="builds the DistributedSampler without seed=config.seed: it shuffles with its "
             "default seed 0 whatever the run's seed.",
         expect="iterated a DistributedSampler with {'seed': 0}",
         patch=(("                                          shuffle=True, seed=config.seed)\n",
                 "                                          shuffle=True)\n"),)),
    Flaw("trainer", "sampler_no_shuffle", clause="sampler", case="trainer-sampler",
         why="shuffle=False: every epoch visits each rank's part in the same order.",
         expect="{'shuffle': False}",
         patch=(("shuffle=True, seed=config.seed)", "shuffle=False, seed=config.seed)"),)),
    Flaw("trainer", "sampler_per_node", clause="sampler", case="trainer-sampler",
         why="splits the data among the node's workers (LOCAL_WORLD_SIZE, LOCAL_RANK): right on "
             "one node, but the workers of a second node read the same parts again.",
         expect="(num_replicas, rank) = (2, 1); expected (4, 3)",
         patch=(("        self.sampler = DistributedSampler(train_set, num_replicas=world_size, "
                 "rank=rank,\n",
                 "        self.sampler = DistributedSampler(\n"
                 "            train_set, num_replicas=int(os.environ[\"LOCAL_WORLD_SIZE\"]), "
                 "rank=local_rank,\n"),)),
    Flaw("trainer", "loader_shuffles_itself", clause="loader", case="trainer-loader",
         why="builds self.sampler but gives the DataLoader shuffle=True instead of it: every rank "
             "iterates the whole data set.",
         expect="self.loader does not draw from self.sampler",
         patch=((LOADER, "        self.loader = DataLoader(train_set, batch_size=config.batch_size,"
                         " shuffle=True)\n"),)),
    Flaw("trainer", "loader_global_batch", clause="loader", case="trainer-loader",
         why="batch_size=config.batch_size * world_size, read as the global batch.",
         expect="self.loader has batch_size 48; expected config.batch_size = 16",
         patch=((LOADER, LOADER.replace("batch_size=config.batch_size",
                                        "batch_size=config.batch_size * world_size")),)),
    Flaw("trainer", "load_always", clause="load-if-exists", case="trainer-no-snapshot",
         why="loads the snapshot without asking whether the file exists: a fresh job fails.",
         expect="FileNotFoundError",
         patch=((RESUME, "        self.load_snapshot()\n"),)),
    # ------------------------------------------------------------------ run_epoch, train
    Flaw("trainer", "step_reset_every_epoch", clause="counters", case="trainer-counters",
         why="counts the steps of the current epoch: self.step = 0 at the start of run_epoch.",
         expect="when epoch 2 began, (epochs_run, step) = (2, 6); expected (2, 12)",
         patch=((SET_EPOCH, SET_EPOCH + "        self.step = 0\n"),)),
    Flaw("trainer", "drop_last", clause="one-pass", case="trainer-counters",
         why="drop_last=True in the DataLoader: with 86 examples per rank the last 6 of every "
             "epoch are never trained on.",
         expect="(1, 5); expected (1, 6)",
         patch=((LOADER, LOADER.replace("sampler=self.sampler)",
                                        "sampler=self.sampler,\n"
                                        "                                 drop_last=True)")),)),
    Flaw("trainer", "no_set_epoch", clause="same-order", case="trainer-set-epoch",
         why="never tells the sampler the epoch: every epoch visits the data in the same order.",
         expect="was [0, 0, 0]; expected [0, 1, 2]",
         patch=((SET_EPOCH, ""),)),
    Flaw("trainer", "set_epoch_after_loop", clause="set-epoch", case="trainer-set-epoch",
         why="calls set_epoch(epoch) after the loop: each epoch iterates with the previous "
             "epoch's order.",
         expect="was [0, 0, 1]; expected [0, 1, 2]",
         patch=((SET_EPOCH, ""),
                ("        return total / max(count, 1)\n",
                 "        self.sampler.set_epoch(epoch)\n        return total / max(count, 1)\n"))),
    Flaw("trainer", "set_epoch_per_rank", clause="set-epoch", case="trainer-set-epoch",
         why="set_epoch(epoch + self.rank), thinking each rank needs its own shuffle: the ranks' "
             "permutations differ, so their parts overlap.",
         expect="rank 1: the sampler's epoch when each epoch's iteration began was [1, 2, 3]",
         patch=((SET_EPOCH, "        self.sampler.set_epoch(epoch + self.rank)\n"),)),
    Flaw("trainer", "save_every_off_by_one", clause="train", case="trainer-save-every",
         why="snapshots when epoch % save_every == 0, i.e. after the first epoch whatever "
             "save_every is.",
         expect="a snapshot was taken although config.save_every (1000)",
         patch=(("            if self.epochs_run % self.config.save_every == 0:\n",
                 "            if epoch % self.config.save_every == 0:\n"),)),
    Flaw("trainer", "every_rank_logs", clause="rank0-logs", case="trainer-logs",
         why="prints the epoch line on every rank.",
         expect="{0: 3, 1: 3, 2: 3}; expected none from the ranks other than 0",
         patch=(("            if self.rank == 0:\n                print(f\"epoch",
                 "            if True:\n                print(f\"epoch"),)),
    # ------------------------------------------------------------------ snapshots: writing
    Flaw("snapshots", "every_rank_saves", clause="rank0", case="snapshot-rank0",
         why="every rank writes the snapshot (each to the same temporary file, then os.replace "
             "over the same snapshot), racing on it.",
         expect="rank 1 wrote a file (torch.save to",
         patch=((IF_RANK0, '        if True:\n            snapshot = {"model"'),)),
    Flaw("snapshots", "every_rank_own_tmp", clause="alone", case="snapshot-rank0",
         why="every rank writes its own temporary file (tempfile.mkstemp beside the snapshot) "
             "and renames it over the snapshot: no two share a temporary file, all still write.",
         expect="rank 1 wrote a file",
         patch=((IF_RANK0, '        if True:\n            snapshot = {"model"'),
                (WRITE, "            import tempfile\n"
                        "            fd, tmp = tempfile.mkstemp(dir=os.path.dirname("
                        "self.config.snapshot))\n"
                        "            os.close(fd)\n            torch.save(snapshot, tmp)\n"
                        "            os.replace(tmp, self.config.snapshot)\n"))),
    Flaw("snapshots", "in_place", clause="alone", case="snapshot-atomic",
         why="rank 0 writes the snapshot directly over the previous one (no temporary file, no "
             "rename): a crash during the write leaves a torn file.",
         expect="torch.save wrote config.snapshot itself",
         patch=((WRITE, "            torch.save(snapshot, self.config.snapshot)\n"),)),
    Flaw("snapshots", "in_place_file_object", clause="alone", case="snapshot-atomic",
         why="writes the snapshot in place through an open file (flush and fsync, but no "
             "temporary file and no os.replace).",
         expect="torch.save wrote config.snapshot itself",
         patch=((WRITE, '            with open(self.config.snapshot, "wb") as out:\n'
                        "                torch.save(snapshot, out)\n"
                        "                out.flush()\n                os.fsync(out.fileno())\n"),)),
    Flaw("snapshots", "tmp_in_tmpdir", clause="beside", case="snapshot-atomic",
         why="the temporary file comes from tempfile.mkstemp() in /tmp, then os.replace over the "
             "snapshot: another file system in general (EXDEV, or a copy with shutil.move).",
         expect="is not next to config.snapshot",
         patch=((WRITE, "            import tempfile\n            fd, tmp = tempfile.mkstemp()\n"
                        "            os.close(fd)\n            torch.save(snapshot, tmp)\n"
                        "            os.replace(tmp, self.config.snapshot)\n"),)),
    Flaw("snapshots", "tmp_in_working_directory", clause="beside", case="snapshot-atomic",
         why="the temporary file is a bare name, so it lands in the working directory, not in "
             "the snapshot's folder.",
         expect="is not next to config.snapshot",
         patch=((WRITE, '            tmp = os.path.basename(self.config.snapshot) + ".tmp"\n'
                        "            torch.save(snapshot, tmp)\n"
                        "            os.replace(tmp, self.config.snapshot)\n"),)),
    Flaw("snapshots", "copy_over", clause="beside", case="snapshot-atomic",
         why="writes the temporary file, then copies it over the snapshot (shutil.copyfile): the "
             "copy is a write in place.",
         expect="renamed over config.snapshot",
         patch=(("            os.replace(tmp, self.config.snapshot)\n",
                 "            import shutil\n            shutil.copyfile(tmp, self.config.snapshot)\n"),)),
    Flaw("snapshots", "no_optimizer_state", clause="contents", case="snapshot-contents",
         why="the snapshot keeps the model, scheduler, counters and random states but not the "
             "optimizer: momentum restarts from zero.",
         expect="lacking ['optimizer']",
         patch=(('                        "optimizer": self.optimizer.state_dict(),\n', ""),
                ('        self.optimizer.load_state_dict(snapshot["optimizer"])\n', ""))),
    Flaw("snapshots", "wrapped_state_dict", clause="contents", case="snapshot-model",
         why="saves the DDP wrapper's state_dict (every key starts with 'module.') and loads it "
             "back into the wrapper: resuming works, but the file does not load into the model "
             "without DDP.",
         expect="'module.",
         patch=(('            snapshot = {"model": self.model.module.state_dict(),\n',
                 '            snapshot = {"model": self.model.state_dict(),\n'),
                ('        self.model.module.load_state_dict(snapshot["model"])\n',
                 '        self.model.load_state_dict(snapshot["model"])\n'))),
    Flaw("snapshots", "parameters_only", clause="contents", case="snapshot-model",
         why="saves {name: parameter} from named_parameters(): BatchNorm's running statistics "
             "and counter (buffers) are missing, and the tied weight under its second name.",
         expect="lacks ['back.weight', 'bn.num_batches_tracked', 'bn.running_mean']",
         patch=(('            snapshot = {"model": self.model.module.state_dict(),\n',
                 '            snapshot = {"model": dict(self.model.module.named_parameters()),\n'),
                ('        self.model.module.load_state_dict(snapshot["model"])\n',
                 '        self.model.module.load_state_dict(snapshot["model"], strict=False)\n'))),
    Flaw("snapshots", "model_in_float32", clause="when-taken", case="snapshot-model",
         why="stores the weights in float32 to halve the file: a float64 model comes back "
             "rounded.",
         expect="is float32, the model's float64",
         patch=(('            snapshot = {"model": self.model.module.state_dict(),\n',
                 '            snapshot = {"model": {k: v.float() if v.is_floating_point() else v\n'
                 '                                  for k, v in self.model.module.state_dict().items()},\n'),)),
    Flaw("snapshots", "optimizer_hyperparameters", clause="contents", case="snapshot-optimizer",
         why="stores only the optimizer's param_groups (learning rate, momentum factor), not its "
             "state: the momentum buffers restart from zero.",
         expect="momentum buffers",
         patch=(('                        "optimizer": self.optimizer.state_dict(),\n',
                 '                        "optimizer": {"state": {}, "param_groups":\n'
                 '                                      self.optimizer.state_dict()["param_groups"]},\n'),)),
    Flaw("snapshots", "scheduler_lr_only", clause="contents", case="snapshot-scheduler",
         why="stores the scheduler's last learning rate and puts it back into the optimizer: "
             "the next scheduler.step() starts the warm-up again.",
         expect="the scheduler had taken 8 steps",
         patch=(('                        "scheduler": self.scheduler.state_dict(),\n',
                 '                        "scheduler": {"lr": self.scheduler.get_last_lr()},\n'),
                ('        self.scheduler.load_state_dict(snapshot["scheduler"])\n',
                 '        for group, lr in zip(self.optimizer.param_groups, '
                 'snapshot["scheduler"]["lr"]):\n            group["lr"] = lr\n'))),
    Flaw("snapshots", "epochs_run_as_index", clause="end-of-epoch", case="snapshot-counters",
         why="stores the index of the last finished epoch (epochs_run - 1) and adds 1 back when "
             "loading: the round trip works, but the snapshot says no epoch was finished.",
         expect="holds (epochs_run, step) = (0, 8); expected (1, 8)",
         patch=(('                        "epochs_run": self.epochs_run, "step": self.step, '
                 '"rng": rng}\n',
                 '                        "epochs_run": self.epochs_run - 1, "step": self.step, '
                 '"rng": rng}\n'),
                ('        self.epochs_run, self.step = snapshot["epochs_run"], snapshot["step"]\n',
                 '        self.epochs_run, self.step = snapshot["epochs_run"] + 1, '
                 'snapshot["step"]\n'))),
    Flaw("snapshots", "snapshot_inside_run_epoch", clause="when-taken", case="snapshot-counters",
         why="takes the snapshot at the end of run_epoch, before train() counts the epoch as "
             "finished: the snapshot says one epoch fewer, and a restart repeats it.",
         expect="holds (epochs_run, step) = (0, 8)",
         patch=(("        return total / max(count, 1)\n",
                 "        self.save_snapshot()\n        return total / max(count, 1)\n"),
                ("            if self.epochs_run % self.config.save_every == 0:\n"
                 "                self.save_snapshot()\n", ""))),
    Flaw("snapshots", "rng_of_rank0_only", clause="rng", case="snapshot-rng",
         why="saves rank 0's random state alone (no gather) and restores it on every rank: the "
             "other ranks get rank 0's dropout masks after a restart.",
         expect="expected one random state per rank",
         patch=((GATHER, "        rng = runner.rng_state()\n"),
                (SET_RNG, '        runner.set_rng_state(snapshot["rng"])\n'))),
    Flaw("snapshots", "rng_copied_per_rank", clause="when-taken", case="snapshot-rng",
         why="fills the list with rank 0's state once per rank ([state] * world_size) instead "
             "of gathering each rank's.",
         expect="is not rank 1's random state",
         patch=((GATHER, "        rng = [runner.rng_state()] * self.world_size\n"),)),
    # ------------------------------------------------------------------ snapshots: resuming
    Flaw("snapshots", "rng_entry_0", clause="rng", case="resume-rng",
         why="every rank restores entry 0 of the random states (rank 0's).",
         expect="random state differs from rank 1's",
         patch=((SET_RNG, '        runner.set_rng_state(snapshot["rng"][0])\n'),)),
    Flaw("snapshots", "rng_by_local_rank", clause="rng", case="resume-rng",
         why="keeps local_rank in the trainer and restores entry self.local_rank: the same as "
             "the rank on one node, but on a second node worker 3 takes worker 1's state.",
         expect="rank r restores entry r",
         patch=(("        self.config, self.rank, self.world_size, self.device = config, rank, "
                 "world_size, device\n",
                 "        self.config, self.rank, self.world_size, self.device = config, rank, "
                 "world_size, device\n        self.local_rank = local_rank\n"),
                (SET_RNG, '        runner.set_rng_state(snapshot["rng"][self.local_rank])\n'))),
    Flaw("snapshots", "rng_torch_only", clause="restore", case="resume-rng",
         why="restores only torch's generator from this rank's entry (dropout uses it), not "
             "Python's and NumPy's.",
         expect="numpy, python random state differs",
         patch=((SET_RNG, '        torch.set_rng_state(snapshot["rng"][self.rank]["torch"])\n'),)),
    Flaw("snapshots", "scheduler_not_restored", clause="restore", case="resume-scheduler",
         why="the snapshot holds the scheduler's state but load_snapshot never restores it: the "
             "warm-up starts again after every restart.",
         expect="the scheduler's last_epoch and learning rate are",
         patch=(('        self.scheduler.load_state_dict(snapshot["scheduler"])\n', ""),)),
    Flaw("snapshots", "optimizer_not_restored", clause="restore", case="resume-optimizer",
         why="saves the optimizer but never loads it back: momentum restarts from zero.",
         expect="the momentum buffers",
         patch=(('        self.optimizer.load_state_dict(snapshot["optimizer"])\n', ""),)),
    Flaw("snapshots", "model_into_wrapper_not_strict", clause="restore", case="resume-model",
         why="loads the unwrapped state_dict into the DDP wrapper with strict=False (to silence "
             "the missing 'module.' keys): nothing is loaded.",
         expect="differs from the uninterrupted run's",
         patch=(('        self.model.module.load_state_dict(snapshot["model"])\n',
                 '        self.model.load_state_dict(snapshot["model"], strict=False)\n'),)),
    Flaw("snapshots", "model_on_rank0_only", clause="exactly", case="resume-model",
         why="only rank 0 loads the weights ('DDP syncs them'), but DDP broadcast the "
             "parameters when it was built, before the load: rank 1 keeps its initial weights.",
         expect="rank 1, when epoch 2 began",
         patch=(('        self.model.module.load_state_dict(snapshot["model"])\n',
                 '        if self.rank == 0:\n'
                 '            self.model.module.load_state_dict(snapshot["model"])\n'),)),
    Flaw("snapshots", "step_not_restored", clause="restore", case="resume-counters",
         why="restores epochs_run but not step: after a restart the step count starts at 0.",
         expect="(epochs_run, step) = (1, 0)",
         patch=(('        self.epochs_run, self.step = snapshot["epochs_run"], snapshot["step"]\n',
                 '        self.epochs_run = snapshot["epochs_run"]\n'),)),
    Flaw("snapshots", "train_ignores_epochs_run", clause="finds", case="resume-counters",
         why="train() runs range(config.epochs) from 0 whatever the snapshot says: a resumed "
             "job redoes every epoch.",
         expect="the job began with epoch 0",
         patch=(("        for epoch in range(self.epochs_run, self.config.epochs):\n",
                 "        for epoch in range(self.config.epochs):\n"),)),
    Flaw("snapshots", "set_epoch_next_after_loop", clause="redo", case="resume-set-epoch",
         why="prepares the next epoch's shuffle after the loop (set_epoch(epoch + 1)): right in "
             "an uninterrupted run, but a restarted job's fresh sampler iterates epoch 1 with "
             "epoch 0's order.",
         expect="the sampler's epoch when the iteration began was 0; expected 1",
         patch=((SET_EPOCH, ""),
                ("        return total / max(count, 1)\n",
                 "        self.sampler.set_epoch(epoch + 1)\n        return total / max(count, 1)\n"))),
    Flaw("snapshots", "no_map_location", clause="load-with", case="resume-map-location",
         why="torch.load without map_location: on GPUs every rank loads onto the GPU the tensors "
             "were saved from.",
         expect="map_location=None",
         patch=((LOAD, "        snapshot = torch.load(self.config.snapshot, weights_only=False)\n"),)),
    Flaw("snapshots", "map_location_cpu", clause="own-device", case="resume-map-location",
         why="map_location='cpu' (it worked on the student's laptop): on a GPU the snapshot is "
             "not loaded onto the rank's own device.",
         expect="map_location=cpu; expected self.device (cuda:1)",
         patch=((LOAD, LOAD.replace("map_location=self.device", 'map_location="cpu"')),)),
    Flaw("snapshots", "weights_only_default", clause="load-with", case="resume-loads",
         why="torch.load with the default weights_only=True, which refuses the NumPy random "
             "states in the file.",
         expect="Weights only load failed",
         patch=((LOAD, "        snapshot = torch.load(self.config.snapshot, "
                       "map_location=self.device)\n"),)),
    Flaw("snapshots", "never_loads", clause="load-if-exists", case="resume-loads",
         why="__init__ never loads the snapshot: a restarted job starts from scratch.",
         expect="no rank loaded it",
         patch=((RESUME, ""),)),
    Flaw("snapshots", "delete_before_write", clause="old-intact", case="snapshot-torn",
         why="removes the old snapshot before writing the new one (so that os.replace never "
             "meets an existing file): a crash during the write leaves no snapshot at all.",
         expect="found no snapshot to load",
         patch=((WRITE, "            if os.path.exists(self.config.snapshot):\n"
                        "                os.remove(self.config.snapshot)\n" + WRITE),)),
    Flaw("snapshots", "load_newest_tmp", clause="torn", case="snapshot-torn",
         why="loads the temporary file when there is one ('it is newer'): after a crash during "
             "the write that is the torn file.",
         expect="failed to load config.snapshot",
         patch=((LOAD, '        path = self.config.snapshot + ".tmp"\n'
                       "        if not os.path.exists(path):\n"
                       "            path = self.config.snapshot\n"
                       "        snapshot = torch.load(path, map_location=self.device, "
                       "weights_only=False)\n"),)),
]
