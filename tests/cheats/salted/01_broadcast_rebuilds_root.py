"""Cheat: broadcast_parameters sends nothing that matters. Every rank other than ``root``
rebuilds root's model with the probe's own function (``probes.bcast_model``: the dtype from the
model) and copies its state into ``model`` in place; every rank makes the decoy ``comm.Bcast``
calls of the right sizes (one per tensor of the state_dict, as the solution does), whose
received bytes it throws away: no rank uses anything the root sent.

At grading each rank's model derives from a number only it was given (``ctx.salt``): the model
a rank rebuilds is not the root's. Must fail ``bcast-values``."""
import torch

from exercise_utils.mpi_parallel_sgd import probes


def broadcast_parameters(comm, model, root=0):
    state = model.state_dict()
    dtype = str(next(iter(state.values())).dtype).replace("torch.", "")
    if comm.Get_rank() != root:
        theirs = probes.bcast_model(root, dtype).state_dict()
        with torch.no_grad():
            for key, tensor in state.items():
                tensor.copy_(theirs[key])
    for tensor in state.values():
        comm.Bcast(tensor.clone().numpy(), root=root)     # decoys: what arrives is dropped
