"""Wrong: receives root's values but rebinds new tensors (parameters are replaced, not updated).

Violates: "(tensors updated in place)"
"""
import torch


def broadcast_parameters(comm, model, root=0):
    state = comm.bcast(model.state_dict(), root=root)
    for name, module in model.named_modules():
        for pname, value in list(module.named_parameters(recurse=False)):
            key = f"{name}.{pname}" if name else pname
            setattr(module, pname, torch.nn.Parameter(state[key].clone()))
        for bname, value in list(module.named_buffers(recurse=False)):
            key = f"{name}.{bname}" if name else bname
            setattr(module, bname, state[key].clone())
