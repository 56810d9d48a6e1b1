"""Wrong: each rank decides on its own local loss, so ranks can disagree about stopping.

Violates: "Return (sum of loss_sum over ranks) / (sum of count over ranks), the same on every rank."
"""


def global_loss(comm, loss_sum, count):
    return loss_sum / count


def converged(prev_loss, loss, rel_tol):
    if prev_loss is None:
        return False
    return abs(prev_loss - loss) <= rel_tol * abs(prev_loss)
