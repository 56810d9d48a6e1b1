"""RIGHT (notebook 01, allreduce_sgd): the flat buffer is handed to ``comm.Allreduce`` as a torch
tensor (mpi4py 4 accepts any object with the buffer or DLPack protocol), in place, and the
average is written back with ``torch.nn.utils.vector_to_parameters``-style slicing.

Written differently from the solution on purpose; the checker must accept it.
"""
import torch
from mpi4py import MPI


def average_gradients(comm, model):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads])
    comm.Allreduce(MPI.IN_PLACE, flat)                  # a torch tensor, not .numpy()
    flat.div_(comm.Get_size())
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))
