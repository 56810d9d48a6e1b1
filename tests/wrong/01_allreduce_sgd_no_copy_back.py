"""Wrong: averages a flat buffer but never copies it back, as if torch.cat returned views of the
gradients (it returns a new tensor): every rank steps with its own local gradient.

Violates: "Replace every p.grad by the average of p.grad over all ranks (one Allreduce in total)."
"""
import torch
from mpi4py import MPI


def average_gradients(comm, model):
    params = [p for p in model.parameters() if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
    flat /= comm.Get_size()
