"""RIGHT (notebook 02, hogwild): batches come from a DataLoader driven by an explicit
BatchSampler (batch_sampler=, not batch_size=/sampler=); the plain SGD step is written by hand
(p.add_(grad, alpha=-lr) under no_grad, grads reset to None, like torch.optim.SGD without
momentum); the parent waits on the workers' sentinels with multiprocessing.connection.wait
before joining them, and reports every failed rank at once.

Written from the release notebook alone; the checker must accept it.
"""
import os
from multiprocessing.connection import wait

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler


def _sgd_step(params, lr):
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
                p.grad = None


def train_worker(rank, num_workers, model, dataset, epochs, batch_size, lr, seed, threads):
    '''Train `model` in place on this worker's partition of `dataset` (runs in each worker).'''
    torch.set_num_threads(threads)
    sampler = DistributedSampler(dataset, num_replicas=num_workers, rank=rank,
                                 shuffle=True, seed=seed)
    batches = BatchSampler(sampler, batch_size=batch_size, drop_last=False)
    loader = DataLoader(dataset, batch_sampler=batches)
    params = list(model.parameters())          # deduplicated: tied weights appear once
    for p in params:
        p.grad = None
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            _sgd_step(params, lr)


def hogwild(model, dataset, num_workers, epochs=1, batch_size=32, lr=0.05, seed=0, threads=None):
    '''Train `model` with `num_workers` processes at once (Hogwild!); return when all are done.'''
    model.share_memory()
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // num_workers)
    ctx = mp.get_context("spawn")
    workers = {}
    for rank in range(num_workers):
        proc = ctx.Process(target=train_worker,
                           args=(rank, num_workers, model, dataset, epochs, batch_size, lr,
                                 seed, threads))
        workers[rank] = proc
    for proc in workers.values():
        proc.start()
    pending = {proc.sentinel: proc for proc in workers.values()}
    while pending:
        for sentinel in wait(list(pending)):
            pending.pop(sentinel).join()
    failed = [(rank, proc.exitcode) for rank, proc in workers.items() if proc.exitcode != 0]
    if failed:
        raise RuntimeError("Hogwild worker(s) failed: " + ", ".join(
            f"rank {rank} exited with exit code {code}" for rank, code in failed))
