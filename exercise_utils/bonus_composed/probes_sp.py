"""Probe of notebook 11's sequence-parallel checker: runs inside every gloo rank
(:mod:`.checks_sp`).

On the tensor-parallel groups of the launch (:data:`.inputs.SP_LAUNCHES`), float64 and
float32 (and, where links are observed, a wide float64 block: :data:`.inputs.SP_PARTS`): the
judge's block (:func:`.inputs.sp_block`, the same on every rank of a group) cut by
the given ``from_block``; forward on this rank's rows of the sequence (from its own number),
backward from its rows of the upstream gradient, then ``sequence_parallel_grads``; every
collective recorded in each phase (:class:`~exercise_utils.recorder.Recorder`).

Returned as plain data. Used in 11_bonus_composed.
"""
import torch

from ..rankworker import not_implemented
from ..recorder import Recorder
from . import inputs
from .probes import arr, tp_group

PARAMS = ("w1", "b1", "w2", "b2", "norm.weight", "norm.bias")


def _run(student, rec, group, gi, t, gr, mine, salt0, dtype, size):
    block = inputs.sp_block(salt0, gi, dtype, size)
    x_full, up_full = inputs.sp_rows(mine, gi, t, dtype, size)
    k = inputs.SP_SIZES[size][0] // t
    x = x_full[gr * k:(gr + 1) * k].clone().requires_grad_(True)
    up = up_full[gr * k:(gr + 1) * k].clone()
    par = student.SequenceParallelNormMLP.from_block(block, group)
    rec.take()
    y = par(x)
    forward = rec.take()
    y.backward(up)
    backward = rec.take()
    student.sequence_parallel_grads(par)
    reduce = rec.take()
    grads = {}
    for name in PARAMS:
        p = par
        for part in name.split("."):
            p = getattr(p, part)
        grads[name] = arr(p.grad)
    return {"y": arr(y), "dtype": str(y.dtype), "x_grad": arr(x.grad), "grads": grads,
            "forward": forward, "backward": backward, "reduce": reduce}


def probe_sp(student, ctx, groups=None, wire=False):
    """``{"salt0", "group", "members", "parts": {part: result}, "hidden"}`` (the parts of
    :data:`.inputs.SP_PARTS`; ``wire``: the wide one too)."""
    salt0, group, gi, members, t, gr, mine = tp_group(ctx, groups)
    rec = Recorder()
    rec.install(student)
    parts = {}
    try:
        for name, (dtype, size) in inputs.SP_PARTS.items():
            if size == "wire" and not wire:
                continue
            ctx.case("sp-values")
            try:
                parts[name] = _run(student, rec, group, gi, t, gr, mine, salt0,
                                   getattr(torch, dtype), size)
            except NotImplementedError as exc:
                parts[name] = not_implemented(student, exc)
                break
        hidden = rec.take_hidden()
    finally:
        rec.uninstall()
    return {"salt0": salt0, "group": gi, "members": members, "parts": parts, "hidden": hidden}
