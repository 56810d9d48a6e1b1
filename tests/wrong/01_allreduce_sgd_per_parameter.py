"""Wrong for this exercise: correct averages, but one Allreduce per parameter instead of one flat buffer.

Violates: "Replace every p.grad by the average of p.grad over all ranks (one Allreduce in total)."
"""
from mpi4py import MPI


def average_gradients(comm, model):
    for p in model.parameters():
        if p.grad is not None:
            comm.Allreduce(MPI.IN_PLACE, p.grad.numpy(), op=MPI.SUM)
            p.grad /= comm.Get_size()
