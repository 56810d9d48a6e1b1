"""The memory checker of notebook 07 (ZeRO-1): ``check_memory`` for ``work/07_zero.py``.

``bytes_per_device`` is pure arithmetic: it is called in one lone process
(:mod:`.probes_memory`; the grading kernel never imports a student file), on a sweep
of (Psi, K, N_d) for every stage, one dimension changed at a time (check cases
"memory-stages": K = 12 given or left out, N_d > 1; "memory-k": other K; "memory-one-device":
N_d = 1), against the checker's own formula (:func:`expected_bytes`, to
a relative 1e-12: the exact formula, not a rounding of it) and with the paper's rounded
figures; then the result's type ("memory-float") and a ValueError for every stage that is not
0, 1, 2 or 3 ("memory-invalid-stage").

Used in 07_bonus_zero_sharding.
"""
import math
from pathlib import Path

from ..harness import check, run_ranks
from ..contract import fail
from .probes_memory import memory_calls

PAPER = dict(num_params=7.5e9, num_devices=64)          # ZeRO paper, Figure 1
PAPER_GB = (120.0, 31.4, 16.6, 1.9)                      # stages 0..3, GB = 1e9 bytes
STAGE_NAMES = ("baseline (every device holds everything)",
               "stage 1, P_os: optimizer states partitioned",
               "stage 2, P_os+g: optimizer states and gradients partitioned",
               "stage 3, P_os+g+p: optimizer states, gradients and parameters partitioned")
PSI = (0, 1, 7, 1000, 123_457, 1_000_003, 7.5e9, 1e12)   # numbers of parameters
DEVICES = (2, 3, 7, 64, 1000)                            # N_d > 1
OTHER_K = (0, 4, 7, 8, 16)                               # K other than mixed-precision Adam's
INVALID_STAGES = (-1, 4, 5, 10, -0.5, 0.5, 1.5, 2.5, 3.5)
REL = 1e-12      # the formula to 12 digits: a // or a rounding shows, summation order does not


def expected_bytes(num_params, num_devices, stage, k=12):
    """The checker's own ZeRO memory model (2 bytes fp16 parameters, 2 fp16 gradients, K)."""
    p, g, o = 2 * num_params, 2 * num_params, k * num_params
    return [p + g + o, p + g + o / num_devices, p + (g + o) / num_devices,
            (p + g + o) / num_devices][stage]


def memory_cases():
    """(case, num_params, num_devices, k or None for the default) of the value sweep."""
    cases = [("memory-stages", psi, n, 12) for psi in PSI for n in DEVICES]
    cases += [("memory-k", psi, n, k) for psi in PSI[1:] for n in (3, 64) for k in OTHER_K]
    cases += [("memory-stages", psi, n, None) for psi in (7, 1_000_003, 7.5e9) for n in (3, 64)]
    cases += [("memory-one-device", psi, 1, k) for psi in PSI for k in (12, 8)]
    return cases


class _Outcomes:
    """The reported outcome of every call, looked up by its arguments."""

    def __init__(self, path, calls):
        values = run_ranks(path, memory_calls, kwargs={"calls": calls}, what="bytes_per_device",
                           case="memory-stages")[0]
        self.table = {self.key(args, kwargs): got for (args, kwargs), got in zip(calls, values)}

    @staticmethod
    def key(args, kwargs):
        return repr((list(args), sorted(kwargs.items())))

    def get(self, *args, **kwargs):
        return self.table[self.key(args, kwargs)]


def _calls():
    """Every ``[args, kwargs]`` the checker asks for, in its order."""
    calls = []
    for _, psi, n, k in memory_cases():
        for stage in range(4):
            calls.append([[psi, n, stage], {} if k is None else {"k": k}])
    calls += [[[], dict(PAPER, stage=s)] for s in range(4)]
    calls += [[[1000, n], {"stage": stage}] for stage in INVALID_STAGES for n in (2, 1)]
    return calls


def _call(outcomes, case, call, *args, **kwargs):
    got = outcomes.get(*args, **kwargs)
    if "error" in got:
        fail(case, f"{call} raised {got['error']}: {got['message']}; stages 0 to 3 work for any "
                   f"number of parameters, any K and any number of devices, 1 included")
    return got


def _shown(got):
    if got["number"]:
        return f"{got['value']:.10g} bytes ({got['value'] / 1e9:.4g} GB)"
    return got["shown"]


def _check_values(outcomes):
    """Every case of the sweep, most basic dimension first; returns ``{type name: call}`` of
    the results that are not floats."""
    types = {}
    for case, psi, n, k in memory_cases():
        for stage in range(4):
            if k is None:
                call = f"bytes_per_device({psi:g}, {n}, stage={stage})"
                got = _call(outcomes, case, call, psi, n, stage)
            else:
                call = f"bytes_per_device({psi:g}, {n}, stage={stage}, k={k})"
                got = _call(outcomes, case, call, psi, n, stage, k=k)
            want = expected_bytes(psi, n, stage, 12 if k is None else k)
            if not got["number"] or not math.isclose(got["value"], want, rel_tol=REL,
                                                     abs_tol=1e-9):
                hint = {"memory-k": "the optimizer state is k bytes per parameter: use the "
                                    "argument k, not a constant",
                        "memory-one-device": "with one device every stage keeps everything: "
                                             "(2 + 2 + K) Psi"}.get(case, "")
                fail(case, f"{call} returned {_shown(got)}; expected {want:.10g} bytes "
                           f"({want / 1e9:.4g} GB) for the {STAGE_NAMES[stage]}. Per parameter: "
                           f"2 bytes fp16 parameters, 2 bytes fp16 gradients, K bytes optimizer "
                           f"state; divide by num_devices exactly the parts that stage partitions"
                           + (f" ({hint})" if hint else ""))
            if not got["float"]:
                types.setdefault(got["type"], call)
    return types


@check
def check_memory(path):
    """Check ``bytes_per_device``: every call in one lone process, judged here."""
    outcomes = _Outcomes(Path(path), _calls())
    types = _check_values(outcomes)
    got = [round(_call(outcomes, "memory-stages", "bytes_per_device(7.5e9, 64, stage)",
                       stage=s, **PAPER)["value"] / 1e9, 1) for s in range(4)]
    if tuple(got) != PAPER_GB:
        fail("memory-stages", f"7.5B parameters on 64 devices gave {got} GB per device; the "
                             f"paper's Figure 1: {list(PAPER_GB)} (GB = 1e9 bytes)")
    if types:
        t, call = next(iter(types.items()))
        fail("memory-float", f"{call} returned a value of type {t}; bytes_per_device returns a float "
                             f"(Returns: float): convert the result, e.g. float(total)")
    for stage in INVALID_STAGES:
        for n in (2, 1):
            call = f"bytes_per_device(1000, {n}, stage={stage})"
            got = outcomes.get(1000, n, stage=stage)
            if got.get("value_error"):
                continue
            if "error" in got:
                fail("memory-invalid-stage", f"{call} raised {got['error']}: {got['message']}; "
                     f"it must raise ValueError: "
                     f"ZeRO has stages 0 (baseline), 1, 2 and 3 only")
            fail("memory-invalid-stage", f"{call} returned {got['shown']}; it must raise "
                 f"ValueError: ZeRO has stages 0 (baseline), 1, 2 and 3 only (check the stage "
                 f"before computing anything; non-integer stages too)")
