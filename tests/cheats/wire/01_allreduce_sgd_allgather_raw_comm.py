"""Cheat: the one ``comm.Allreduce`` per step of the flat gradient buffer the check counts is
made (its result left unused), while every rank's flat gradient is all-gathered through a handle
of ``MPI.COMM_WORLD`` kept in a list when the file is imported (not the object the probe wraps,
nor the module attribute it replaces) and averaged locally. The calls and elements the probe
counts and the values are a right file's (also with each rank's batches salted: the gradients
really travel); the network carries an all-gather of the whole gradient more per step
(``(n - 1) n`` times its bytes beside the Allreduce's ``2 (n - 1)``). Self-contained (at grading
nothing of the course's tests can be read). Must fail ``sgd-wire``."""
import numpy as np
import torch
from mpi4py import MPI

_RAW = [MPI.COMM_WORLD]


def average_gradients(comm, model):
    params = [p for p in model.parameters() if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params]).numpy()
    decoy = flat.copy()
    comm.Allreduce(MPI.IN_PLACE, decoy, op=MPI.SUM)                  # what the check counts
    every = np.empty((comm.Get_size(), flat.size), dtype=flat.dtype)
    _RAW[0].Allgather(flat, every)                                   # unseen
    mean = torch.from_numpy(every.sum(axis=0) / comm.Get_size())
    offset = 0
    for p in params:
        p.grad.copy_(mean[offset:offset + p.numel()].reshape(p.grad.shape))
        offset += p.numel()
