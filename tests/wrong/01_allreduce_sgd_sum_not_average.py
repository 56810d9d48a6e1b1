"""Wrong: sums the gradients with one Allreduce but forgets to divide by the number of ranks.

Violates: "Replace every p.grad by the average of p.grad over all ranks (one Allreduce in total)."
"""
import torch
from mpi4py import MPI


def average_gradients(comm, model):
    params = [p for p in model.parameters() if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()
