"""What notebook 04's exercises promise: their contracts, clause by clause, with the check cases
that hold each clause.

``CONTRACT[exercise]`` lists :class:`~exercise_utils.contract.Clause` rows: every Args / Returns
clause of the exercise's docstrings and every behavioural sentence of the notebook, word for
word, and the cases of :mod:`.checks` / :mod:`.checks_rank` that exercise it. Every case
rejects at least one known-wrong file of ``tests/wrong/04_flaws.py``, which names the clause it
breaks (``tests/test_requirements.py``, ``tests/test_checks.py``).

Cases of ``rank_process`` (each verified on every run: 1, 2 and 3 ranks; no GPU, one GPU, a
GPU per rank, simulated): ``rp-train`` (train called, in a group of the right ranks),
``rp-store``, ``rp-group``, ``rp-timeout``, ``rp-backend``, ``rp-barrier``, ``rp-destroy``,
``rp-return``, ``rp-raise``. Cases of ``train`` (each verified on every run: 2, 3 and 1 ranks,
``ema_every`` 2, 2 and 3): ``train-counts``, ``train-slices``, ``train-init``, ``train-step``,
``train-leader``, ``train-ema``, ``train-validates``, ``train-returns``, ``train-loss`` (each
epoch record's training loss against the judge's replay of rank 0's minibatches),
``train-accuracy`` (each epoch record's accuracy against the judge's own evaluation of the
replayed EMA model on the test set).

Used in 04_resnet_cifar_data_parallel.
"""
from ..contract import Clause

CONTRACT = {
    "rank_process": [
        Clause("store", "Create the rendezvous store: a ``dist.TCPStore`` at "
               "``config.master_addr``, ``config.master_port``", cases=("rp-store",)),
        Clause("hosted", "hosted by rank 0 (``is_master=True`` there only), for ``world_size`` "
               "ranks", cases=("rp-store",)),
        Clause("store-timeout", "with a timeout of ``config.timeout_s`` seconds",
               cases=("rp-timeout",)),
        Clause("group", "Initialise the default process group on that store with the same "
               "timeout", cases=("rp-group", "rp-timeout")),
        Clause("backend", 'backend "nccl" when CUDA has at least ``world_size`` GPUs (rank r '
               'then trains on ``cuda:r``), otherwise "gloo" (on ``cuda:0`` if there is one '
               'GPU, shared by the ranks, else on CPU).', cases=("rp-backend",)),
        Clause("choose-backend", "``runner.choose_backend(world_size, rank)`` returns that "
               "(backend, device) pair.", cases=("rp-backend",)),
        Clause("train-call", "Run ``train(rank, world_size, config, device)``",
               cases=("rp-train",)),
        Clause("barrier-destroy", "when it returns, ``dist.barrier()``, then always (also when "
               "train raised) ``dist.destroy_process_group()``.",
               cases=("rp-barrier", "rp-destroy", "rp-raise")),
        Clause("raise", "An exception of ``train`` reaches the caller (after that cleanup).",
               cases=("rp-raise",)),
        Clause("returns", "What ``train`` returned.", cases=("rp-return",)),
        Clause("rendezvous", "a `dist.TCPStore` hosted by rank 0 at "
               "`config.master_addr:config.master_port` is the rendezvous",
               cases=("rp-store",)),
        Clause("connects", "`dist.init_process_group(backend, store=store, rank=rank, "
               "world_size=world_size, timeout=...)` connects the ranks.",
               cases=("rp-group", "rp-train")),
        Clause("nccl-gloo", "Use **NCCL** when CUDA has a GPU for every rank (rank r on "
               "`cuda:r`; NCCL cannot put two ranks on one GPU), **gloo** otherwise — on a "
               "single shared GPU or on the CPU.", cases=("rp-backend",)),
        Clause("short-timeout", "Always pass a short `timeout`: gloo's default is 30 minutes.",
               cases=("rp-timeout",)),
    ],
    "train": [
        Clause("one-step", "A data-parallel step must equal the single-process step on the "
               "whole batch.", cases=("train-step",)),
        Clause("own-part", "Rank r trains on its own part of the data.",
               cases=("train-slices",)),
        Clause("same-count", "Every rank must run the *same number of minibatches*",
               cases=("train-counts",)),
        Clause("examples", "Give every rank `len(data) // world_size` examples (drop the "
               "remainder; `T.minibatches` drops incomplete minibatches).",
               cases=("train-slices",)),
        Clause("same-start", "make every rank start from the same model: rank 0's parameters "
               "and buffers.", cases=("train-init",)),
        Clause("broadcast", "broadcast its parameters and buffers (`dist.broadcast` of every "
               "tensor of `model.state_dict()`, in place: frozen parameters and BatchNorm "
               "statistics included).", cases=("train-init",)),
        Clause("reseed", "Seeding every rank alike again and rebuilding the model works too, "
               "if the whitening comes from the same data on every rank (whitening from each "
               "rank's own slice would give every rank a different first layer); seeding "
               "alike *after* the model was built comes too late.", cases=("train-init",)),
        Clause("after-backward", "each rank trains on its own slice of the training set, "
               "starts from the same model, all-reduces gradients after ``backward``, and only "
               "the leader keeps the EMA model, validates and logs.", cases=("train-step",)),
        Clause("scale", "So divide by `world_size` (or build the optimizer for `batch_size` "
               "and do not divide; the same update).", cases=("train-step",)),
        Clause("leader-ema", "the EMA model (used for validation): on the leader only (ema = "
               "None elsewhere).", cases=("train-leader",)),
        Clause("one-leader", "The replicas are identical, so one EMA model, one validation "
               "and one log are enough: rank 0's.", cases=("train-leader", "train-returns")),
        Clause("ema-steps", "The leader updates its EMA model after optimizer steps "
               "`ema_every`, `2 * ema_every`, … (counted from 1 over all epochs, each update "
               "after `opt.step()`)", cases=("train-ema",)),
        Clause("validates", "validates the EMA model, not the trained one, once per epoch.",
               cases=("train-validates",)),
        Clause("test-set", "It validates on the test set (`test_set`, which the given code "
               "loads for the leader)", cases=("train-accuracy",)),
        Clause("record", "each epoch's record holds that accuracy and the training loss per "
               "example of rank 0's minibatches (`loss_sum / seen`).",
               cases=("train-loss", "train-accuracy")),
        Clause("returns", "dict: on every rank the data sizes and minibatch counts; on the "
               "leader also one record per epoch (time, training loss, validation accuracy of "
               "the EMA model).", cases=("train-returns",)),
    ],
}
