"""Wrong: the weighting is right, but a misplaced return leaves the loop after the first
parameter, so the other gradients stay local (and the replicas drift apart).

Violates: "On return every rank's ``p.grad`` holds ``sum_r (n_r / N) * g_r``, with ``N`` the
total number of samples, itself obtained with an ``all_reduce``."
"""
import torch
import torch.distributed as dist


def average_gradients(model, num_samples, group=None):
    total = torch.tensor([float(num_samples)])
    dist.all_reduce(total, group=group)
    for p in model.parameters():
        if p.grad is not None:
            p.grad *= num_samples / total.item()
            dist.all_reduce(p.grad, group=group)
            return
