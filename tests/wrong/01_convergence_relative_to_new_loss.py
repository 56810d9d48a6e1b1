"""Wrong: the tolerance is taken relative to the new loss instead of the previous one.

Violates: "False on the first epoch (prev_loss is None); else abs(prev_loss - loss) <= rel_tol * abs(prev_loss)."
"""


def global_loss(comm, loss_sum, count):
    return comm.allreduce(loss_sum) / comm.allreduce(count)


def converged(prev_loss, loss, rel_tol):
    if prev_loss is None:
        return False
    return abs(prev_loss - loss) <= rel_tol * abs(loss)
