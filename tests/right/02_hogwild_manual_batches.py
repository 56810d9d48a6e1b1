"""RIGHT (notebook 02, hogwild): no DataLoader: the worker takes its sampler's indices and
builds each batch with ``dataset[i]`` and ``torch.stack``; threads=None is resolved inside the
worker; the processes come from the standard library's ``multiprocessing`` spawn context
(torch registers its shared-memory pickling for it too), and they are joined in reverse order.

Written differently from the solution on purpose; the checker must accept it.
"""
import multiprocessing
import os

import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler


def train_worker(rank, num_workers, model, dataset, epochs, batch_size, lr, seed, threads):
    torch.set_num_threads(threads or max(1, os.cpu_count() // num_workers))
    sampler = DistributedSampler(dataset, num_replicas=num_workers, rank=rank, shuffle=True,
                                 seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        indices = list(sampler)
        for start in range(0, len(indices), batch_size):
            samples = [dataset[i] for i in indices[start:start + batch_size]]
            x = torch.stack([s[0] for s in samples])
            y = torch.stack([s[1] for s in samples])
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()


def hogwild(model, dataset, num_workers, epochs=1, batch_size=32, lr=0.05, seed=0, threads=None):
    model.share_memory()
    ctx = multiprocessing.get_context("spawn")
    workers = {}
    for rank in range(num_workers):
        workers[rank] = ctx.Process(target=train_worker, args=(
            rank, num_workers, model, dataset, epochs, batch_size, lr, seed, threads))
        workers[rank].start()
    for rank in reversed(range(num_workers)):
        workers[rank].join()
    for rank, proc in workers.items():
        if proc.exitcode:
            raise RuntimeError(f"Hogwild worker rank {rank} exited with code {proc.exitcode}")
