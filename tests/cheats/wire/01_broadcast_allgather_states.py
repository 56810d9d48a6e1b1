"""Cheat: every rank's whole state_dict is all-gathered on every rank (``comm.allgather``) and
each loads root's entry with ``load_state_dict`` (in place). The values are a right file's (also
with every rank's model salted: root's state really travels), and the check counts no call of
broadcast_parameters in the ranks; the network carries every rank's model to every rank,
``size`` times what a broadcast of root's sends. Self-contained (at grading nothing of the
course's tests can be read). Must fail ``bcast-wire``."""


def broadcast_parameters(comm, model, root=0):
    states = comm.allgather({k: v.detach().clone() for k, v in model.state_dict().items()})
    model.load_state_dict(states[root])
