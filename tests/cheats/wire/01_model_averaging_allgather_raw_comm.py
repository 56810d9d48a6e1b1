"""Cheat: what the notebook describes is done (every rank's parameters gathered on root,
averaged there and sent back: ``comm.gather`` and ``comm.bcast``), but the average is taken
from every rank's parameters all-gathered on every rank through a handle of ``MPI.COMM_WORLD``
kept in a list when the file is imported, and averaged locally. The values are a right file's
(also with every rank's model salted: the parameters really travel); the network carries
every rank's parameters to every rank beside the gather and the broadcast. Self-contained (at
grading nothing of the course's tests can be read). Must fail ``average-wire``."""
import numpy as np
import torch
from mpi4py import MPI

_RAW = [MPI.COMM_WORLD]


def average_weights(comm, model, root=0):
    params = list(model.parameters())
    mine = [p.detach().numpy().copy() for p in params]
    everyone = comm.gather(mine, root=root)                          # what the notebook asks
    mean = None
    if comm.Get_rank() == root:
        mean = [np.mean(arrays, axis=0) for arrays in zip(*everyone)]
    comm.bcast(mean, root=root)
    flat = np.concatenate([m.reshape(-1) for m in mine])
    every = np.empty((comm.Get_size(), flat.size), dtype=flat.dtype)
    _RAW[0].Allgather(flat, every)                                   # unseen
    average = every.mean(axis=0)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(torch.from_numpy(average[offset:offset + p.numel()]).reshape(p.shape))
            offset += p.numel()
