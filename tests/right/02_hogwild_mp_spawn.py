"""RIGHT (notebook 02, hogwild): ``torch.multiprocessing.spawn`` starts the workers (it passes
the process index as the first argument, which is the rank) and joins them; its exception is
turned into the RuntimeError asked for. The worker updates the parameters by hand
(``p -= lr * g``, with ``torch.autograd.grad``) instead of through ``torch.optim.SGD``: only the
parameters that require a gradient, and of those only the ones the forward used (frozen
parameters and unused layers have none, as the notebook says).

Written differently from the solution on purpose; the checker must accept it.
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
    loader = DataLoader(dataset, batch_size, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            params = [p for p in model.parameters() if p.requires_grad]
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    if g is not None:
                        p -= lr * g


def hogwild(model, dataset, num_workers, epochs=1, batch_size=32, lr=0.05, seed=0, threads=None):
    if threads is None:
        threads = max(1, os.cpu_count() // num_workers)
    model.share_memory()
    try:
        mp.spawn(train_worker, nprocs=num_workers, join=True,
                 args=(num_workers, model, dataset, epochs, batch_size, lr, seed, threads))
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        raise RuntimeError(f"Hogwild worker rank {exc.error_index} failed (exit code "
                           f"{getattr(exc, 'exit_code', 1)}): {exc}") from exc
