"""Wrong: one lowercase (pickle) comm.allreduce of the flat tensor: the right average, but every
step pickles the whole gradient (section 1 measured the cost) instead of one buffer Allreduce.

Violates: "Replace every p.grad by the average of p.grad over all ranks (one Allreduce in total)."
"""
import torch
from mpi4py import MPI


def average_gradients(comm, model):
    params = [p for p in model.parameters() if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    flat = comm.allreduce(flat, op=MPI.SUM) / comm.Get_size()
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()
