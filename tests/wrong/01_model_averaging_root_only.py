"""Wrong: averages on the root but never sends the average back to the other ranks.

Violates: "After the call every rank's parameters equal the mean over ranks of their parameters."
"""
import numpy as np
import torch


def average_weights(comm, model, root=0):
    mine = [t.detach().numpy().copy() for t in model.state_dict().values()]
    everyone = comm.gather(mine, root=root)
    if comm.Get_rank() == root:
        with torch.no_grad():
            for t, ts in zip(model.state_dict().values(), zip(*everyone)):
                t.copy_(torch.from_numpy(np.mean(ts, axis=0)))
