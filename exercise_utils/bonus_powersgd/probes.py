"""Inside the checker's processes for notebook 08 (PowerSGD), and the checker's reference.

:func:`probe` runs in every rank (gloo group already initialised by the harness): it calls the
student's ``orthogonalize`` and ``compression_rank`` on fixed inputs (no communication), then
trains nothing: it hands the student's ``PowerSGD`` a fixed set of gradients, different on
every rank and at every step, for :data:`STEPS` steps in each of :data:`CONFIGS`, and records
every ``torch.distributed`` collective the student's code makes (name, elements, bytes), the
gradients it leaves and its ``bytes_sent``.

:func:`simulate` is the reference: every rank of PowerSGD replayed in one process in float64
(the paper's algorithm, with the same random Qs as the student's ``new_q``), optionally with
one known mistake (``flaw``) so that the checker can name the mistake a result matches.

Used in 08_bonus_powersgd (by :mod:`exercise_utils.checks_powersgd`).
"""
import traceback

import numpy as np
import torch
import torch.distributed as dist

# name -> shape of the "gradients" (as in a small CNN). As matrices: conv (6, 18), fc1 (10, 24),
# thin (3, 2): compressed at rank 1 only, row (1, 12): never saves, fc2 (4, 10).
SHAPES = {"conv.weight": (6, 2, 3, 3), "conv.bias": (6,), "fc1.weight": (10, 24),
          "fc1.bias": (10,), "thin.weight": (3, 2), "row.weight": (1, 12),
          "fc2.weight": (4, 10), "fc2.bias": (4,)}
# name -> PowerSGD(..., rank, min_compression_rate, warm_start); "full": exact average expected
CONFIGS = {"full": dict(rank=64, min_compression_rate=0.0, warm_start=False),
           "rank1": dict(rank=1, min_compression_rate=1.0, warm_start=True),
           "rank2": dict(rank=2, min_compression_rate=1.0, warm_start=True),
           "rank2_cold": dict(rank=2, min_compression_rate=1.0, warm_start=False)}
STEPS = 4
SEED = 7                     # PowerSGD(seed=...) in the probe and in the reference
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "send", "recv",
               "isend", "irecv", "gather", "scatter")
# (args, kwargs) of the student's compression_rank and orthogonalize calls in the probe
RANK_CASES = [((10,), 1, 1.0), ((10,), 1, 0.5), ((10,), 4, 0.0), ((6, 2, 3, 3), 2, 1.0),
              ((6, 2, 3, 3), 8, 1.0), ((3, 2), 1, 1.0), ((3, 2), 2, 1.0), ((1, 12), 1, 1.0),
              ((4, 10), 8, 0.0), ((4, 10), 4, 1.0), ((4, 10), 2, 2.0), ((4, 10), 2, 1.0),
              ((50, 320), 4, 1.0), ((20, 10, 5, 5), 4, 2.0)]
ORTHO_SHAPES = [(20, 3), (5, 5), (7, 1), (30, 2)]


def compression_rank(shape, rank, min_compression_rate=1.0):
    """The reference of the student's ``compression_rank`` (0: uncompressed)."""
    if len(shape) < 2:
        return 0
    n, m = shape[0], int(np.prod(shape[1:]))
    r = min(n, m, rank)
    return r if (n + m) * r * min_compression_rate < n * m else 0


def gradient(name, step, rank):
    """The gradient of ``name`` on ``rank`` at ``step`` (float32, standard normal entries)."""
    seed = 1000 * step + 100 * rank + list(SHAPES).index(name)
    return torch.randn(SHAPES[name], generator=torch.Generator().manual_seed(seed))


def ortho_input(k):
    """The k-th matrix given to ``orthogonalize`` (the last has two nearly parallel columns)."""
    p = torch.randn(ORTHO_SHAPES[k], generator=torch.Generator().manual_seed(300 + k))
    if k == len(ORTHO_SHAPES) - 1:
        p[:, 1] = p[:, 0] + 1e-2 * p[:, 1]
    return p


# ---------------------------------------------------------------- the reference
def expected_elements(config, one_d_compressed=False, no_saving_rule=False):
    """Elements all-reduced per step: (uncompressed, [(n + m) * r' per compressed])."""
    cfg, plain, comp = CONFIGS[config], 0, []
    for shape in SHAPES.values():
        r = compression_rank(shape, cfg["rank"], cfg["min_compression_rate"])
        n, m = shape[0], int(np.prod(shape[1:]))
        if one_d_compressed and len(shape) == 1:
            r = 1 if (n + 1) * cfg["min_compression_rate"] < n else 0
        if no_saving_rule and len(shape) >= 2:
            r = min(n, m, cfg["rank"])
        if r:
            comp.append((n + m) * r)
        else:
            plain += int(np.prod(shape))
    return plain, comp


def _orth(p, flaw):
    if flaw == "no_orthogonalization":
        return p
    q, r = torch.linalg.qr(p)
    return q * torch.sign(torch.diagonal(r)).where(torch.diagonal(r) != 0, torch.ones(1))


def simulate(config, size, flaw=None):
    """PowerSGD on ``size`` ranks in one process (float64); the gradients every rank holds.

    Args:
        config: a key of :data:`CONFIGS`.
        size: world size.
        flaw: None, or one mistake: "no_error_feedback", "no_orthogonalization",
            "q_not_averaged", "no_warm_start" (a fresh Q every step), "always_warm"
            (warm start although warm_start=False).
    Returns:
        list over steps of ``{name: averaged gradient (numpy)}`` (the same on every rank).
    """
    cfg = CONFIGS[config]
    gen = torch.Generator().manual_seed(SEED)
    errors, qs, out = {}, {}, []
    warm = cfg["warm_start"]
    warm = False if flaw == "no_warm_start" else True if flaw == "always_warm" else warm
    for step in range(STEPS):
        grads = {name: [gradient(name, step, r).double() for r in range(size)] for name in SHAPES}
        result = {}
        for name, shape in SHAPES.items():
            r = compression_rank(shape, cfg["rank"], cfg["min_compression_rate"])
            if not r:
                result[name] = (sum(grads[name]) / size).numpy()
                continue
            ms = [g.reshape(shape[0], -1) + (errors[name][w] if name in errors and
                                              flaw != "no_error_feedback" else 0)
                  for w, g in enumerate(grads[name])]
            if not warm or name not in qs:
                qs[name] = torch.randn(ms[0].shape[1], r, generator=gen).double()
            p = _orth(sum(m @ qs[name] for m in ms), flaw)
            q = sum(m.T @ p for m in ms) / (1 if flaw == "q_not_averaged" else size)
            approx = p @ q.T
            errors[name], qs[name] = [m - approx for m in ms], q
            result[name] = approx.reshape(shape).numpy()
        out.append(result)
    return out


def exact_average(size):
    """Per step, ``{name: the exact average over ranks}``."""
    return [{name: (sum(gradient(name, step, r).double() for r in range(size)) / size).numpy()
             for name in SHAPES} for step in range(STEPS)]


# ---------------------------------------------------------------- recording collectives
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
        frames = [f for f, _ in traceback.walk_tb(exc.__traceback__)
                  if f.f_code.co_filename == student.__file__]
        code = frames[-1].f_code if frames else None
        return {"todo": getattr(code, "co_qualname", code.co_name) if code else "your code"}


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
    return {"results": [student.compression_rank(torch.Size(shape), rank, rate)
                        for shape, rank, rate in RANK_CASES]}


def _probe_powersgd(student, ctx):
    out = {}
    with Recorder(student) as rec:
        for config, kwargs in CONFIGS.items():
            params = [torch.nn.Parameter(torch.zeros(shape)) for shape in SHAPES.values()]
            frozen = torch.nn.Parameter(torch.zeros(3), requires_grad=False)
            compressor = student.PowerSGD(params + [frozen], seed=SEED, **kwargs)
            steps = []
            for step in range(STEPS):
                for p, name in zip(params, SHAPES):
                    p.grad = gradient(name, step, ctx.rank).clone()
                rec.take()
                compressor.reduce()
                steps.append({"calls": rec.take(),
                              "grads": {n: p.grad.detach().numpy().copy()
                                        for n, p in zip(SHAPES, params)},
                              "bytes_sent": getattr(compressor, "bytes_sent", None)})
            out[config] = {"steps": steps,
                           "total_bytes": getattr(compressor, "total_bytes", None)}
    return out
