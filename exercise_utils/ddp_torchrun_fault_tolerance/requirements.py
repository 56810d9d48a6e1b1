"""What notebook 05's exercises require, quoted from the docstrings of ``work/05_trainer.py``.

``REQUIREMENTS[exercise]`` lists the sentences a correct file must satisfy, word for word as
the solution notebook states them. Every one has at least one wrong file in ``tests/wrong/``
whose docstring quotes it and which the exercise's check rejects; every wrong file quotes one
(``tests/test_requirements.py``). A requirement without a wrong file is either checked next
time or deleted from the notebook.

Two passages hold two requirements each, of which one has its wrong file and the other a test
without a torchrun launch (each launch costs 30 to 90 s of the test suite):
``test_setup_check_names_gpu_mistakes`` (the GPU half of ``ddp_setup``'s) and
``test_resumed_check_names_a_load_without_map_location`` (``tests/test_05_*.py``). Checked,
but not listed for want of a wrong file: "if the snapshot file config.snapshot exists, load
it" (``check_snapshots``: "after the restart no rank loaded the snapshot").

Used in 05_ddp_torchrun_fault_tolerance.
"""
from ..contract import Clause

CONTRACT = {
    "trainer": [
        Clause("cuda-backend-nccl",
               "With CUDA: backend \"nccl\", device ``cuda:LOCAL_RANK`` (also "
               "``torch.cuda.set_device`` it); otherwise \"gloo\" and the CPU. Timeout: "
               "``config.timeout_s`` seconds.",
               cases=()),
        Clause("move-model-device",
               "Move the model to ``device`` and wrap it in DDP (``device_ids=[local_rank]`` on "
               "a GPU, none on the CPU).",
               cases=()),
        Clause("self-sampler-distributedsampler",
               "``self.sampler``: a DistributedSampler over train_set (shuffle, "
               "seed=config.seed) that gives every rank a different part of the data; "
               "``self.loader``: a DataLoader with config.batch_size examples per worker.",
               cases=()),
        Clause("first-tell-sampler",
               "First tell the sampler which epoch this is (``set_epoch``: a new shuffle every "
               "epoch, the same on every rank), before iterating over the loader.",
               cases=()),
    ],
    "snapshots": [
        Clause("snapshot-dict-torch",
               "The snapshot (a dict for ``torch.save``) holds: \"model\" (the unwrapped module's "
               "state_dict), \"optimizer\", \"scheduler\", \"epochs_run\", \"step\", and \"rng\": the "
               "random states of EVERY rank (``runner.rng_state()`` gathered with "
               "all_gather_object; rank r restores entry r).",
               cases=()),
        Clause("rank-0-writes",
               "Rank 0 writes it to a temporary file next to config.snapshot and renames it over"
               " config.snapshot (``os.replace``: atomic, so a crash during the write never "
               "leaves a torn snapshot).",
               cases=()),
        Clause("restore-what-save",
               "Restore what ``save_snapshot`` wrote, so that training continues exactly where "
               "the snapshot was taken: the model (into ``self.model.module``), optimizer, "
               "scheduler, counters and this rank's entry of \"rng\" (``runner.set_rng_state``). "
               "Load with ``map_location=self.device``",
               cases=()),
    ],
}
