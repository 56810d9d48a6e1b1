"""Wrong: tests the first epoch with `if not prev_loss`, which is also true for a previous loss
of 0.0, so a run whose loss reached 0.0 never stops.

Violates: "False on the first epoch (prev_loss is None); else abs(prev_loss - loss) <= rel_tol * abs(prev_loss)."
"""


def global_loss(comm, loss_sum, count):
    return comm.allreduce(loss_sum) / comm.allreduce(count)


def converged(prev_loss, loss, rel_tol):
    if not prev_loss:
        return False
    return abs(prev_loss - loss) <= rel_tol * abs(prev_loss)
