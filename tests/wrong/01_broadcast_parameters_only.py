"""Wrong: broadcasts model.parameters() only, so the BatchNorm running statistics (buffers) of
the other ranks keep their own values.

Violates: "After the call, every rank's model.state_dict() equals root's"
"""


def broadcast_parameters(comm, model, root=0):
    for p in model.parameters():
        comm.Bcast(p.data.numpy(), root=root)
