"""What notebook 05's exercises promise: their contracts, clause by clause, with the check cases
that hold each clause.

``CONTRACT[exercise]`` lists :class:`~exercise_utils.contract.Clause` rows: every Args / Returns
clause of the docstrings of ``work/05_trainer.py`` and every behavioural sentence of the
notebook about the exercise, word for word, and the cases of :mod:`.checks` (``trainer``) and
:mod:`.checks_snapshots` (``snapshots``) that exercise it. Every case rejects at least one
known-wrong file of ``tests/wrong/05_flaws.py``, which names the clause it breaks
(``tests/test_requirements.py``, ``tests/test_checks.py``).

The ``setup-*``, ``trainer-gpu-ddp`` and one ``resume-map-location`` case judge the GPU paths,
and one ``resume-rng`` case the entry a worker of a second node restores (rank, not local
rank), simulated on the CPU (:mod:`.simulate`); the ``resume-*`` cases compare each rank's state
when an epoch starts after a resume with the uninterrupted run's at the same point.

Used in 05_ddp_torchrun_fault_tolerance.
"""
from ..contract import Clause

CONTRACT = {
    "trainer": [
        Clause("returns", "Join the job torchrun started; return ``(rank, local_rank, "
               "world_size, device)``.", cases=("setup-rank",)),
        Clause("backend", "With CUDA: backend \"nccl\", device ``cuda:LOCAL_RANK`` (also "
               "``torch.cuda.set_device`` it); otherwise \"gloo\" and the CPU.",
               cases=("setup-cuda", "setup-cpu")),
        Clause("timeout", "Timeout: ``config.timeout_s`` seconds.", cases=("setup-timeout",)),
        Clause("short-timeout", "With a short `timeout` a missing collective fails in seconds, "
               "not 30 minutes.", cases=("setup-timeout",)),
        Clause("gpu", "On GPUs: NCCL, `torch.cuda.set_device(local_rank)`, the model on "
               "`cuda:LOCAL_RANK` and `DDP(model, device_ids=[local_rank])`. On CPUs: gloo, and "
               "no `device_ids`.", cases=("setup-cuda", "trainer-gpu-ddp")),
        Clause("ddp", "Move the model to ``device`` and wrap it in DDP (``device_ids=[local_rank]``"
               " on a GPU, none on the CPU).", cases=("trainer-gpu-ddp", "trainer-ddp")),
        Clause("replicas", "every rank's parameters at the end (they must agree although every "
               "rank initialised its model from a different seed)", cases=("trainer-ddp",)),
        Clause("sampler", "``self.sampler``: a DistributedSampler over train_set (shuffle, "
               "seed=config.seed) that gives every rank a different part of the data;",
               cases=("trainer-sampler",)),
        Clause("loader", "``self.loader``: a DataLoader that draws from ``self.sampler``, with "
               "config.batch_size examples per worker.", cases=("trainer-loader",)),
        Clause("load-if-exists", "Then, if the snapshot file config.snapshot exists, load it "
               "(``self.load_snapshot()``).", cases=("trainer-no-snapshot",)),
        Clause("counters", "``epochs_run`` (epochs finished), ``step`` (optimizer steps taken "
               "since training began, never reset)", cases=("trainer-counters",)),
        Clause("one-pass", "One pass over this rank's part of the data (every rank a different "
               "part).", cases=("trainer-counters",)),
        Clause("set-epoch", "First tell the sampler which epoch this is (``set_epoch(epoch)``: a "
               "new shuffle every epoch, the same on every rank, and the same again when a "
               "restarted job redoes the epoch), before iterating over the loader.",
               cases=("trainer-set-epoch",)),
        Clause("same-order", "Without `sampler.set_epoch(epoch)` every epoch visits the data in "
               "the same order.", cases=("trainer-set-epoch",)),
        Clause("train", "Run the remaining epochs; snapshot every config.save_every epochs; "
               "rank 0 logs.", cases=("trainer-save-every", "trainer-logs")),
        Clause("rank0-logs", "**Rank 0 logs**; every rank trains.", cases=("trainer-logs",)),
    ],
    "snapshots": [
        Clause("rank0", "Write everything needed to resume exactly; rank 0 writes.",
               cases=("snapshot-rank0",)),
        Clause("alone", "Rank 0 alone writes it (every replica holds the same model; several "
               "writers would race on one file), and **atomically**: `torch.save` to "
               "`snapshot.pt.tmp`, then `os.replace(tmp, snapshot)`.",
               cases=("snapshot-rank0", "snapshot-atomic")),
        Clause("contents", "The snapshot (a dict for ``torch.save``) holds: \"model\" (the "
               "unwrapped module's state_dict), \"optimizer\", \"scheduler\", \"epochs_run\", "
               "\"step\", and \"rng\"", cases=("snapshot-contents", "snapshot-model",
                                             "snapshot-optimizer", "snapshot-scheduler")),
        Clause("rng", "the random states of EVERY rank (``runner.rng_state()`` gathered with "
               "all_gather_object; rank r restores entry r).", cases=("snapshot-rng",
                                                                      "resume-rng")),
        Clause("when-taken", "Each entry holds what it was when the snapshot was taken.",
               cases=("snapshot-model", "snapshot-optimizer", "snapshot-scheduler",
                      "snapshot-counters", "snapshot-rng")),
        Clause("end-of-epoch", "Snapshots are taken at the end of an epoch.",
               cases=("snapshot-counters",)),
        Clause("beside", "Rank 0 writes it to a temporary file next to config.snapshot (in its "
               "folder: a rename is atomic only within one file system) and renames it over "
               "config.snapshot", cases=("snapshot-atomic",)),
        Clause("torn", "(``os.replace``: atomic, so a crash during the write never leaves a torn "
               "snapshot)", cases=("snapshot-torn",)),
        Clause("old-intact", "A crash during `torch.save` then leaves the old snapshot intact, "
               "never a torn file that the restarted job would fail to load.",
               cases=("snapshot-torn",)),
        Clause("load-if-exists", "Then, if the snapshot file config.snapshot exists, load it "
               "(``self.load_snapshot()``).", cases=("resume-loads",)),
        Clause("restore", "Restore what ``save_snapshot`` wrote, so that training continues "
               "exactly where the snapshot was taken: the model (into ``self.model.module``), "
               "optimizer, scheduler, counters and this rank's entry of \"rng\" "
               "(``runner.set_rng_state``).", cases=("resume-model", "resume-optimizer",
                                                    "resume-scheduler", "resume-counters",
                                                    "resume-rng")),
        Clause("load-with", "Load with ``map_location=self.device`` and ``weights_only=False``",
               cases=("resume-map-location", "resume-loads")),
        Clause("own-device", "Loading uses `map_location=self.device`: a snapshot saved from "
               "`cuda:0` is loaded onto each rank's own device, not all onto GPU 0.",
               cases=("resume-map-location",)),
        Clause("redo", "the restarted job redoes it from the epoch-1 snapshot — with the same "
               "shuffle (`set_epoch(1)` gives the same order again) and the same random state — "
               "so no work is skipped and the redone part is bit-for-bit the same.",
               cases=("resume-set-epoch", "resume-rng", "resume-model")),
        Clause("finds", "a job that finds a snapshot **resumes** from it (running a finished "
               "job again does nothing).", cases=("resume-loads", "resume-counters")),
        Clause("exactly", "so that a job killed in the middle of an epoch and restarted by "
               "`torchrun --max-restarts` ends with **exactly** the parameters of a job that "
               "was never interrupted.", cases=("resume-model",)),
    ],
}
