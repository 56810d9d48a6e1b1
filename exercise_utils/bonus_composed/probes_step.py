"""Probe of notebook 11's composed-step checker: runs inside every gloo rank
(:mod:`.checks_step`).

For each mesh of the launch (:data:`.inputs.STEP_LAUNCHES`), the student's ``Mesh``; the
notebook's ``GPT`` (the student's file's given class) with the judge's weights from rank 0's
number (:func:`.inputs.gpt_state`), cut by the given ``GPTStage.from_model``; then
``composed_step`` on the judge's batch: float64 on two batches (the second on the same stage,
its gradients set to None in between) and, on the first mesh, float32 (and, where links are
observed, a wide model in float64: :data:`.inputs.GPT_WIRE_SIZES`). Every message (its
peer and size) and every collective (its group's ranks and size) is logged
(:class:`StepRecorder`), with what reached the ProcessGroup by another path.

Returned as plain data. Used in 11_bonus_composed.
"""
import inspect

import torch
import torch.distributed as dist

from ..rankworker import not_implemented
from ..recorder import P2P, PointToPoint, elements
from . import inputs
from .probes import digest, tp_group


class StepRecorder(PointToPoint):
    """:class:`~exercise_utils.recorder.PointToPoint` that logs a collective as ``(name,
    elements, the global ranks of its group)`` (a message stays ``(name, elements, peer)``)."""

    def note(self, name, args, kwargs):
        if name in P2P:
            return super().note(name, args, kwargs)
        try:
            bound = inspect.signature(self.originals[name]).bind_partial(*args, **kwargs)
            bound = bound.arguments
        except (KeyError, TypeError, ValueError):
            bound = {}
        first = next(iter(bound.values()), None)
        numel = elements(first) if isinstance(first, (torch.Tensor, list, tuple)) else None
        try:
            ranks = [int(r) for r in dist.get_process_group_ranks(bound.get("group")
                                                                  or dist.group.WORLD)]
        except Exception:                       # not a group: the collective itself will say
            ranks = None
        self.log.append((name, numel, ranks))


def _loss(value):
    if isinstance(value, float):
        return {"value": value, "type": "float"}
    try:
        return {"value": float(value), "type": type(value).__name__}
    except (TypeError, ValueError, RuntimeError):
        return {"value": None, "type": type(value).__name__}


def _step(student, mesh, stage, salt0, dtype, step, sizes):
    tokens, targets = inputs.gpt_batch(salt0, step, sizes)
    kept = (tokens.clone(), targets.clone())
    wide = sizes != inputs.GPT_SIZES
    for p in stage.parameters():
        p.grad = None
    with StepRecorder(student) as rec:
        loss = student.composed_step(stage, tokens, targets, mesh)
        log = rec.take()
    return {"dtype": str(dtype)[6:], "step": step, "wide": wide, "loss": _loss(loss),
            "log": log, "grads": {n: digest(p.grad, wide) for n, p in stage.named_parameters()},
            "kept": bool(torch.equal(tokens, kept[0]) and torch.equal(targets, kept[1]))}


def _mesh_runs(student, mesh, salt0, first, wire):
    runs = []
    for dtype, sizes, steps in ((torch.float64, inputs.GPT_SIZES, (0, 1)),
                                *(((torch.float32, inputs.GPT_SIZES, (0,)),) if first else ()),
                                *(((torch.float64, inputs.GPT_WIRE_SIZES, (0,)),)
                                  if first and wire else ())):
        model = student.GPT(*sizes).to(dtype)
        model.load_state_dict(inputs.gpt_state(salt0, dtype, sizes))
        stage = student.GPTStage.from_model(model, mesh)
        del model
        for step in steps:
            runs.append(_step(student, mesh, stage, salt0, dtype, step, sizes))
    return runs


def probe_step(student, ctx, shapes, wire=False):
    """``{"salt0", "meshes": [{"shape", "coords", "prev", "next", "runs": [...]}]}``, or a
    mesh's ``{"todo": ...}`` where a piece raised NotImplementedError (``wire``: the wide run
    too, :data:`.inputs.GPT_WIRE_SIZES`)."""
    salt0 = tp_group(ctx, None)[0]
    out = {"salt0": salt0, "meshes": []}
    for index, shape in enumerate(shapes):
        ctx.case("step-values")
        try:
            mesh = student.Mesh(*shape)
            got = {"shape": list(shape), "coords": {k: int(v) for k, v in mesh.coords.items()},
                   "prev": mesh.prev, "next": mesh.next}
            got["runs"] = _mesh_runs(student, mesh, salt0, index == 0, wire)
        except NotImplementedError as exc:
            out["meshes"].append({"shape": list(shape), **not_implemented(student, exc)})
            break
        out["meshes"].append(got)
    return out
