"""RIGHT (notebook 01, allreduce_sgd): the flat buffer is a NumPy array allocated once
(dtype from `torch.promote_types` over the gradients, i.e. the model's dtype) and filled
with `np.copyto`; one `Allreduce` with an explicit predefined MPI datatype (MPI.FLOAT / MPI.DOUBLE);
division in NumPy; slices copied back with `p.grad.copy_` (transposed grads keep their strides).

Written from the release notebook alone; the checker must accept it.
"""
from functools import reduce

import numpy as np
import torch
from mpi4py import MPI


# predefined datatypes: MPI_SUM is defined for these (not for a dtlib-made duplicate)
_MPI_TYPES = {np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE}


def average_gradients(comm, model):
    '''Replace every p.grad by the average of p.grad over all ranks (one Allreduce in total).'''
    grads = []
    seen = set()
    for p in model.parameters():
        if p.grad is None or id(p) in seen:
            continue
        seen.add(id(p))
        grads.append(p.grad)
    if grads:
        dtype = reduce(torch.promote_types, (g.dtype for g in grads))
    else:
        dtype = torch.get_default_dtype()
    np_dtype = torch.empty((), dtype=dtype).numpy().dtype
    total = sum(g.numel() for g in grads)
    flat = np.empty(total, dtype=np_dtype)
    offset = 0
    for g in grads:
        n = g.numel()
        np.copyto(flat[offset:offset + n], g.detach().to(dtype).numpy().reshape(-1))
        offset += n
    comm.Allreduce(MPI.IN_PLACE, [flat, _MPI_TYPES[np_dtype]], op=MPI.SUM)
    flat /= comm.Get_size()
    offset = 0
    for g in grads:
        n = g.numel()
        piece = torch.from_numpy(flat[offset:offset + n]).reshape(g.shape)
        g.copy_(piece)
        offset += n
