"""RIGHT (notebook 01, model_averaging): whole state_dicts gathered on root, averaged there with
``torch.stack(...).mean(0)`` key by key (integer buffers, which ``mean`` refuses, averaged in
float64 and rounded back), broadcast back as a dict and loaded with ``model.load_state_dict``
(which copies in place).

Written differently from the solution on purpose; the checker must accept it.
"""
import torch


def average_weights(comm, model, root=0):
    states = comm.gather({k: v.clone() for k, v in model.state_dict().items()}, root=root)
    mean = None
    if comm.Get_rank() == root:
        mean = {}
        for k, first in states[0].items():
            stacked = torch.stack([s[k] for s in states])
            mean[k] = (stacked.mean(0) if first.is_floating_point()
                       else stacked.double().mean(0).round().to(first.dtype))
    model.load_state_dict(comm.bcast(mean, root=root))
