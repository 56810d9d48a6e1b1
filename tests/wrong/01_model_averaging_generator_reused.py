"""Wrong: model.parameters() is a generator, consumed by the gather; the loop that copies the
average back iterates over the exhausted generator and copies nothing.

Violates: "After the call every rank's parameters equal the mean over ranks of their parameters."
"""
import numpy as np
import torch


def average_weights(comm, model, root=0):
    params = model.parameters()
    everyone = comm.gather([p.detach().numpy().copy() for p in params], root=root)
    mean = None
    if comm.Get_rank() == root:
        mean = [np.mean(arrays, axis=0) for arrays in zip(*everyone)]
    mean = comm.bcast(mean, root=root)
    with torch.no_grad():
        for p, value in zip(params, mean):
            p.copy_(torch.from_numpy(value))
