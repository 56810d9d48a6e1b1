"""RIGHT (notebook 01, broadcast): one flat float64 buffer holding every tensor of the
state_dict (integer buffers included: float64 holds them exactly), one ``Bcast``, and the
values copied back into the tensors in place.

Written differently from the solution on purpose; the checker must accept it.
"""
import numpy as np
import torch


def broadcast_parameters(comm, model, root=0):
    tensors = list(model.state_dict().values())
    flat = np.concatenate([t.detach().numpy().astype(np.float64).ravel() for t in tensors])
    comm.Bcast(flat, root=root)
    offset = 0
    with torch.no_grad():
        for t in tensors:
            part = flat[offset:offset + t.numel()].reshape(t.shape)
            t.copy_(torch.from_numpy(part).to(t.dtype))
            offset += t.numel()
