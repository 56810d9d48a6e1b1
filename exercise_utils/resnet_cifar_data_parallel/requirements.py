"""What notebook 04's exercises require, quoted from the notebook's text and docstrings.

``REQUIREMENTS[exercise]`` lists the sentences a correct file must satisfy, word for word as
the solution notebook states them. Every one has at least one wrong file in ``tests/wrong/``
whose docstring quotes it and which the exercise's check rejects; every wrong file quotes one
(``tests/test_requirements.py``). A requirement without a wrong file is either checked next
time or deleted from the notebook.

Used in 04_resnet_cifar_data_parallel.
"""
from ..contract import Clause

CONTRACT = {
    "rank_process": [
        Clause("create-rendezvous-store",
               "Create the rendezvous store: a ``dist.TCPStore`` at ``config.master_addr``, "
               "``config.master_port``",
               cases=()),
        Clause("timeout-config-timeout", "with a timeout of ``config.timeout_s`` seconds",
               cases=()),
        Clause("initialise-default-process", "Initialise the default process group on that store with the same timeout",
               cases=()),
        Clause("when-returns-dist",
               "when it returns, ``dist.barrier()``, then always (also when train raised) "
               "``dist.destroy_process_group()``.",
               cases=()),
    ],
    "train": [
        Clause("rank-r-trains", "Rank r trains on its own part of the data.",
               cases=()),
        Clause("rank-must-run", "Every rank must run the *same number of minibatches*",
               cases=()),
        Clause("make-rank-start", "make every rank start from the same model: rank 0's parameters and buffers.",
               cases=()),
        Clause("so-divide-world",
               "So divide by `world_size` (or build the optimizer for `batch_size` and do not "
               "divide; the same update).",
               cases=()),
        Clause("ema-model-used", "the EMA model (used for validation): on the leader only (ema = None elsewhere).",
               cases=()),
        Clause("leader-updates-ema",
               "The leader updates its EMA model after optimizer steps `ema_every`, `2 * "
               "ema_every`, … (counted from 1, each update after `opt.step()`)",
               cases=()),
        Clause("validates-ema-model", "validates the EMA model, not the trained one, once per epoch.",
               cases=()),
    ],
}
