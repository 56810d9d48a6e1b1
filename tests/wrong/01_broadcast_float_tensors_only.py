"""Wrong: one flat float32 buffer of the floating-point tensors; the integer buffer
BatchNorm's num_batches_tracked is skipped (it did not fit the float buffer), so it keeps
every rank's own count.

Violates: "After the call, every rank's model.state_dict() equals root's"
"""
import torch
from mpi4py import MPI


def broadcast_parameters(comm, model, root=0):
    tensors = [t for t in model.state_dict().values() if t.is_floating_point()]
    flat = torch.cat([t.reshape(-1) for t in tensors])
    comm.Bcast([flat.numpy(), MPI.FLOAT], root=root)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
