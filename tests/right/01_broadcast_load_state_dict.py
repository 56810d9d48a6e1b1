"""RIGHT (notebook 01, broadcast): root's whole state_dict broadcast as one pickled object, then
``model.load_state_dict``, which copies into the model's existing tensors (in place).

Written differently from the solution on purpose; the checker must accept it.
"""


def broadcast_parameters(comm, model, root=0):
    state = comm.bcast(model.state_dict() if comm.Get_rank() == root else None, root=root)
    model.load_state_dict(state)
