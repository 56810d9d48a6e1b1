"""What runs inside the ranks of notebook 08's checks (PowerSGD): the recorder and the probe.

:func:`probe` runs in every rank (gloo group already initialised by the harness, or none for
the local stages alone): it calls the student's ``orthogonalize`` and ``compression_rank`` on
every input of :mod:`.reference` (no communication; an error is recorded per input), then
trains nothing: in a world of 1 rank and one of 2 side by side, then in the world of 3 (each
its own default process group: :func:`_worlds`), for each of :data:`~.reference.SETTINGS` it
builds the student's ``PowerSGD``
over the setting's parameters (given as a generator, as ``model.parameters()`` is), hands it
fixed gradients, different on every rank and at every step, for ``STEPS`` steps, and records
every ``torch.distributed`` collective the student's code makes (name, elements, bytes, dtype),
the gradients it leaves (and those it must leave None: which parameters have a gradient may
change from step to step, :func:`.reference.has_grad`), ``bytes_sent``, ``total_bytes``,
``params``, ``errors`` and ``qs``. Everything goes back as plain data.

Used in 08_bonus_powersgd (by the checks).
"""
import datetime
import numbers
import os
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist

from ..rankworker import not_implemented
from ..recorder import StandsFor
from .reference import (CONV, ORTHO_CASES, SEED, SETTINGS, STEPS, edge_model, gradient,
                        has_grad, layout, ortho_input, rank_cases, settings)

COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "send", "recv",
               "isend", "irecv", "gather", "scatter")


class Recorder:
    """Replaces the torch.distributed collectives (also names the student imported from it)
    by wrappers that record ``(name, elements, bytes, dtype)`` in ``calls``; a
    ``batch_isend_irecv`` records each of its ops as the isend or irecv it holds."""

    def __init__(self, student):
        self.calls, self.original, self.student = [], {}, student

    def __enter__(self):
        for name in COLLECTIVES:
            fn = getattr(dist, name, None)
            if fn is not None:
                self.original[name] = fn
                self._replace(fn, self._wrap(name, fn))
        batch = self.original["batch_isend_irecv"] = dist.batch_isend_irecv
        self._replace(batch, self._batch(batch))
        return self

    def __exit__(self, *exc):
        for name, fn in self.original.items():
            self._replace(getattr(dist, name), fn)

    def _replace(self, old, new):
        for module in (dist, self.student):
            for key, value in list(vars(module).items()):
                if value is old:
                    setattr(module, key, new)

    def _record(self, name, tensor):
        if isinstance(tensor, torch.Tensor):
            self.calls.append((name, tensor.numel(), tensor.numel() * tensor.element_size(),
                               _dtype(tensor)))
        else:
            self.calls.append((name, 0, 0, ""))

    def _wrap(self, name, fn):
        def recorded(*args, **kwargs):
            self._record(name, args[0] if args else kwargs.get("tensor"))
            return fn(*args, **kwargs)
        return _Same(recorded, fn)

    def _batch(self, batch):
        """batch_isend_irecv: each P2POp recorded as the isend or irecv it holds, then made
        with the original function (torch tells a send by ``op.op is isend``)."""
        def batch_isend_irecv(p2p_op_list):
            for op in p2p_op_list:
                if isinstance(op.op, _Same):
                    self._record(op.op.__name__, op.tensor)
                    op.op = op.op.fn
            return batch(p2p_op_list)
        return batch_isend_irecv

    def take(self):
        calls, self.calls = self.calls, []
        return calls


class _Same(StandsFor):
    """A recording wrapper of ``fn`` that compares equal to it (:class:`StandsFor`)."""

    def __init__(self, recorded, fn):
        self.recorded, self.fn = recorded, fn
        self.__name__ = self.__qualname__ = getattr(fn, "__name__", "recorded")
        self.__doc__ = fn.__doc__

    def __call__(self, *args, **kwargs):
        return self.recorded(*args, **kwargs)


# ---------------------------------------------------------------- the probe
STAGES = ("orthogonalize", "compression_rank", "powersgd")


def probe(student, ctx, stages=STAGES):
    """Run in every rank. Returns ``{stage: result}`` for ``stages`` (of :data:`STAGES`); a
    stage whose code raised NotImplementedError gives ``{"todo": function}``. Errors of the
    local stages are recorded per input; errors of PowerSGD propagate (the ranks' collectives
    no longer match; with one rank: recorded per setting), charged to the setting's case.
    PowerSGD's result: :func:`_worlds`."""
    torch.set_num_threads(1)      # tiny tensors: more threads only spin (6 s instead of 0.1 s
    out = {}                      # on a busy 2-core machine)
    if "orthogonalize" in stages:
        out["orthogonalize"] = _todo(student, lambda: _probe_orthogonalize(student, ctx))
    if "compression_rank" in stages:
        out["compression_rank"] = _todo(student, lambda: _probe_rank(student, ctx))
    if "powersgd" in stages:
        out["powersgd"] = _todo(student, lambda: _worlds(student, ctx))
    return out


# ---------------------------------------------------------------- worlds of 1, 2 and 3 ranks
GROUP_TIMEOUT = datetime.timedelta(seconds=600)    # as the harness's group (its limit)


def _worlds(student, ctx):
    """PowerSGD in a world of 1 rank (rank 0) and one of 2 (ranks 1 and 2), side by side, each
    its own default process group, then in the world of all 3 ranks: ``{"w1" or "w2": result,
    "w3": result}``. With another number of ranks: ``{"w<size>": result}``. One launch gives
    the checker all three world sizes."""
    if ctx.size != 3:
        return {f"w{ctx.size}": _probe_powersgd(student, ctx)}
    store = _store(ctx)
    sub = "w1" if ctx.rank == 0 else "w2"
    try:
        _regroup(store, sub, *((0, 1) if ctx.rank == 0 else (ctx.rank - 1, 2)))
        out = {sub: _probe_powersgd(student, ctx)}
    finally:
        _leave_together(store, ctx.rank)
    _regroup(store, "w3", ctx.rank, 3)
    out["w3"] = _probe_powersgd(student, ctx)
    return out


def _store(ctx):
    """A TCPStore served by rank 0 (a free port, told to the others over the launch's group)
    for the groups of :func:`_regroup`."""
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    store = (dist.TCPStore(host, 0, None, True, GROUP_TIMEOUT, wait_for_workers=False)
             if ctx.rank == 0 else None)
    port = [store.port if store is not None else None]
    dist.broadcast_object_list(port, src=0)
    dist.barrier()
    return store if store is not None else dist.TCPStore(host, port[0], None, False,
                                                          GROUP_TIMEOUT)


def _leave_together(store, rank, size=3, limit=60.0):
    """Every rank marks that it is done with its sub-world (whatever it did: a function still
    raising NotImplementedError ends rank 0's world of one at once); rank 0, which serves the
    store, then waits (at most ``limit`` seconds) until all have: leaving first, it took the
    store away from ranks 1 and 2 while they still formed their world of two, and rank 2's
    DistNetworkError hid the "not implemented yet" (a CI run, once zygotes forked faster)."""
    store.add("left-sub-world", 1)
    end = time.monotonic() + limit
    while rank == 0 and store.add("left-sub-world", 0) < size and time.monotonic() < end:
        time.sleep(0.01)


def _regroup(store, name, rank, size):
    """Replace this rank's default process group by group ``name`` (``size`` ranks)."""
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.PrefixStore(name, store), rank=rank,
                            world_size=size, timeout=GROUP_TIMEOUT)


def _todo(student, fn):
    try:
        return fn()
    except NotImplementedError as exc:
        return not_implemented(student, exc)


def _dtype(tensor):
    return str(tensor.dtype).replace("torch.", "")


def _kind(value):
    """'builtins.int', 'numpy.int64', 'torch.Tensor', ..."""
    return f"{type(value).__module__.split('.')[0]}.{type(value).__name__}"


def _raised(exc):
    return {"raised": f"{type(exc).__name__}: {exc}"}


def _probe_orthogonalize(student, ctx):
    out = []
    for k, (case, *_) in enumerate(ORTHO_CASES):
        ctx.case(case)
        try:
            got = student.orthogonalize(ortho_input(k))
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported per input by the checker
            out.append(_raised(exc))
            continue
        if isinstance(got, torch.Tensor):
            out.append({"type": "torch.Tensor", "dtype": _dtype(got),
                        "value": got.detach().to(torch.float64).numpy().copy()})
        else:
            out.append({"type": _kind(got), "dtype": "",
                        "value": None if got is None else np.asarray(got, dtype=np.float64)})
    return {"results": out}


def _probe_rank(student, ctx):
    out = []
    for kind in ("size", "tuple"):
        for case, shape, rank, rate in rank_cases():
            ctx.case("rank-tuple" if kind == "tuple" else case)
            try:
                got = student.compression_rank(torch.Size(shape) if kind == "size" else
                                               tuple(shape), rank, rate)
                out.append([_kind(got), _integer(got)])
            except NotImplementedError:
                raise
            except Exception as exc:  # noqa: BLE001 - reported by the checker, with the call
                out.append(_raised(exc))
    return {"results": out}


def _integer(value):
    if isinstance(value, float):
        return value
    try:
        return int(value)
    except (TypeError, ValueError, RuntimeError):
        return repr(value)[:60]


# ---------------------------------------------------------------- PowerSGD
def _params(setting):
    """``[(name, parameter, kind)]`` in the order of the setting's layout."""
    dtype = getattr(torch, setting.dtype)
    if setting.model == "edgenet":
        model = edge_model(setting.dtype)
        conv = torch.nn.Parameter(torch.zeros(CONV[1], dtype=dtype).contiguous(
            memory_format=torch.channels_last))
        return [(n, p, kind) for (n, p), (_, _, kind) in zip(
            [*model.named_parameters(), (CONV[0], conv)], layout("edgenet"))]
    return [(n, torch.nn.Parameter(torch.zeros(shape, dtype=dtype),
                                   requires_grad=kind != "frozen"), kind)
            for n, shape, kind in layout(setting.model)]


def _probe_powersgd(student, ctx):
    """Every setting in order, in the current default group. With one rank an error ends only
    its setting (recorded, so that the checker reports the settings in order); with more, the
    error propagates (the other ranks wait in a collective)."""
    out, rank, size = {}, dist.get_rank(), dist.get_world_size()
    with Recorder(student) as rec:
        for name in settings(size):
            setting = SETTINGS[name]
            ctx.case(setting.case)
            try:
                out[name] = _run_setting(student, rank, rec, setting, ctx.salt)
            except NotImplementedError:
                raise
            except Exception as exc:  # noqa: BLE001 - reported by the checker, in order
                if size > 1:
                    if exc.args and isinstance(exc.args[0], str):   # which world, which rank
                        exc.args = (f"(with {size} ranks, as rank {rank}) {exc.args[0]}",
                                    *exc.args[1:])
                    raise
                out[name] = {"raised": type(exc).__name__, "message": str(exc),
                             "traceback": _frames(exc, student)}
    return out


def _run_setting(student, rank, rec, setting, salt=0):
    named = _params(setting)
    compressor = student.PowerSGD((p for _, p, _ in named), rank=setting.rank,
                                  min_compression_rate=setting.rate,
                                  warm_start=setting.warm, seed=SEED)
    ids = {id(p): n for n, p, _ in named}
    params = getattr(compressor, "params", None)
    steps = []
    for step in range(STEPS):
        for k, (_, p, kind) in enumerate(named):
            p.grad = gradient(setting, k, step, rank, salt) if has_grad(kind, step) else None
        rec.take()
        _reduce(compressor, named, step)
        steps.append(_snapshot(compressor, named, rec.take(), step))
    return {"params_type": _kind(params),
            "params": [ids.get(id(p), "?") for p in params]
            if isinstance(params, (list, tuple)) else None,
            "steps": steps}


def _frames(exc, student):
    """The traceback's frames in the student's file (else its last three), as text."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if f.filename == student.__file__]
    return "".join(traceback.format_list(mine or frames[-3:])) + f"{type(exc).__name__}: {exc}"


def _snapshot(compressor, named, calls, step):
    return {"calls": calls,
            "grads": {n: (_dtype(p.grad), p.grad.detach().to(torch.float64).numpy().copy())
                      for n, p, kind in named if has_grad(kind, step)},
            "not_none": [n for n, p, kind in named if kind != "frozen" and
                         not has_grad(kind, step) and p.grad is not None],
            "bytes_sent": _number(getattr(compressor, "bytes_sent", None)),
            "total_bytes": _number(getattr(compressor, "total_bytes", None)),
            "errors": _table(getattr(compressor, "errors", None)),
            "qs": _table(getattr(compressor, "qs", None))}


def _number(value):
    """An int or float (from a Python, numpy or one-element torch number), else its repr."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, numbers.Integral):
        return int(value)
    return float(value) if isinstance(value, numbers.Real) else repr(value)[:80]


def _table(table):
    """A dict of tensors as plain data: ``{key: {"dtype", "value"} or {"type"}}``."""
    if not isinstance(table, dict):
        return {"type": _kind(table)}
    out = {}
    for key, value in table.items():
        key = key if isinstance(key, int) else repr(key)[:60]
        out[key] = ({"dtype": _dtype(value),
                     "value": value.detach().to(torch.float64).numpy().copy()}
                    if isinstance(value, torch.Tensor) else {"type": _kind(value)})
    return out


def _reduce(compressor, named, step):
    """``compressor.reduce()``; a crash on a parameter without a gradient, or on one with a
    zero dimension, says so."""
    try:
        compressor.reduce()
    except (AttributeError, TypeError) as exc:
        if "NoneType" not in str(exc):
            raise
        none = [n for n, _, kind in named if kind != "frozen" and not has_grad(kind, step)]
        changes = any(kind not in ("none", "frozen") and not has_grad(kind, step)
                      for _, _, kind in named)
        why = (" Which parameters have a gradient changes from one call to the next here (the "
               "docstring): look at p.grad in every call; a parameter skipped in a call keeps "
               "its errors[i] and qs[i]." if changes else "")
        raise type(exc)(f"{exc}. (If it comes from a gradient: in step {step + 1} some "
                        f"parameters ({', '.join(none)}{'' if changes else ': an unused layer'}"
                        f") have p.grad None, and reduce() must skip such parameters.{why})"
                        ) from exc
    except (RuntimeError, ZeroDivisionError) as exc:
        empty = [n for n, p, _ in named if p.grad is not None and p.grad.numel() == 0]
        if not empty:
            raise
        raise type(exc)(f"{exc}. (If it comes from a gradient with a zero dimension "
                        f"({', '.join(f'{n} {tuple(p.shape)}' for n, p, _ in named if n in empty)}"
                        f"): compression_rank gives it 0, so it is sent uncompressed and adds no "
                        f"element to the flat buffer (the docstring); reshape(n, -1) cannot "
                        f"infer -1 for a tensor without elements.)") from exc
