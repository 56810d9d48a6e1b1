"""The contract of notebook 02's exercises, as data.

``CONTRACT[exercise]`` lists :class:`~exercise_utils.contract.Clause` rows: every Args / Returns
clause of the exercise's docstrings and every behavioural sentence of the notebook, word for
word, and the cases of :mod:`.checks` and :mod:`.checks_hogwild` that exercise it. Every case
rejects at least one known-wrong file of ``tests/wrong/02_flaws.py``, which names the clause
it breaks (``tests/test_requirements.py``, ``tests/test_checks.py``).

Used in 02_shared_memory_hogwild.
"""
from ..contract import Clause

CONTRACT = {
    "sampler": [
        Clause("returns", "Returns a list of int.", cases=("sampler-type",)),
        Clause("order", "order: if shuffle, torch.randperm(dataset_len, generator=g) with g a "
               "torch.Generator seeded with seed + epoch; otherwise 0, 1, ..., dataset_len - 1.",
               cases=("sampler-epoch", "sampler-seed", "sampler-order", "sampler-no-shuffle")),
        Clause("one-order", "one order for everybody", cases=("sampler-cover",)),
        Clause("equal-lengths", "equal lengths: with drop_last=False every replica gets "
               "ceil(dataset_len / num_replicas) indices: extend the order by repeating it from "
               "its start (as many times as needed) up to that many times num_replicas.",
               cases=("sampler-length", "sampler-padding")),
        Clause("again", "(again and again if `n` is smaller than `num_replicas`)",
               cases=("sampler-small",)),
        Clause("drop-last", "With drop_last=True every replica gets dataset_len // "
               "num_replicas: cut the tail of the order.", cases=("sampler-length",
                                                                   "sampler-drop")),
        Clause("share", "this replica's share: every num_replicas-th index of that list, "
               "starting at position rank.", cases=("sampler-interleave",)),
        Clause("any-size", "for every `num_replicas >= 1` and every `rank` below it, also when "
               "`dataset_len` is 0 or smaller than `num_replicas`.",
               cases=("sampler-small", "sampler-empty")),
        Clause("signature", "Write `partition_indices(dataset_len, num_replicas, rank, "
               "shuffle=True, seed=0, epoch=0, drop_last=False)` returning the same list as the "
               "sampler after `set_epoch(epoch)`.", cases=("sampler-signature",)),
        Clause("own-generator", "Shuffle with a generator of your own: like "
               "`DistributedSampler`, leave torch's global random state (`torch.manual_seed`) "
               "alone.", cases=("sampler-global-rng",)),
    ],
    "hogwild": [
        Clause("partition", "Train `model` in place on this worker's partition of `dataset` "
               "(runs in each worker).", cases=("worker-partition", "hogwild-partition")),
        Clause("threads", "torch.set_num_threads(threads): this process's share of the CPU "
               "cores.", cases=("worker-threads",)),
        Clause("sampler", "sampler = DistributedSampler(dataset, num_replicas=num_workers, "
               "rank=rank, shuffle=True, seed=seed); loader = DataLoader(dataset, batch_size, "
               "sampler=sampler).", cases=("worker-partition",)),
        Clause("epochs", "for each epoch in range(epochs): sampler.set_epoch(epoch), then one "
               "plain SGD step (torch.optim.SGD(model.parameters(), lr=lr), no momentum) per "
               "batch on F.cross_entropy(model(x), y).", cases=("worker-set-epoch", "worker-sgd")),
        Clause("itself", "Update `model` itself, never a copy of it.",
               cases=("worker-in-place",)),
        Clause("any-model", "`model` may be any module: float32 or float64 (do not cast the "
               "data or the model), with frozen parameters and layers the forward does not use "
               "(their `.grad` stays `None`: `torch.optim.SGD` skips them), and buffers such as "
               "BatchNorm's.", cases=("worker-float64", "worker-edge")),
        Clause("share-memory", "model.share_memory(): the parameters move to shared memory, so "
               "that every worker updates the very same tensors as this process.",
               cases=("hogwild-shared",)),
        Clause("threads-none", "threads=None means max(1, os.cpu_count() // num_workers) "
               "threads per worker.", cases=("default-threads",)),   # (more workers than cores)
        Clause("spawn", "start one process per rank with the \"spawn\" context of "
               "torch.multiprocessing", cases=("hogwild-processes", "hogwild-spawn")),
        Clause("args", "target train_worker, args (rank, num_workers, model, dataset, epochs, "
               "batch_size, lr, seed, threads)", cases=("hogwild-partition", "hogwild-threads")),
        Clause("together", "start them all, then join them all.", cases=("hogwild-together",)),
        Clause("no-lock", "Take no lock: Hogwild's workers run their steps at the same time, "
               "each one reading and updating the shared parameters whenever it likes.",
               cases=("hogwild-lock-free",)),
        Clause("raise", "raise RuntimeError (naming the rank and its exit code) if any worker's "
               "exit code is not 0", cases=("crash-exception", "crash-type", "crash-message")),
        Clause("signal", "A worker that raises an exception ends with exit code 1; one killed "
               "by a signal ends with a negative exit code (-9 for SIGKILL, which is also what "
               "the kernel's out-of-memory killer sends): both are failures.",
               cases=("crash-signal",)),
        Clause("join-first", "Join every worker before you raise, so that none is left "
               "running, and name the failed rank and its exit code in the message.",
               cases=("crash-joined", "crash-message")),
    ],
}
