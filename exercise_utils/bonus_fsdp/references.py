"""The judge's references for notebook 09: one process trained on the combined batches (the
batches every rank's part is cut from), as the checks compare the ranks' results with them.

Computed in the checker, never in a rank: at grading this module is hidden from the student's
processes (:func:`exercise_utils.sides.judge_files`). :func:`attach` puts them into a rank's
result under the keys the checks read (``ref``, ``ref_outputs``, ``ref_keys``), computed once
per stage, world size and the ranks' salts (at grading each rank's batches derive from a number
only it was given: :func:`.nets.combined`), with one intra-op thread as in the ranks (the same
sums in the same order); :func:`continued` is the reference after a load, from the state the
ranks loaded.

Used in 09_bonus_fsdp (:mod:`.launches`, :mod:`.checks`, :mod:`.checks_zero3`).
"""
import functools

import torch
import torch.nn.functional as F

from .nets import (EDGE_STEPS, MORE_STEPS, OPTIM, STEPS, ZERO2_SKIPS, arrays, combined,
                   edge_combined, edge_model, make_model)

ZERO3_EDGE = (("zero3-features", "float32", 1), ("zero3-float64", "float64", 1),
              ("zero3-accumulate", "float32", 2))


def reference(size, steps, start=None, grad_scale=1, salts=None, skips=(), zeros_once=False):
    """One process on the combined batches (of the ranks' ``salts``): the model after
    ``steps`` steps (with ``grad_scale``, every gradient multiplied by it: the replay of a
    known mistake). ``skips``: the steps whose forward leaves the last block out (Zero2's
    run), where a trainable parameter without gradient counts as zeros (Zero2's rule);
    ``zeros_once``: one without gradient at the first step counts as zeros at every step (the
    replay of a known mistake)."""
    model = make_model()
    if start is not None:
        model.load_state_dict(start)
    opt = torch.optim.SGD(model.parameters(), **OPTIM)
    first, missing = 0 if start is None else STEPS, None
    for step in range(first, first + steps):
        opt.zero_grad()
        model.skip_last = step in skips
        x, y = combined(step, size, salts)
        (F.cross_entropy(model(x), y) * grad_scale).backward()
        if skips:
            if missing is None:
                missing = {id(p) for p in model.parameters() if p.grad is None}
            for p in model.parameters():
                if p.requires_grad and (p.grad is None or (zeros_once and id(p) in missing)):
                    p.grad = torch.zeros_like(p)
        opt.step()
    model.skip_last = False
    return model


def edge_reference(size, dtype, micro=1, zero_fill=False, salts=None):
    """One process on the combined batches of ``EDGE_STEPS`` steps (``micro`` backward passes
    each); ``zero_fill``: a trainable parameter without gradient gets zeros (Zero2's rule)."""
    model = edge_model(0, dtype)
    opt = torch.optim.SGD(model.parameters(), **OPTIM)
    for step in range(EDGE_STEPS):
        opt.zero_grad()
        for m in range(micro):
            x, y = edge_combined(step, m, size, dtype, salts)
            F.cross_entropy(model(x), y).backward()
        if zero_fill:
            for p in model.parameters():
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
        opt.step()
    return model


def continued(size, start, salts=None):
    """The reference of ``state-load``: one process that loads ``start`` (rank 0's
    ``full_state_dict()``, as every rank loaded it; already judged against the reference by
    ``state-values``) and trains ``MORE_STEPS`` more steps on the combined batches. From the
    same start as the ranks: a difference within the tolerance before the load is not
    amplified by the steps after it (with salted batches it sometimes grew past it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start = {k: torch.from_numpy(v) for k, v in start.items()}
        return arrays(reference(size, MORE_STEPS, start, salts=salts).state_dict())
    finally:
        torch.set_num_threads(threads)


def attach(stage, size, out, salts=None):
    """Put into ``out`` (one rank's result of ``stage`` with ``size`` ranks, whose batches
    derived from ``salts``) the references its checks compare it with; returns ``out``. A
    ``ref*`` key is a reference; another key is a sub-result (an EdgeNet case) that gets its
    own references, where the rank reached it."""
    for key, value in _references(stage, size, tuple(sorted((salts or {}).items()))).items():
        if key.startswith("ref"):
            out[key] = dict(value) if isinstance(value, dict) else value
        elif isinstance(out.get(key), dict):
            out[key].update(value)
    return out


@functools.lru_cache(maxsize=None)
def _references(stage, size, salted=()):
    salts = dict(salted)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if stage == "zero2":
            return {"ref": arrays(dict(reference(size, STEPS, salts=salts, skips=ZERO2_SKIPS)
                                       .named_parameters())),
                    **{key: {"ref": arrays(edge_reference(size, dtype, zero_fill=True,
                                                          salts=salts).state_dict())}
                       for key, dtype in (("edge32", "float32"), ("edge64", "float64"))}}
        if stage == "zero3":
            x, _ = combined(STEPS, size)
            refs = {"ref_outputs": reference(size, STEPS, salts=salts)(x).detach().numpy()
                    .copy()}
            for case, dtype, micro in ZERO3_EDGE:
                xe, _ = edge_combined(EDGE_STEPS, 0, size, dtype)
                refs[case] = {"ref_outputs": edge_reference(size, dtype, micro, salts=salts)(xe)
                              .detach().numpy().copy()}
            return refs
        if stage == "state_dict":
            ref = reference(size, STEPS, salts=salts)
            return {"ref": arrays(ref.state_dict()), "ref_keys": list(ref.state_dict()),
                    "edge": {"ref": arrays(edge_reference(size, "float64", salts=salts)
                                           .state_dict())}}
        raise ValueError(f"unknown stage {stage!r}")
    finally:
        torch.set_num_threads(threads)
