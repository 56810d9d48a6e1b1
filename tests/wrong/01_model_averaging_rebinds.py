"""Wrong: every rank gets the average, but it is assigned with `p.data = ...`, which gives the
parameters new tensors instead of writing into the model's own.

Violates: "Copy the mean into the model's own tensors, in place."
"""
import numpy as np
import torch


def average_weights(comm, model, root=0):
    params = list(model.parameters())
    everyone = comm.gather([p.detach().numpy() for p in params], root=root)
    mean = None
    if comm.Get_rank() == root:
        mean = [np.mean(arrays, axis=0) for arrays in zip(*everyone)]
    mean = comm.bcast(mean, root=root)
    for p, value in zip(params, mean):
        p.data = torch.from_numpy(value)
