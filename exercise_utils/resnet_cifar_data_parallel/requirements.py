"""What notebook 04's exercises require, quoted from the notebook's text and docstrings.

``REQUIREMENTS[exercise]`` lists the sentences a correct file must satisfy, word for word as
the solution notebook states them. Every one has at least one wrong file in ``tests/wrong/``
whose docstring quotes it and which the exercise's check rejects; every wrong file quotes one
(``tests/test_requirements.py``). A requirement without a wrong file is either checked next
time or deleted from the notebook.

Used in 04_resnet_cifar_data_parallel.
"""
REQUIREMENTS = {
    "rank_process": [
        "Create the rendezvous store: a ``dist.TCPStore`` at ``config.master_addr``, "
        "``config.master_port``",
        "with a timeout of ``config.timeout_s`` seconds",
        "Initialise the default process group on that store with the same timeout",
        "when it returns, ``dist.barrier()``, then always (also when train raised) "
        "``dist.destroy_process_group()``.",
    ],
    "train": [
        "Rank r trains on its own part of the data.",
        "Every rank must run the *same number of minibatches*",
        "make every rank start from the same model: rank 0's parameters and buffers.",
        "So divide by `world_size` (or build the optimizer for `batch_size` and do not divide; "
        "the same update).",
        "the EMA model (used for validation): on the leader only (ema = None elsewhere).",
        "The leader updates its EMA model after optimizer steps `ema_every`, `2 * ema_every`, "
        "… (counted from 1, each update after `opt.step()`)",
        "validates the EMA model, not the trained one, once per epoch.",
    ],
}
