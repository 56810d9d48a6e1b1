"""The judge's references for notebook 09: one process trained on the combined batches (the
batches every rank's part is cut from), as the checks compare the ranks' results with them.

Computed in the checker, never in a rank: at grading this module is hidden from the student's
processes (:func:`exercise_utils.sandbox.judge_files`). :func:`attach` puts them into a rank's
result under the keys the checks read (``ref``, ``ref_outputs``, ``ref_keys``,
``ref_continued``), computed once per stage and world size, with one intra-op thread as in the
ranks (the same sums in the same order).

Used in 09_bonus_fsdp (:mod:`.launches`, :mod:`.checks`).
"""
import functools

import torch
import torch.nn.functional as F

from .nets import (EDGE_STEPS, MORE_STEPS, OPTIM, STEPS, arrays, combined, edge_combined,
                   edge_model, make_model)

ZERO3_EDGE = (("zero3-features", "float32", 1), ("zero3-float64", "float64", 1),
              ("zero3-accumulate", "float32", 2))


def reference(size, steps, start=None, grad_scale=1):
    """One process on the combined batches: the model after ``steps`` steps (with
    ``grad_scale``, every gradient multiplied by it: the replay of a known mistake)."""
    model = make_model()
    if start is not None:
        model.load_state_dict(start)
    opt = torch.optim.SGD(model.parameters(), **OPTIM)
    first = 0 if start is None else STEPS
    for step in range(first, first + steps):
        opt.zero_grad()
        x, y = combined(step, size)
        (F.cross_entropy(model(x), y) * grad_scale).backward()
        opt.step()
    return model


def edge_reference(size, dtype, micro=1, zero_fill=False):
    """One process on the combined batches of ``EDGE_STEPS`` steps (``micro`` backward passes
    each); ``zero_fill``: a trainable parameter without gradient gets zeros (Zero2's rule)."""
    model = edge_model(0, dtype)
    opt = torch.optim.SGD(model.parameters(), **OPTIM)
    for step in range(EDGE_STEPS):
        opt.zero_grad()
        for m in range(micro):
            x, y = edge_combined(step, m, size, dtype)
            F.cross_entropy(model(x), y).backward()
        if zero_fill:
            for p in model.parameters():
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
        opt.step()
    return model


def attach(stage, size, out):
    """Put into ``out`` (one rank's result of ``stage`` with ``size`` ranks) the references its
    checks compare it with; returns ``out``. A ``ref*`` key is a reference; another key is a
    sub-result (an EdgeNet case) that gets its own references, where the rank reached it."""
    for key, value in _references(stage, size).items():
        if key.startswith("ref"):
            out[key] = dict(value) if isinstance(value, dict) else value
        elif isinstance(out.get(key), dict):
            out[key].update(value)
    return out


@functools.lru_cache(maxsize=None)
def _references(stage, size):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if stage == "zero2":
            return {"ref": arrays(dict(reference(size, STEPS).named_parameters())),
                    **{key: {"ref": arrays(edge_reference(size, dtype, zero_fill=True)
                                           .state_dict())}
                       for key, dtype in (("edge32", "float32"), ("edge64", "float64"))}}
        if stage == "zero3":
            x, _ = combined(STEPS, size)
            refs = {"ref_outputs": reference(size, STEPS)(x).detach().numpy().copy()}
            for case, dtype, micro in ZERO3_EDGE:
                xe, _ = edge_combined(EDGE_STEPS, 0, size, dtype)
                refs[case] = {"ref_outputs": edge_reference(size, dtype, micro)(xe).detach()
                              .numpy().copy()}
            return refs
        if stage == "state_dict":
            ref = reference(size, STEPS)
            return {"ref": arrays(ref.state_dict()), "ref_keys": list(ref.state_dict()),
                    "ref_continued": arrays(reference(size, MORE_STEPS, ref.state_dict())
                                            .state_dict()),
                    "edge": {"ref": arrays(edge_reference(size, "float64").state_dict())}}
        raise ValueError(f"unknown stage {stage!r}")
    finally:
        torch.set_num_threads(threads)
