"""Wrong: the plain average sum_r g_r / world_size, ignoring that ranks hold different numbers
of samples (right only for equal partitions).

Violates: "On return every rank's ``p.grad`` holds ``sum_r (n_r / N) * g_r``, with ``N`` the
total number of samples, itself obtained with an ``all_reduce``."
"""
import torch
import torch.distributed as dist


def average_gradients(model, num_samples, group=None):
    world_size = dist.get_world_size(group)
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)
            p.grad /= world_size
