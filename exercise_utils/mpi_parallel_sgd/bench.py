"""Benchmark: mpi4py's pickle-based lowercase API against the buffer-based uppercase API.

Launch::

    mpiexec -n 2 python -m exercise_utils.mpi_parallel_sgd.bench \
        --out results/01_pickle_vs_buffer.json

For each array size it times ``comm.bcast(obj)`` vs ``comm.Bcast(array)`` and
``comm.allreduce(obj)`` vs ``comm.Allreduce(array)``: warm-up, repeats, the slowest
rank per repeat (a collective ends when its last rank does), then the median.

Used in 01_mpi_parallel_sgd.
"""
import argparse
import time

import numpy as np

from ..bench import save_json
from ..config import quick

SIZES_MB = quick([1, 4, 16, 64], [1, 4])   # array sizes (MiB of float64)
REPEATS = quick(7, 3)                       # timed repeats per size (median reported)
WARMUP = 2                                  # untimed repeats first


def timed(comm, fn, repeats, warmup):
    """Median over repeats of the slowest rank's time of ``fn()``."""
    from mpi4py import MPI
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        comm.Barrier()
        start = time.perf_counter()
        fn()
        times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return float(np.median(times))


def measure(comm, size_mb, repeats, warmup):
    """Time the four operations on an array of ``size_mb`` MiB; return a result row."""
    from mpi4py import MPI
    n = size_mb * 2**20 // 8
    data = np.ones(n) * (comm.Get_rank() + 1)
    out = np.empty_like(data)

    def bcast():
        comm.bcast(data if comm.Get_rank() == 0 else None, root=0)

    row = {"size_mb": size_mb,
           "bcast_pickle": timed(comm, bcast, repeats, warmup),
           "Bcast_buffer": timed(comm, lambda: comm.Bcast(data, root=0), repeats, warmup),
           "allreduce_pickle": timed(comm, lambda: comm.allreduce(data), repeats, warmup),
           "Allreduce_buffer": timed(comm, lambda: comm.Allreduce(data, out, op=MPI.SUM),
                                     repeats, warmup)}
    row["bcast_ratio"] = row["bcast_pickle"] / row["Bcast_buffer"]
    row["allreduce_ratio"] = row["allreduce_pickle"] / row["Allreduce_buffer"]
    return row


def main(argv=None):
    from mpi4py import MPI
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mb", type=int, nargs="+", default=SIZES_MB)
    p.add_argument("--repeats", type=int, default=REPEATS)
    p.add_argument("--out", default="results/01_pickle_vs_buffer.json")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    rows = []
    for size in args.sizes_mb:
        row = measure(comm, size, args.repeats, WARMUP)
        rows.append(row)
        if comm.Get_rank() == 0:
            print(f"{size:3d} MiB: bcast {row['bcast_pickle'] * 1e3:7.1f} ms vs Bcast "
                  f"{row['Bcast_buffer'] * 1e3:7.1f} ms (x{row['bcast_ratio']:.1f}); allreduce "
                  f"{row['allreduce_pickle'] * 1e3:7.1f} ms vs Allreduce "
                  f"{row['Allreduce_buffer'] * 1e3:7.1f} ms (x{row['allreduce_ratio']:.1f})",
                  flush=True)
    if comm.Get_rank() == 0:
        save_json(args.out, {"procs": comm.Get_size(), "repeats": args.repeats, "rows": rows})


if __name__ == "__main__":
    main()
