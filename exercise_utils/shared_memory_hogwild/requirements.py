"""What notebook 02's exercises require, quoted from the notebook's text and docstrings.

``REQUIREMENTS[exercise]`` lists the sentences a correct file must satisfy, word for word as
the solution notebook states them. Every one has at least one wrong file in ``tests/wrong/``
whose docstring quotes it and which the exercise's check rejects; every wrong file quotes one
(``tests/test_requirements.py``). A requirement without a wrong file is either checked next
time or deleted from the notebook.

Used in 02_shared_memory_hogwild.
"""
from ..contract import Clause

CONTRACT = {
    "sampler": [
        Clause("order-if-shuffle",
               "order: if shuffle, torch.randperm(dataset_len, generator=g) with g a "
               "torch.Generator seeded with seed + epoch; otherwise 0, 1, ..., dataset_len - 1.",
               cases=()),
        Clause("equal-lengths-drop",
               "equal lengths: with drop_last=False every replica gets ceil(dataset_len / "
               "num_replicas) indices: extend the order by repeating it from its start (as many "
               "times as needed) up to that many times num_replicas.",
               cases=()),
        Clause("drop-last-true",
               "With drop_last=True every replica gets dataset_len // num_replicas: cut the tail"
               " of the order.",
               cases=()),
        Clause("this-replica-s",
               "this replica's share: every num_replicas-th index of that list, starting at "
               "position rank.",
               cases=()),
    ],
    "hogwild": [
        Clause("train-model-place",
               "Train `model` in place on this worker's partition of `dataset` (runs in each "
               "worker).",
               cases=()),
        Clause("torch-set-num", "torch.set_num_threads(threads): this process's share of the CPU cores.",
               cases=()),
        Clause("sampler-distributedsampler-dataset",
               "sampler = DistributedSampler(dataset, num_replicas=num_workers, rank=rank, "
               "shuffle=True, seed=seed); loader = DataLoader(dataset, batch_size, "
               "sampler=sampler).",
               cases=()),
        Clause("epoch-range-epochs",
               "for each epoch in range(epochs): sampler.set_epoch(epoch), then one plain SGD "
               "step (torch.optim.SGD(model.parameters(), lr=lr), no momentum) per batch on "
               "F.cross_entropy(model(x), y).",
               cases=()),
        Clause("update-model-itself", "Update `model` itself, never a copy of it.",
               cases=()),
        Clause("model-share-memory",
               "model.share_memory(): the parameters move to shared memory, so that every worker"
               " updates the very same tensors as this process.",
               cases=()),
        Clause("threads-none-means", "threads=None means max(1, os.cpu_count() // num_workers) threads per worker.",
               cases=()),
        Clause("start-one-process", 'start one process per rank with the "spawn" context of torch.multiprocessing',
               cases=()),
        Clause("start-them-all", "start them all, then join them all.",
               cases=()),
        Clause("raise-runtimeerror-naming",
               "raise RuntimeError (naming the rank and its exit code) if any worker's exit code"
               " is not 0.",
               cases=()),
    ],
}
