"""RIGHT (notebook 01, convergence): every rank gathers all (loss_sum, count) pairs with
``allgather`` and adds them up itself (the same numbers in the same order on every rank), and
the stop rule is the negation of "still improving by more than the tolerance".

Written differently from the solution on purpose; the checker must accept it.
"""


def global_loss(comm, loss_sum, count):
    pairs = comm.allgather((float(loss_sum), int(count)))
    return sum(s for s, _ in pairs) / sum(c for _, c in pairs)


def converged(prev_loss, loss, rel_tol):
    if prev_loss is None:
        return False
    return not abs(prev_loss - loss) > rel_tol * abs(prev_loss)
