"""RIGHT (notebook 01, convergence): lowercase `gather` of (loss_sum, count) pairs on rank 0,
an exact `math.fsum` there, and a lowercase `bcast` of the single quotient, so every rank
returns the very same float; `converged` written with early returns.

Written from the release notebook alone; the checker must accept it.
"""
import math

import numpy as np
from mpi4py import MPI


def global_loss(comm, loss_sum, count):
    '''Return (sum of loss_sum over ranks) / (sum of count over ranks), the same on every rank.'''
    pairs = comm.gather((float(loss_sum), int(count)), root=0)
    mean = None
    if comm.Get_rank() == 0:
        total_loss = math.fsum(p[0] for p in pairs)
        total_count = sum(p[1] for p in pairs)
        mean = total_loss / total_count if total_count else float("nan")
    return comm.bcast(mean, root=0)


def converged(prev_loss, loss, rel_tol):
    '''False on the first epoch (prev_loss is None); else abs(prev_loss - loss) <= rel_tol * abs(prev_loss).'''
    if prev_loss is None:
        return False
    change = abs(prev_loss - loss)
    limit = rel_tol * abs(prev_loss)
    return bool(change <= limit)
