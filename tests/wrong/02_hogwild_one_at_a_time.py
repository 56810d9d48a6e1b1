"""Wrong: starts each worker and joins it before starting the next, so the workers train one
after the other: every worker reads its partition and the model is trained, but nothing runs
in parallel (it is serial training, slowed down by the process start-ups).

Violates: "start them all, then join them all."
"""
import os

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler


def train_worker(rank, num_workers, model, dataset, epochs, batch_size, lr, seed, threads):
    torch.set_num_threads(threads)
    sampler = DistributedSampler(dataset, num_replicas=num_workers, rank=rank, shuffle=True,
                                 seed=seed)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()


def hogwild(model, dataset, num_workers, epochs=1, batch_size=32, lr=0.05, seed=0, threads=None):
    threads = threads or max(1, (os.cpu_count() or 1) // num_workers)
    model.share_memory()
    ctx = mp.get_context("spawn")
    for rank in range(num_workers):
        p = ctx.Process(target=train_worker, args=(rank, num_workers, model, dataset, epochs,
                                                   batch_size, lr, seed, threads))
        p.start()
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"Hogwild worker {rank} failed with exit code {p.exitcode}")
