"""What runs inside the ranks of notebook 08's checks (PowerSGD): the recorder and the probe.

:func:`probe` runs in every rank (gloo group already initialised by the harness): it calls the
student's ``orthogonalize`` and ``compression_rank`` on fixed inputs (no communication), then
trains nothing: it hands the student's ``PowerSGD`` a fixed set of gradients, different on
every rank and at every step, for ``STEPS`` steps in each of ``CONFIGS`` (:mod:`.reference`;
among the parameters a frozen one and an unused one whose grad stays None),
and records every ``torch.distributed`` collective the student's code makes (name, elements,
bytes), the gradients it leaves and its ``bytes_sent``.

Used in 08_bonus_powersgd (by :mod:`.checks`).
"""
import numpy as np
import torch
import torch.distributed as dist

from ..rankworker import not_implemented
from .reference import (CONFIGS, ORTHO_SHAPES, RANK_CASES, SEED, SHAPES, STEPS, UNUSED,
                        gradient, ortho_input)

COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "send", "recv",
               "isend", "irecv", "gather", "scatter")


class Recorder:
    """Replaces the torch.distributed collectives (also names the student imported from it)
    by wrappers that record ``(name, elements, bytes)`` in ``calls``."""

    def __init__(self, student):
        self.calls, self.original, self.student = [], {}, student

    def __enter__(self):
        for name in COLLECTIVES:
            fn = getattr(dist, name, None)
            if fn is not None:
                self.original[name] = fn
                self._replace(fn, self._wrap(name, fn))
        return self

    def __exit__(self, *exc):
        for name, fn in self.original.items():
            self._replace(getattr(dist, name), fn)

    def _replace(self, old, new):
        for module in (dist, self.student):
            for key, value in list(vars(module).items()):
                if value is old:
                    setattr(module, key, new)

    def _wrap(self, name, fn):
        def recorded(*args, **kwargs):
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, torch.Tensor):
                self.calls.append((name, tensor.numel(), tensor.numel() * tensor.element_size()))
            else:
                self.calls.append((name, 0, 0))
            return fn(*args, **kwargs)
        return recorded

    def take(self):
        calls, self.calls = self.calls, []
        return calls


# ---------------------------------------------------------------- the probe
STAGES = ("orthogonalize", "compression_rank", "powersgd")


def probe(student, ctx, stages=STAGES):
    """Run in every rank. Returns ``{stage: result}`` for ``stages`` (of :data:`STAGES`); a
    stage whose code raised NotImplementedError gives ``{"todo": function}``. Errors of the
    local stages are returned as ``{"error": text}``; errors of PowerSGD propagate (the
    ranks' collectives no longer match)."""
    out = {}
    if "orthogonalize" in stages:
        out["orthogonalize"] = _local(student, _probe_orthogonalize)
    if "compression_rank" in stages:
        out["compression_rank"] = _local(student, _probe_rank)
    if "powersgd" in stages:
        out["powersgd"] = _todo(student, lambda: _probe_powersgd(student, ctx))
    return out


def _todo(student, fn):
    try:
        return fn()
    except NotImplementedError as exc:
        return not_implemented(student, exc)


def _local(student, fn):
    try:
        return _todo(student, lambda: fn(student))
    except Exception as exc:  # noqa: BLE001 - reported by the checker
        return {"error": f"{type(exc).__name__}: {exc}"}


def _probe_orthogonalize(student):
    out = []
    for k in range(len(ORTHO_SHAPES)):
        p = ortho_input(k)
        got = student.orthogonalize(p.clone())
        out.append(None if got is None else
                   {"type": type(got).__name__, "dtype": str(getattr(got, "dtype", "")),
                    "value": np.asarray(got.detach().numpy() if isinstance(got, torch.Tensor)
                                        else got, dtype=np.float64)})
    return {"results": out}


def _probe_rank(student):
    out = []
    for shape, rank, rate in RANK_CASES:
        try:
            out.append(student.compression_rank(torch.Size(shape), rank, rate))
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported by the checker, with the call
            out.append({"raised": f"{type(exc).__name__}: {exc}"})
    return {"results": out}


def _probe_powersgd(student, ctx):
    out = {}
    with Recorder(student) as rec:
        for config, kwargs in CONFIGS.items():
            params = [torch.nn.Parameter(torch.zeros(shape)) for shape in SHAPES.values()]
            frozen = torch.nn.Parameter(torch.zeros(3), requires_grad=False)
            unused = torch.nn.Parameter(torch.zeros(UNUSED[1]))     # its grad stays None
            given = params[:UNUSED[2]] + [unused] + params[UNUSED[2]:] + [frozen]
            compressor = student.PowerSGD(given, seed=SEED, **kwargs)
            steps = []
            for step in range(STEPS):
                for p, name in zip(params, SHAPES):
                    p.grad = gradient(name, step, ctx.rank).clone()
                rec.take()
                _reduce(compressor)
                steps.append({"calls": rec.take(),
                              "grads": {n: p.grad.detach().numpy().copy()
                                        for n, p in zip(SHAPES, params)},
                              "bytes_sent": getattr(compressor, "bytes_sent", None),
                              "unused_grad": unused.grad is not None})
            out[config] = {"steps": steps,
                           "total_bytes": getattr(compressor, "total_bytes", None)}
    return out


def _reduce(compressor):
    """``compressor.reduce()``; a crash on the parameter without a gradient says so."""
    try:
        compressor.reduce()
    except (AttributeError, TypeError) as exc:
        if "NoneType" not in str(exc):
            raise
        raise type(exc)(f"{exc}. One parameter ({UNUSED[0]}, {UNUSED[1]}, an unused layer) "
                        f"has p.grad None: reduce() must skip such parameters") from exc
