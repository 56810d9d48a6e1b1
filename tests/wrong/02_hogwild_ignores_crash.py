"""Wrong: joins the workers but never looks at their exit codes: a crashed worker goes unnoticed.

Violates: "raise RuntimeError (naming the rank and its exit code) if any worker's exit code is
not 0."
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
    procs = [ctx.Process(target=train_worker, args=(rank, num_workers, model, dataset, epochs,
                                                    batch_size, lr, seed, threads))
             for rank in range(num_workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
