"""Checker of notebook 11's sequence parallelism for ``work/11_composed.py``:
``check_sequence_parallel`` (the judge: expected values from :mod:`.refs`).

It launches 4 gloo ranks (two tensor-parallel groups of 2: a group's rank is not the global
rank) and 3 (the world), :mod:`.probes_sp`, float64 and float32, against the judge's block on
the whole sequence in one process:

* ``sp-values``: each rank's rows of the output and of the input's gradient, its rows of fc1's
  gradients and columns of fc2's weight gradient;
* ``sp-replicated``: after ``sequence_parallel_grads``, the whole gradient of the norm's weight
  and bias and of fc2's bias on every rank;
* ``sp-collectives``: in the forward one all-gather and one reduce-scatter, in the backward one
  of each, no all-reduce and nothing else; in ``sequence_parallel_grads`` only all-reduces,
  together of the replicated parameters' numbers;
* ``sp-wire``: where links are observed (grading), with a wide block more (weights far heavier
  than the activations: :data:`.inputs.SP_SIZES`), all links together carry what those
  collectives put there (:mod:`.wire`), whatever the ranks do to the recorder in their memory.

Tolerance: ``1e-10`` (float64) or ``1e-5`` (float32) times the largest reference magnitude of
the output, or of all the block's gradients.

Used in 11_bonus_composed.
"""
from pathlib import Path

import numpy as np
import torch

from ..contract import CheckFailure, fail
from ..harness import HANG_AFTER, check, observing, run_ranks
from ..integrity import verify_rank0_number
from ..notebook_files import no_file, unimplemented
from ..recorder import verify_no_hidden
from . import inputs, probes_sp, refs
from .checks import close_to_scale as _close, unfinished
from .wire import check_sp_wire

__all__ = ["check_sequence_parallel"]

TOL = {"float64": 1e-10, "float32": 1e-5}
PIECES = ("GatherFromSequence.forward", "GatherFromSequence.backward",
          "ReduceScatterToSequence.forward", "ReduceScatterToSequence.backward",
          "SequenceParallelNormMLP.forward", "sequence_parallel_grads")
GATHER = ("all_gather_into_tensor", "all_gather")
SCATTER = ("reduce_scatter_tensor", "reduce_scatter")
# how each parameter is held: its rows, its columns, or whole
HELD = {"w1": "rows", "b1": "rows", "w2": "cols", "b2": "whole", "norm.weight": "whole",
        "norm.bias": "whole"}


def _shard(full, how, r, t):
    if how == "whole":
        return full
    k = full.shape[0 if how == "rows" else 1] // t
    return full[r * k:(r + 1) * k] if how == "rows" else full[:, r * k:(r + 1) * k]


def _kinds(events):
    return [e[1] for e in events if e[0] == "coll"]


def _check_collectives(where, got, d):
    for phase in ("forward", "backward"):
        kinds = _kinds(got[phase])
        gathers = [k for k in kinds if k in GATHER]
        scatters = [k for k in kinds if k in SCATTER]
        if len(gathers) != 1 or len(scatters) != 1 or len(kinds) != 2:
            fail("sp-collectives", f"{where}: the {phase} issued {kinds or 'nothing'}; expected "
                                   "one all-gather and one reduce-scatter (sequence "
                                   "parallelism replaces each all-reduce of tensor "
                                   "parallelism by a reduce-scatter and an all-gather), "
                                   "nothing else")
    kinds = _kinds(got["reduce"])
    numel = sum(e[2] for e in got["reduce"] if e[0] == "coll")
    want = 3 * d
    if set(kinds) != {"all_reduce"} or numel != want:
        fail("sp-collectives", f"{where}: sequence_parallel_grads issued {kinds or 'nothing'} "
                               f"of {numel} numbers; expected all-reduces of the replicated "
                               f"parameters' gradients, {want} numbers in all")


def _check_launch(launch, res, salts):
    for rank, out in enumerate(res):
        members, gi = out["members"], out["group"]
        t, gr = len(members), members.index(rank)
        for name, got in out["parts"].items():
            if "todo" in got:
                continue
            dtype, size = inputs.SP_PARTS[name]
            wide = " (the wide block)" if size == "wire" else ""
            where = (f"with {launch}, rank {rank} (group rank {gr} of {t}), "
                     f"SequenceParallelNormMLP in {dtype}{wide}")
            ref = refs.sp([salts[r] for r in members], out["salt0"], gi, t,
                          getattr(torch, dtype), size)
            k = inputs.SP_SIZES[size][0] // t
            tol = TOL[dtype]
            scale = max(1.0, float(np.max(np.abs(ref["y"]))))
            if got["dtype"] != f"torch.{dtype}":
                fail("sp-values", f"{where}: the output is {got['dtype']}, expected "
                                  f"torch.{dtype}")
            _close("sp-values", f"{where}: the output", got["y"], ref["y"][gr * k:(gr + 1) * k],
                   tol, scale, f" (this rank's rows [{gr * k}, {(gr + 1) * k}) of the "
                               "block's output; fc2's bias added once, after the "
                               "reduce-scatter)")
            gscale = max([1.0] + [float(np.max(np.abs(g))) for g in ref["grads"].values()]
                         + [float(np.max(np.abs(ref["x_grad"])))])
            _close("sp-values", f"{where}: the gradient of x", got["x_grad"],
                   ref["x_grad"][gr * k:(gr + 1) * k], tol, gscale,
                   " (the all-gather's backward sums the ranks' gradients of the whole "
                   "sequence and keeps this rank's rows: a reduce-scatter)")
            for name in ("w1", "b1", "w2"):
                _close("sp-values", f"{where}: the gradient of {name}", got["grads"][name],
                       _shard(ref["grads"][name], HELD[name], gr, t), tol, gscale)
            for name in ("norm.weight", "norm.bias", "b2"):
                _close("sp-replicated", f"{where}: after sequence_parallel_grads, the "
                       f"gradient of {name}", got["grads"][name], ref["grads"][name], tol,
                       gscale, " (each rank's backward saw its rows only: the whole "
                               "sequence's gradient is the sum over the group)")
            _check_collectives(where, got, inputs.SP_SIZES[size][2])


@check
def check_sequence_parallel(path):
    """Your GatherFromSequence, ReduceScatterToSequence, SequenceParallelNormMLP and
    sequence_parallel_grads on two tensor-parallel groups of 2 ranks and on a world of 3,
    float64 and float32, against the block on the whole sequence in one process; one
    all-gather and one reduce-scatter each way, all-reduces only of the replicated gradients.
    Where links are observed (grading), with a wide block more, all links together must carry
    what those collectives put there (``sp-wire``: right files measured 0.45 to 0.60 of the
    most; the weights gathered beside them, 2.6 times the most)."""
    path = Path(path)
    if not path.is_file():
        raise CheckFailure(no_file(path))
    found, observed = [], observing()
    for launch, size, groups in inputs.SP_LAUNCHES:
        salts, links = {}, {}
        res = run_ranks(path, probes_sp.probe_sp, size, "gloo",
                        {"groups": groups, "wire": observed}, HANG_AFTER,
                        what=f"11_composed.py's sequence parallelism with {launch}",
                        case="sp-values", salts=salts, links=links)
        try:
            verify_no_hidden(res, f"with {launch}", "dist.all_gather_into_tensor, "
                                                    "dist.reduce_scatter_tensor, dist.all_reduce")
        except AssertionError as err:
            raise CheckFailure(str(err)) from None
        verify_rank0_number(res, salts)
        salts = [salts.get(r, 0) for r in range(size)]
        found = [got["todo"] for out in res for got in out["parts"].values() if "todo" in got]
        _check_launch(launch, res, salts)
        if not found:
            check_sp_wire(links, size, groups, launch)
    if found:
        passed = [p for p in PIECES if p not in found + unimplemented(path)]
        unfinished(found, path, PIECES, "4 and 3", passed)
