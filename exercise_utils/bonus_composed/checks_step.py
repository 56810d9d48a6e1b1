"""Checker of notebook 11's composed step for ``work/11_composed.py``: ``check_composed_step``
(the judge: expected values from :mod:`.refs`).

It launches 8 gloo ranks (meshes 2x2x2, 1x2x4, 2x4x1, 4x1x2) and 3 (1x1x3, 1x3x1: uneven
stages, 3x1x1), :mod:`.probes_step`: the notebook's ``GPT`` with the judge's weights cut into
stages by the given ``from_model``, one ``composed_step`` on the judge's batch in float64, a
second on another batch, and one in float32 on each launch's first mesh:

* ``step-values``: the loss (a Python float, the same on every rank) and every parameter's
  gradient on every rank equal to the whole batch's in one process (:func:`.refs.gpt`), cut as
  the rank holds it (:func:`.refs.stage_grads`): data-parallel replicas equal;
* ``step-messages``: exactly the pipeline's messages: the activation to the next stage and its
  gradient back, each of ``B/dp * S * d`` numbers, to and from the mesh's neighbours only;
* ``step-collectives``: every collective over one of the rank's mesh groups; over the
  tensor-parallel group only all-reduces, as many and as large as the stage's blocks, embedding
  and loss need; over the data-parallel group the parameters' numbers (and the loss); over the
  pipeline group only the loss;
* ``step-wire``: where links are observed (grading), with a wide model's step more on each
  launch's first mesh (:data:`.inputs.GPT_WIRE_SIZES`), all links together carry what those
  calls put there (:mod:`.wire`), whatever the ranks do to the recorders in their memory.

Tolerance: ``1e-10`` (float64) or ``1e-5`` (float32) times the largest magnitude of the
reference (at least 1): the loss's, or all the model's gradients'.

Used in 11_bonus_composed.
"""
from pathlib import Path

import numpy as np
import torch

from ..contract import CheckFailure, fail
from ..harness import HANG_AFTER, check, observing, run_ranks
from ..integrity import VIOLATION, verify_rank0_number
from ..notebook_files import no_file, unimplemented
from . import inputs, probes_step, refs
from .checks import close_to_scale, unfinished
from .wire import check_step_wire

__all__ = ["check_composed_step"]

TOL = {"float64": 1e-10, "float32": 1e-5}
PIECES = ("Mesh.__init__", "ReduceFromGroup.forward", "ReduceFromGroup.backward",
          "VocabParallelEmbedding.from_embedding", "VocabParallelEmbedding.forward",
          "VocabParallelCrossEntropy.forward", "VocabParallelCrossEntropy.backward",
          "CopyToGroup.forward", "CopyToGroup.backward", "TensorParallelBlock.forward",
          "GPTStage.forward", "composed_step")
SENDS, RECVS = ("send", "isend"), ("recv", "irecv")


def _model(run):
    return inputs.GPT_WIRE_SIZES if run["wide"] else inputs.GPT_SIZES


def _check_values(where, run, coords, sizes, salt0):
    tol = TOL[run["dtype"]]
    loss, grads = refs.gpt(salt0, getattr(torch, run["dtype"]), run["step"], _model(run))
    got = run["loss"]
    if got["type"] != "float":
        fail("step-values", f"{where} returned a {got['type']}; expected a Python float (the "
                            "whole batch's mean loss)")
    if abs(got["value"] - loss) > tol * max(1.0, abs(loss)):
        fail("step-values", f"{where} returned the loss {got['value']!r}; expected {loss!r}, "
                            "the whole batch's mean loss, on every rank (the data-parallel "
                            "replicas' losses averaged, then broadcast from the last stage)")
    if not run["kept"]:
        fail("step-values", f"{where} modified the tokens or targets it was given")
    want = refs.stage_grads(grads, coords["pp"], sizes["pp"], coords["tp"], sizes["tp"],
                            _model(run))
    if set(run["grads"]) != set(want):
        fail("step-values", f"{where}: the stage's parameters are {sorted(run['grads'])}; "
                            f"expected {sorted(want)} (the given from_model's)")
    want = {k: refs.digest(v, run["wide"]) for k, v in want.items()}
    scale = max(1.0, max(float(np.max(np.abs(g))) for g in (want if run["wide"] else grads)
                         .values()))
    for name, value in reversed(want.items()):      # in the backward's order: the first
        #                                               gradient that differs is nearest the fault
        close_to_scale("step-values", f"{where}: the gradient of {name}", run["grads"][name],
                       value, tol, scale)


def _zeros(model):
    """The model's parameters as zeros (their shapes, for counting a stage's numbers)."""
    return {name: np.zeros(shape) for name, shape in inputs.gpt_shapes(model)}


def _messages(where, log, prev, nxt, n):
    got = sorted(("send" if e[0] in SENDS else "recv", e[2], e[1]) for e in log
                 if e[0] in SENDS + RECVS)
    want = sorted([("recv", prev, n), ("send", prev, n)] * (prev is not None)
                  + [("send", nxt, n), ("recv", nxt, n)] * (nxt is not None))
    if got != want:
        said = ", ".join(f"{k} {'to' if k == 'send' else 'from'} rank {p} ({m} numbers)"
                         for k, p, m in got) or "none"
        fail("step-messages", f"{where}: the messages were {said}; expected "
                              f"{', '.join(f'{k} with rank {p} ({m} numbers)' for k, p, m in want) or 'none'}"
                              ": the activation to the next stage and its gradient back, the "
                              "gradient of the input to the previous stage (one micro-batch)")


def _collectives(where, log, groups, nblocks, p, pp, n_params, model):
    V, d, _, _, _, S = model
    b = inputs.GPT_BATCH // len(groups["dp"])
    by = {dim: [] for dim in groups}
    for name, numel, ranks in (e for e in log if e[0] not in SENDS + RECVS):
        if ranks is not None and len(ranks) == 1:
            continue                     # a group of one rank: no communication at all
        dim = next((k for k, g in groups.items() if ranks == g), None)
        if dim is None:
            fail("step-collectives", f"{where}: {name} over ranks {ranks}; every collective "
                                     f"goes over one of this rank's groups {groups}")
        by[dim].append((name, numel))
    if len(groups["tp"]) > 1:
        bsd, bs = b * S * d, b * S
        want = (4 * nblocks * [bsd] + ([bsd] if p == 0 else [])
                + ([bs, bs, bs, bsd] if p == pp - 1 else []))
        names = {n for n, _ in by["tp"]}
        if names - {"all_reduce"} or sorted(m for _, m in by["tp"]) != sorted(want):
            fail("step-collectives", f"{where}: over the tensor-parallel group "
                                     f"{', '.join(f'{n} of {m}' for n, m in by['tp']) or 'none'}; "
                                     f"expected all-reduces of {sorted(want)} numbers (two per "
                                     "block each way, the embedding's sum, the loss's three and "
                                     "the head's input gradient)")
    if len(groups["dp"]) > 1:
        total = sum(m or 0 for _, m in by["dp"])
        if {n for n, _ in by["dp"]} - {"all_reduce"} or not n_params <= total <= n_params + 1:
            fail("step-collectives", f"{where}: over the data-parallel group "
                                     f"{', '.join(f'{n} of {m}' for n, m in by['dp']) or 'none'}; "
                                     f"expected all-reduces of the stage's {n_params} gradient "
                                     "numbers (and the loss)")
    if len(groups["pp"]) > 1 and (sum(m or 0 for _, m in by["pp"]) > 2
                                  or any(m != 1 for _, m in by["pp"])):
        fail("step-collectives", f"{where}: over the pipeline group "
                                 f"{', '.join(f'{n} of {m}' for n, m in by['pp'])}; expected "
                                 "only the loss (one number) to go there")


def _check_launch(launch, size, res, salts):
    verify_rank0_number(res, salts)
    salt0 = salts.get(0, 0)
    # the last stage first: a fault shows first where the backward starts
    order = sorted(range(size), key=lambda r: [-refs.mesh(r, *m["shape"])["coords"]["pp"]
                                               for m in res[r]["meshes"] if "todo" not in m])
    for rank in order:
        out = res[rank]
        for got in out["meshes"]:
            if "todo" in got:
                continue
            dp, pp, tp = got["shape"]
            ref = refs.mesh(rank, dp, pp, tp)
            sizes, coords, groups = ref["sizes"], ref["coords"], ref["ranks"]
            p = coords["pp"]
            for run in got["runs"]:
                model = _model(run)
                nblocks = len(refs.stage_layers(model[4], pp, p))
                where = (f"with {launch}, mesh {dp}x{pp}x{tp}, rank {rank} (stage {p}, "
                         f"tp rank {coords['tp']}, replica {coords['dp']}): composed_step "
                         f"in {run['dtype']}" + (" (the second step)" if run["step"] else "")
                         + (" (the wide model)" if run["wide"] else ""))
                below = sorted({e[0] for e in run["log"] if "." in e[0]})
                if below:
                    raise CheckFailure(f"{VIOLATION}: rank {rank} reached {', '.join(below)} "
                                       "below torch.distributed's functions, where the check "
                                       "records communication")
                _check_values(where, run, coords, sizes, salt0)
                n = inputs.GPT_BATCH // dp * model[5] * model[1]
                _messages(where, run["log"], ref["prev"], ref["next"], n)
                n_params = sum(int(np.size(g)) for g in refs.stage_grads(
                    _zeros(model), p, pp, coords["tp"], tp, model).values())
                _collectives(where, run["log"], groups, nblocks, p, pp, n_params, model)


@check
def check_composed_step(path):
    """Your composed step of a small GPT with 8 gloo ranks (meshes 2x2x2, 1x2x4, 2x4x1,
    4x1x2) and 3 (1x1x3, 1x3x1, 3x1x1), float64 (two steps) and float32: the loss and every
    parameter's gradient on every rank against the whole batch in one process; the pipeline's
    messages to its neighbours only; collectives over the mesh's groups, as many as the step
    needs."""
    path = Path(path)
    if not path.is_file():
        raise CheckFailure(no_file(path))
    todo = [n for n in unimplemented(path) if n in PIECES]
    if todo:
        unfinished(todo, path, PIECES, "8 and 3", [])
    observed = observing()
    for launch, size, shapes in inputs.STEP_LAUNCHES:
        links, salts = {}, {}
        res = run_ranks(path, probes_step.probe_step, size, "gloo",
                        {"shapes": shapes, "wire": observed}, HANG_AFTER,
                        what=f"11_composed.py's composed step with {launch}",
                        case="step-values", links=links, salts=salts)
        found = [m["todo"] for out in res for m in out["meshes"] if "todo" in m]
        if found:
            unfinished(found, path, PIECES, "8 and 3", [])
        _check_launch(launch, size, res, salts)
        check_step_wire(links, size, shapes, launch)
