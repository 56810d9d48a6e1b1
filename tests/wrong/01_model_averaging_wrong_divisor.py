"""Wrong: sums every rank's parameters with Allreduce but divides by (size - 1).

Violates: "After the call every rank's parameters equal the mean over ranks of their parameters."
"""
from mpi4py import MPI


def average_weights(comm, model, root=0):
    for t in model.state_dict().values():
        buf = t.numpy()
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        buf /= max(1, comm.Get_size() - 1)
