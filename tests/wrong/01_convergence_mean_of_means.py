"""Wrong: averages the per-rank mean losses, ignoring that ranks hold different sample counts.

Violates: "Return (sum of loss_sum over ranks) / (sum of count over ranks), the same on every rank."
"""


def global_loss(comm, loss_sum, count):
    return comm.allreduce(loss_sum / count) / comm.Get_size()


def converged(prev_loss, loss, rel_tol):
    if prev_loss is None:
        return False
    return abs(prev_loss - loss) <= rel_tol * abs(prev_loss)
