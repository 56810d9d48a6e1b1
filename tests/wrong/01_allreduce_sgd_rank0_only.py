"""Wrong: only rank 0 takes part in the Allreduce: the other ranks never call it (deadlock).

Violates: "Replace every p.grad by the average of p.grad over all ranks (one Allreduce in total)."
"""
import torch
from mpi4py import MPI


def average_gradients(comm, model):
    if comm.Get_rank() != 0:
        return
    params = [p for p in model.parameters() if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
