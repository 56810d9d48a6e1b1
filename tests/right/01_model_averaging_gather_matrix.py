"""RIGHT (notebook 01, model_averaging): per dtype group, the parameters are flattened into one
NumPy vector, an uppercase `Gather` stacks them into a (size, total) matrix on root, root sums
the rows and divides, and an uppercase `Bcast` sends the vector back; each parameter is then
overwritten with `copy_` under no_grad (buffers are left as they are).

Written from the release notebook alone; the checker must accept it.
"""
import numpy as np
import torch
from mpi4py import MPI
from mpi4py.util import dtlib


def average_weights(comm, model, root=0):
    '''After the call every rank's parameters equal the mean over ranks of their parameters.'''
    size, rank = comm.Get_size(), comm.Get_rank()
    groups = {}                                  # dtype -> parameters, first-appearance order
    for p in model.parameters():                 # parameters() lists a tied tensor once
        groups.setdefault(p.dtype, []).append(p)
    for dtype, params in groups.items():
        np_dtype = torch.empty((), dtype=dtype).numpy().dtype
        mpi_type = dtlib.from_numpy_dtype(np_dtype)
        total = sum(p.numel() for p in params)
        vec = np.empty(total, dtype=np_dtype)
        offset = 0
        for p in params:
            n = p.numel()
            vec[offset:offset + n] = p.detach().numpy().reshape(-1)
            offset += n
        matrix = np.empty((size, total), dtype=np_dtype) if rank == root else None
        comm.Gather([vec, mpi_type], [matrix, mpi_type] if rank == root else None, root=root)
        if rank == root:
            acc = matrix[0].copy()
            for row in matrix[1:]:
                acc += row
            acc /= size
            vec[:] = acc
        comm.Bcast([vec, mpi_type], root=root)
        offset = 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                p.copy_(torch.from_numpy(vec[offset:offset + n]).reshape(p.shape))
                offset += n
