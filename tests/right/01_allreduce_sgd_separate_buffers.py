"""RIGHT (notebook 01, allreduce_sgd): a separate receive buffer (``Allreduce(send, recv)``, no
``MPI.IN_PLACE``), both numpy arrays of the gradients' dtype, the buffer as ``[array,
datatype]`` with the MPI datatype that matches it, and the gradients updated through a running
offset (``copy_`` of a reshaped slice: a transposed gradient cannot be ``view``-ed flat).

Written differently from the solution on purpose; the checker must accept it.
"""
import numpy as np
import torch
from mpi4py import MPI


def average_gradients(comm, model):
    params = [p for p in model.parameters() if p.grad is not None]
    send = np.concatenate([p.grad.detach().numpy().ravel() for p in params])
    recv = np.empty_like(send)
    kind = MPI.DOUBLE if send.dtype == np.float64 else MPI.FLOAT
    comm.Allreduce([send, kind], [recv, kind], op=MPI.SUM)
    recv /= comm.Get_size()
    start = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(torch.from_numpy(recv[start:start + n]).reshape(p.grad.shape))
        start += n
