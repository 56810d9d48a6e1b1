"""``make demo``: notebook 01's headline experiment, headless.

Trains the MPI data-parallel CNN with 1, 2 and 4 processes on the default dataset
(MNIST when present, else Fashion-MNIST), using the reference solution files taken
from ``solutions/01_mpi_parallel_sgd.ipynb``; prints a table of time per epoch,
speedup and test accuracy, and saves a plot.

Launch::

    python -m exercise_utils.mpi_parallel_sgd.demo [--procs 1 2 4] [--out results/demo]

Used in 01_mpi_parallel_sgd (by ``make demo``).
"""
import argparse
import time
from pathlib import Path

from . import experiments
from ..notebook_files import extract_writefiles

SOLUTION = Path("solutions/01_mpi_parallel_sgd.ipynb")   # the reference solution (repo root)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--out", default="results/demo", help="folder for files, JSON and the plot")
    p.add_argument("--solution", default=str(SOLUTION))
    args = p.parse_args(argv)
    if not Path(args.solution).exists():
        raise SystemExit(f"{args.solution} not found: run the demo from the repository root")
    work = Path(args.out) / "work"
    extract_writefiles(args.solution, work)
    start = time.perf_counter()
    rows = experiments.scaling(tuple(args.procs), work=str(work), out_dir=args.out,
                                   echo=False)
    print()
    print(experiments.scaling_table(rows))
    plot = Path(args.out) / "scaling.png"
    experiments.plot_scaling(rows, plot)
    print(f"\nplot: {plot}   ({time.perf_counter() - start:.0f} s in all)")
    print("Why the speedup is what it is: see section 6 of notebooks/01_mpi_parallel_sgd.ipynb.")


if __name__ == "__main__":
    main()
