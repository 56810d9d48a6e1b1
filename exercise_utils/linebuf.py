"""Run a Python script or module with line-buffered output; abort MPI on a crash.

``mpiexec -l`` labels output by rank, chunk by chunk; unbuffered Python writes a
``print`` in pieces, so labels would land mid-line. Line buffering sends whole
lines, each labelled once. Usage (the launcher does this for you)::

    mpiexec -n 2 python -m exercise_utils.linebuf work/01_hello.py [args...]
    mpiexec -n 2 python -m exercise_utils.linebuf -m exercise_utils.mpi_parallel_sgd.train [args...]

Like ``python -m mpi4py``, an uncaught exception (or ``sys.exit`` with a non-zero
status) in one rank calls ``MPI_Abort``, which ends every rank at once. Without
it, the crashed rank would wait in ``MPI_Finalize`` and the others in their next
collective: a crash would look like a hang.

Used in 01_mpi_parallel_sgd (through exercise_utils.launch.mpiexec).
"""
import os
import runpy
import sys


def main(argv):
    """Reconfigure stdout/stderr to line buffering, then run the target as __main__."""
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    sys.stderr.reconfigure(line_buffering=True, write_through=False)
    if not argv:
        raise SystemExit("usage: python -m exercise_utils.linebuf SCRIPT|-m MODULE [args...]")
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except BaseException as exc:
        from mpi4py.run import set_abort_status
        set_abort_status(exc if isinstance(exc, (SystemExit, KeyboardInterrupt)) else 1)
        raise


if __name__ == "__main__":
    main(sys.argv[1:])
