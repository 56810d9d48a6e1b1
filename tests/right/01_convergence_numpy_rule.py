"""RIGHT (notebook 01, convergence): the sums in a float64 numpy array reduced with the
lowercase ``allreduce``, and the stop rule computed with numpy, its numpy.bool turned into the
bool the docstring promises.

Written differently from the solution on purpose; the checker must accept it.
"""
import numpy as np


def global_loss(comm, loss_sum, count):
    totals = comm.allreduce(np.array([loss_sum, count], dtype=np.float64))
    return float(totals[0] / totals[1])


def converged(prev_loss, loss, rel_tol):
    if prev_loss is None:
        return False
    return bool(np.abs(np.float64(prev_loss) - loss) <= rel_tol * np.abs(prev_loss))
