"""RIGHT (notebook 01, convergence): two lowercase ``allreduce`` calls on Python numbers (a
scalar each: pickling costs nothing here), and the stop rule written as one expression.

Written differently from the solution on purpose; the checker must accept it.
"""


def global_loss(comm, loss_sum, count):
    return comm.allreduce(loss_sum) / comm.allreduce(count)


def converged(prev_loss, loss, rel_tol):
    return prev_loss is not None and abs(prev_loss - loss) <= rel_tol * abs(prev_loss)
