"""Wrong: correct weighting, but it does not skip parameters without a gradient (frozen or
unused ones have p.grad None), so it crashes on the first frozen parameter."""
import torch
import torch.distributed as dist


def average_gradients(model, num_samples, group=None):
    total = torch.tensor([float(num_samples)])
    dist.all_reduce(total, group=group)
    for p in model.parameters():
        p.grad.mul_(num_samples / total.item())
        dist.all_reduce(p.grad, group=group)
