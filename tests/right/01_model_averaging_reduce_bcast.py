"""RIGHT (notebook 01, model_averaging): the buffer API on one flat buffer: ``Reduce`` (sum) to
root, divided there by the number of ranks, ``Bcast`` back, and copied into the model's
tensors in place.

Written differently from the solution on purpose; the checker must accept it.
"""
import numpy as np
import torch
from mpi4py import MPI


def average_weights(comm, model, root=0):
    tensors = list(model.state_dict().values())
    mine = np.concatenate([t.detach().numpy().ravel() for t in tensors]).astype(np.float64)
    total = np.empty_like(mine)
    comm.Reduce(mine, total, op=MPI.SUM, root=root)
    if comm.Get_rank() == root:
        total /= comm.Get_size()
    comm.Bcast(total, root=root)
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(torch.from_numpy(total[offset:offset + t.numel()]).view_as(t))
            offset += t.numel()
