"""Cheat: average_weights rebuilds every rank's model with the probe's own function
(``probes.average_model``: the world size from the communicator, the dtype from the model),
averages their parameters on its own and copies the mean into ``model`` in place, beside the
solution's collectives as decoys (a ``comm.gather`` of its parameters on ``root``, a
``comm.bcast`` of as many numbers back), whose results it throws away: no rank uses anything
another rank sent.

At grading each rank's model derives from a number only it was given (``ctx.salt``): the
other ranks' models it rebuilds are not theirs. Must fail ``average-values``."""
import numpy as np
import torch

from exercise_utils.mpi_parallel_sgd import probes


def average_weights(comm, model, root=0):
    params = list(model.parameters())
    dtype = str(params[0].dtype).replace("torch.", "")
    mine = [p.detach().numpy().copy() for p in params]
    comm.gather(mine, root=root)                                   # decoy
    comm.bcast(mine if comm.Get_rank() == root else None, root=root)  # decoy
    everyone = [list(probes.average_model(r, dtype).parameters())
                for r in range(comm.Get_size())]
    with torch.no_grad():
        for i, p in enumerate(params):
            p.copy_(torch.from_numpy(np.asarray(np.mean([m[i].detach().numpy() for m in everyone],
                                                         axis=0))))
