"""Wrong: always broadcasts from rank 0, whatever root was asked for.

Violates: "After the call, every rank's model.state_dict() equals root's"
"""


def broadcast_parameters(comm, model, root=0):
    for t in model.state_dict().values():
        comm.Bcast(t.numpy(), root=0)
