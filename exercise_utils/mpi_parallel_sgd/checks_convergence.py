"""Checker of notebook 01's convergence exercise (``work/01_convergence.py``): ``converged``
(first epoch, relative to the previous loss, at the tolerance, negative and zero losses; a bool)
and ``global_loss`` (sums over counts, the same on every rank, exact in float64, a rank without
samples; each rank's loss sum salted). Imported by :mod:`.checks`, where the CHECK cell finds it.

Used in 01_mpi_parallel_sgd.
"""
import numpy as np

from ..contract import fail
from ..harness import HANG_AFTER, check, run_ranks
from ..compare import likely_cause
from . import probes
from .inputs import GLOBAL, global_inputs
from .probes import converged_cases

TIMEOUT = HANG_AFTER     # seconds without progress before a launch is a hang (harness)


def reference_converged(prev_loss, loss, rel_tol):
    return prev_loss is not None and abs(prev_loss - loss) <= rel_tol * abs(prev_loss)


@check
def check_convergence(path, timeout=TIMEOUT):
    """Check ``converged`` (first epoch, relative to the previous loss, at the tolerance,
    negative and zero losses; a bool) and ``global_loss`` (sums over counts, the same on every
    rank, exact in float64, a rank without samples; each rank's loss sum salted)."""
    for size in (3, 2):
        salts = {}           # (at grading each rank's loss sum derives from a number only it knows)
        res = run_ranks(path, probes.probe_convergence, size, "mpi", timeout=timeout,
                        case="global-value", what="global_loss / converged", salts=salts)
        for args, got in zip(converged_cases(), res[0][0]):
            _check_converged(args, got)
        for i, case in enumerate(GLOBAL):
            sums, counts = global_inputs(case, size, salts)
            losses = [r[1][i][1] for r in res]
            expected = sum(sums) / sum(counts)
            if max(losses) - min(losses) > 1e-12 * abs(expected):
                fail("global-same", f"global_loss differs between ranks ({losses}): ranks would "
                                    f"take different stop decisions, and the ranks that keep "
                                    f"training would hang in Allreduce forever")
            if not abs(losses[0] - expected) <= 1e-12 * abs(expected):
                cause = likely_cause({"global_loss": np.array([losses[0]], dtype=float)},
                                     {"global_loss": np.array([expected])})
                fail(case, f"global_loss returned {losses[0]!r} with {size} ranks holding loss "
                           f"sums {sums} over {counts} samples; expected {expected!r} = (sum of "
                           f"all loss sums) / (sum of all sample counts), computed in float64."
                           f"{cause}")


def _check_converged(args, got):
    want = reference_converged(*args)
    call = f"converged{args}"
    rule = ("stop when abs(prev_loss - loss) <= rel_tol * abs(prev_loss); never on the first "
            "epoch (prev_loss is None)")
    if isinstance(got, dict):
        fail("converged-rule", f"{call} raised {got['raised']}, expected {want}: {rule}")
    kind, value = got
    if value != want:
        zero = (" (a previous loss of 0.0 is a loss: test `prev_loss is None`, not "
                "`not prev_loss`)" if args[0] == 0.0 else "")
        fail("converged-rule", f"{call} returned {value}, expected {want}{zero}: {rule}")
    if kind != "bool":
        numpy = (" (a comparison of numpy numbers gives a numpy.bool, which is not a bool: "
                 "return bool(...) or compare Python floats)" if kind.startswith("numpy.") else "")
        fail("converged-bool", f"{call} returned a {kind}; return True or False (a bool){numpy}")
