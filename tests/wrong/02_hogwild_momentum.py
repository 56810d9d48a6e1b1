"""Wrong: the usual training loop's SGD with momentum=0.9: every worker keeps its own private
momentum buffer, which is no longer the algorithm of the paper (and not what was asked).

Violates: "for each epoch in range(epochs): sampler.set_epoch(epoch), then one plain SGD step
(torch.optim.SGD(model.parameters(), lr=lr), no momentum) per batch on
F.cross_entropy(model(x), y)."
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
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
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
    failed = [f"rank {rank} (exit code {p.exitcode})" for rank, p in enumerate(procs)
              if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"Hogwild worker(s) failed: {', '.join(failed)}")
