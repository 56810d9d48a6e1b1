"""RIGHT (notebook 01, allreduce_sgd): a separate receive buffer (``Allreduce(send, recv)``, no
``MPI.IN_PLACE``), both numpy arrays, the buffer as ``[array, MPI.FLOAT]``, and the gradients
updated through a running offset.

Written differently from the solution on purpose; the checker must accept it.
"""
import numpy as np
import torch
from mpi4py import MPI


def average_gradients(comm, model):
    params = [p for p in model.parameters() if p.grad is not None]
    send = np.concatenate([p.grad.detach().numpy().ravel() for p in params]).astype(np.float32)
    recv = np.empty_like(send)
    comm.Allreduce([send, MPI.FLOAT], [recv, MPI.FLOAT], op=MPI.SUM)
    recv /= comm.Get_size()
    start = 0
    for p in params:
        n = p.grad.numel()
        p.grad.view(-1).copy_(torch.from_numpy(recv[start:start + n]))
        start += n
