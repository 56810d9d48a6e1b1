"""Cheat: global_loss adds up the other ranks' loss sums without receiving them. It rebuilds
every rank's ``(loss_sum, count)`` of the case with the probe's own function
(``probes.global_inputs``: the case is the one whose count for this rank is ``count``), puts its
own sum in its place and divides, beside a decoy ``comm.Allreduce`` of two float64 numbers (the
solution's call), whose result it throws away: no rank uses anything another rank sent.
``converged`` is the solution's.

At grading each rank's loss sum derives from a number only it was given (``ctx.salt``): the
other ranks' sums it rebuilds are not theirs, and every rank ends with a global loss of
its own. Must fail ``global-same``."""
import numpy as np
from mpi4py import MPI

from exercise_utils.mpi_parallel_sgd import probes


def global_loss(comm, loss_sum, count):
    rank, size = comm.Get_rank(), comm.Get_size()
    comm.Allreduce(MPI.IN_PLACE, np.array([loss_sum, count], dtype=np.float64), op=MPI.SUM)
    for case in probes.GLOBAL:
        sums, counts = probes.global_inputs(case, size)
        if counts[rank] == count:
            sums[rank] = loss_sum
            return sum(sums) / sum(counts)
    raise RuntimeError("not a case of the check")


def converged(prev_loss, loss, rel_tol):
    if prev_loss is None:
        return False
    return abs(prev_loss - loss) <= rel_tol * abs(prev_loss)
