"""Run a Python script or module with line-buffered output.

``mpiexec -l`` labels output by rank, chunk by chunk; unbuffered Python writes a
``print`` in pieces, so labels would land mid-line. Line buffering sends whole
lines, each labelled once. Usage (the launcher does this for you)::

    mpiexec -n 2 python -m exercise_utils.linebuf work/01_hello.py [args...]
    mpiexec -n 2 python -m exercise_utils.linebuf -m exercise_utils.mpi_sgd [args...]

Used in 01_mpi_parallel_sgd (through exercise_utils.launch.mpiexec).
"""
import runpy
import sys


def main(argv):
    """Reconfigure stdout/stderr to line buffering, then run the target as __main__."""
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    sys.stderr.reconfigure(line_buffering=True, write_through=False)
    if not argv:
        raise SystemExit("usage: python -m exercise_utils.linebuf SCRIPT|-m MODULE [args...]")
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
