"""The reference of notebook 08's checks: the gradients, settings and cases the probe hands the
student's code, and what PowerSGD must give on them.

:func:`simulate` replays every rank of PowerSGD in one process in float64 (the paper's
algorithm, with the same random Qs as the student's ``new_q``), optionally with one known
mistake (``flaw``) so that the checker can name the mistake a result matches;
:func:`exact_average` is what full rank must give; :func:`compression_rank` and
:func:`expected_elements` say what is compressed and how many elements go to all_reduce.
Shared by :mod:`.probes` (inside the ranks) and :mod:`.checks`.

Used in 08_bonus_powersgd.
"""
import numpy as np
import torch

# name -> shape of the "gradients" (as in a small CNN). As matrices: conv (6, 18), fc1 (10, 24),
# thin (3, 2): compressed at rank 1 only, row (1, 12): never saves, fc2 (4, 10).
SHAPES = {"conv.weight": (6, 2, 3, 3), "conv.bias": (6,), "fc1.weight": (10, 24),
          "fc1.bias": (10,), "thin.weight": (3, 2), "row.weight": (1, 12),
          "fc2.weight": (4, 10), "fc2.bias": (4,)}


# a trainable matrix the probe puts among them whose grad stays None (an unused layer):
# reduce() must skip it (it is never sent, no Q is drawn for it)
UNUSED = ("unused.weight", (5, 8), 3)      # (name, shape, index in the parameter list)


# name -> PowerSGD(..., rank, min_compression_rate, warm_start); "full": exact average expected
CONFIGS = {"full": dict(rank=64, min_compression_rate=0.0, warm_start=False),
           "rank1": dict(rank=1, min_compression_rate=1.0, warm_start=True),
           "rank2": dict(rank=2, min_compression_rate=1.0, warm_start=True),
           "rank2_cold": dict(rank=2, min_compression_rate=1.0, warm_start=False)}


STEPS = 4


SEED = 7                     # PowerSGD(seed=...) in the probe and in the reference


# (args, kwargs) of the student's compression_rank and orthogonalize calls in the probe
RANK_CASES = [((10,), 1, 1.0), ((10,), 1, 0.5), ((10,), 4, 0.0), ((6, 2, 3, 3), 2, 1.0),
              ((6, 2, 3, 3), 8, 1.0), ((3, 2), 1, 1.0), ((3, 2), 2, 1.0), ((1, 12), 1, 1.0),
              ((4, 10), 8, 0.0), ((4, 10), 4, 1.0), ((4, 10), 2, 2.0), ((4, 10), 2, 1.0),
              ((50, 320), 4, 1.0), ((20, 10, 5, 5), 4, 2.0),
              ((4, 4), 2, 1.0), ((6, 2, 3, 3), 2, 2.25),    # ties: (n + m) r' rate == n m
              ((), 1, 1.0)]                                  # a 0-d tensor (a scalar)


ORTHO_SHAPES = [(20, 3), (5, 5), (7, 1), (30, 2), (6, 3)]
ORTHO_ZERO_COLUMN = (4, 1)   # (input, column): an all-zero column (a zero gradient: P = M Q = 0)


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
    """The k-th matrix given to ``orthogonalize`` (input 3 has two nearly parallel columns,
    input 4 a zero column: :data:`ORTHO_ZERO_COLUMN`)."""
    p = torch.randn(ORTHO_SHAPES[k], generator=torch.Generator().manual_seed(300 + k))
    if k == 3:
        p[:, 1] = p[:, 0] + 1e-2 * p[:, 1]
    if k == ORTHO_ZERO_COLUMN[0]:
        p[:, ORTHO_ZERO_COLUMN[1]] = 0
    return p


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
