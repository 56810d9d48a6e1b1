"""Helpers, launchers and checkers of the course Distributed Training from Scratch.

Modules (flat, one topic each): ``config`` (quick mode), ``data`` (datasets),
``models`` (networks), ``launch`` (run distributed programs safely), ``harness``
(checker harness), ``checks_mpi`` (checkers of notebook 01), ``mpi_sgd`` (the
MPI training script of notebook 01), ``bench`` (timing and plots).
"""
from .config import QUICK, quick

__all__ = ["QUICK", "quick"]
__version__ = "0.1.0"
