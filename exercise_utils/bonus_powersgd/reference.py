"""The inputs of notebook 08's checks: what the probe hands the student's code (what the code must
give on them is the judge's: :mod:`.expected`).

* ``orthogonalize``: :data:`ORTHO_CASES` (float32 and float64, one column, a zero column,
  nearly parallel columns, column norms far below and above 1), each labelled with the check
  case it belongs to;
* ``compression_rank``: :func:`rank_cases` (0 to 4 dimensions, a zero dimension, ranks above
  min(n, m), rates at and around the tie);
* ``PowerSGD``: :data:`SETTINGS` (rank, rate, warm start, dtype, model), each over
  :func:`layout` (a synthetic CNN's parameters, or EdgeNet's: frozen, unused, tied, transposed,
  0-d, and a channels_last conv weight; parameters with a gradient in some steps only; gradients
  with a zero dimension), with the gradients of :func:`gradient` in the steps of
  :func:`has_grad`.

Shared by :mod:`.probes` (inside the ranks) and the checks. What the code must give on these
inputs (the reference ``compression_rank``, PowerSGD replayed) is the judge's alone:
:mod:`.expected`, which no rank imports (the grading sandbox hides it).

Used in 08_bonus_powersgd.
"""
import functools
import random
from typing import NamedTuple

import torch

from ..rankworker import salted_generator

STEPS = 4                    # reduce() calls per setting
SEED = 7                     # PowerSGD(seed=...) in the probe and in the replay

# ---------------------------------------------------------------- orthogonalize
# (case, shape, dtype, special): special None, "parallel" (column 1 nearly parallel to
# column 0), ("zero", j) (column j all zeros, as when the gradient is zero: P = M Q = 0) or
# ("scale", s) (normal entries times s: column norms far below 1, where adding eps under the
# square root instead of to the norm leaves columns short of unit length, or far above)
ORTHO_CASES = [
    ("ortho-orthonormal", (20, 3), "float32", None), ("ortho-orthonormal", (5, 5), "float32", None),
    ("ortho-orthonormal", (30, 2), "float32", "parallel"),
    ("ortho-orthonormal", (12, 4), "float32", None),
    ("ortho-one-column", (7, 1), "float32", None), ("ortho-one-column", (1, 1), "float32", None),
    ("ortho-zero-column", (6, 3), "float32", ("zero", 1)),
    ("ortho-zero-column", (5, 2), "float32", ("zero", 0)),
    ("ortho-float64", (20, 3), "float64", None), ("ortho-float64", (30, 2), "float64", "parallel"),
    ("ortho-float64", (6, 6), "float64", None), ("ortho-float64", (9, 1), "float64", None),
    ("ortho-eps-norm", (8, 3), "float32", ("scale", 1e-4)),
    ("ortho-eps-norm", (10, 2), "float64", ("scale", 1e-4)),
    ("ortho-eps-norm", (8, 3), "float32", ("scale", 1e4)),
    ("ortho-eps-norm", (10, 2), "float64", ("scale", 1e4)),
]


# float64 inputs are large, so that eps (1e-8, added to a column's norm) changes a unit column
# by less than 1e-14: the checks hold float64 results to 1e-9, where float32 arithmetic fails.
# PowerSGD's warm start and error feedback amplify such a change from step to step (measured:
# 150 times over the 4 steps); at a scale of 1000, correct files that add eps failed the
# float64 setting in 1 of 750 salted runs (tests/test_08_bonus_powersgd.py)
SCALE = {"float32": 1.0, "float64": 1e6}


def ortho_input(k):
    """The k-th matrix given to ``orthogonalize`` (:data:`ORTHO_CASES`)."""
    _, shape, dtype, special = ORTHO_CASES[k]
    p = torch.randn(shape, generator=torch.Generator().manual_seed(300 + k),
                    dtype=getattr(torch, dtype))
    if special == "parallel":
        p[:, 1] = p[:, 0] + 1e-2 * p[:, 1]
    elif special and special[0] == "scale":
        return p * special[1]
    elif special:
        p[:, special[1]] = 0
    return p * SCALE[dtype]


# ---------------------------------------------------------------- compression_rank
RATES = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 2.25, 3.0)   # exact in binary: no rounding at a tie
RANK_ORDER = ("rank-matrix", "rank-tie", "rank-rate", "rank-large", "rank-conv", "rank-1d",
              "rank-scalar", "rank-empty")


def rank_case(shape, rank, rate):
    """The check case of a call: the first way it differs from the baseline (a 2-D matrix,
    rank <= min(n, m), rate 1, no tie): 0-d, 1-D, more dimensions, rank > min(n, m), another
    rate, a tie; last, a shape of 2 or more dimensions with a zero one (no elements)."""
    if len(shape) >= 2 and 0 in shape:
        return "rank-empty"
    if len(shape) < 2:
        return "rank-scalar" if not shape else "rank-1d"
    if len(shape) > 2:
        return "rank-conv"
    n, m = shape
    if rank > min(n, m):
        return "rank-large"
    if rate != 1.0:
        return "rank-rate"
    return "rank-tie" if (n + m) * rank == n * m else "rank-matrix"


def rank_cases():
    """``[(case, shape, rank, rate)]`` for ``compression_rank``, in :data:`RANK_ORDER`: chosen
    edges (``n + m r'`` against ``(n + m) r'``, ties at rates 1 and 2.25, rank above min(n, m)
    with m < n, conv weights whose last dimension is not m, 1-D at rate 0, 0-d, a zero
    dimension first, in the middle and last), then random
    ones; each also asked as a plain tuple (case ``rank-tuple``, checked after these)."""
    fixed = [((10, 24), 1, 1.0), ((10, 24), 2, 1.0), ((50, 320), 4, 1.0), ((5, 6), 3, 1.0),
             ((5, 5), 2, 1.0), ((3, 2), 1, 1.0), ((1, 12), 1, 1.0), ((4, 10), 2, 1.0),
             ((4, 10), 4, 1.0), ((24, 10), 2, 1.0),
             ((4, 4), 2, 1.0), ((6, 12), 4, 1.0), ((10, 15), 6, 1.0),
             ((4, 10), 2, 2.0), ((10, 24), 1, 0.5), ((3, 2), 1, 0.0), ((1, 12), 1, 0.5),
             ((10, 24), 2, 3.0), ((10, 24), 1, 3.0), ((6, 18), 2, 2.25), ((4, 10), 1, 2.25),
             ((4, 10), 8, 0.0), ((10, 3), 5, 0.5), ((12, 2), 4, 0.25), ((3, 3), 5, 0.25),
             ((6, 2, 3, 3), 2, 1.0), ((6, 2, 3, 3), 4, 1.0), ((16, 3, 3, 3), 3, 1.0),
             ((20, 10, 5, 5), 4, 2.0), ((8, 4, 3), 2, 1.0), ((6, 2, 3, 3), 2, 2.25),
             ((10,), 1, 1.0), ((10,), 1, 0.5), ((10,), 4, 0.0), ((1,), 1, 0.0), ((300,), 2, 0.25),
             ((), 1, 1.0), ((), 3, 0.0),
             ((0, 7), 2, 1.0), ((7, 0), 1, 0.0), ((0, 3, 3, 3), 4, 0.5), ((4, 0, 3), 2, 1.0),
             ((0, 0), 1, 1.0)]
    rng = random.Random(8)
    for _ in range(60):
        shape = tuple(rng.randint(1, 40) for _ in range(rng.choice((0, 1, 2, 2, 2, 3, 4))))
        fixed.append((shape, rng.randint(1, 12), rng.choice(RATES)))
    cases = [(rank_case(*c), *c) for c in fixed]
    return sorted(cases, key=lambda c: RANK_ORDER.index(c[0]))


# ---------------------------------------------------------------- PowerSGD
class Setting(NamedTuple):
    """One way of building ``PowerSGD`` in the probe, and the check case it belongs to."""
    case: str
    model: str               # "synthetic", "tall", "wide", "varying", "empty" or "edgenet"
    dtype: str
    rank: int
    rate: float              # min_compression_rate
    warm: bool               # warm_start


# the baseline first (case psgd-values: its failures are charged to the clause they break),
# then one dimension changed at a time
SETTINGS = {
    "rank2": Setting("psgd-values", "synthetic", "float32", 2, 1.0, True),
    "rank1": Setting("psgd-values", "synthetic", "float32", 1, 1.0, True),
    "cold": Setting("psgd-cold", "synthetic", "float32", 2, 1.0, False),
    "rate2": Setting("psgd-rate", "synthetic", "float32", 1, 2.0, True),
    "full": Setting("psgd-full-rank", "tall", "float32", 64, 0.0, False),
    "float64": Setting("psgd-float64", "synthetic", "float64", 2, 1.0, True),
    "edgenet": Setting("psgd-model", "edgenet", "float32", 2, 1.0, True),
    # which parameters have a gradient changes from step to step (:data:`SOMETIMES`), and
    # gradients with a zero dimension beside the baseline's kinds: in the world of one rank
    # only (:data:`ONE_RANK`)
    "varying": Setting("psgd-varying", "varying", "float32", 2, 1.0, True),
    "empty": Setting("psgd-empty", "empty", "float32", 2, 1.0, True),
    # the baseline on one wide layer: a compressed step sends 1% of its gradient, so the bytes
    # the network counts tell PowerSGD's factors from whole gradients (at grading, checks.py)
    "wide": Setting("psgd-values", "wide", "float32", 2, 1.0, True),
}

# settings run in the world of one rank only: there an error ends only its setting, and the
# checker reports the settings in order. With more ranks an error ends the launch, so a file
# that crashes on these edges (a list of parameters kept from the first step, state numbered
# by the parameters that have a gradient, reshape(n, -1) of an empty gradient) would hide the
# earlier settings' verdicts, which name its other mistakes better. Every rank varies alike:
# one rank shows what more would.
ONE_RANK = ("varying", "empty")


def settings(size):
    """The names of the settings run in a world of ``size`` ranks, in order."""
    return [n for n in SETTINGS if size == 1 or n not in ONE_RANK]


# (name, shape, kind): kind "grad", "none" (trainable, its grad stays None: an unused layer),
# "frozen" (requires_grad=False). As matrices: conv (6, 18), fc1 (10, 24), thin (3, 2):
# compressed at rank 1 only (at rate 1), row (1, 12): never saves, fc2 (4, 10).
SYNTHETIC = [("conv.weight", (6, 2, 3, 3), "grad"), ("frozen", (3,), "frozen"),
             ("conv.bias", (6,), "grad"), ("fc1.weight", (10, 24), "grad"),
             ("unused.weight", (5, 8), "none"), ("unused.bias", (5,), "none"),
             ("fc1.bias", (10,), "grad"), ("thin.weight", (3, 2), "grad"),
             ("row.weight", (1, 12), "grad"), ("fc2.weight", (4, 10), "grad"),
             ("fc2.bias", (4,), "grad")]


WIDE = [("wide.weight", (256, 1024), "grad"), ("wide.bias", (256,), "grad")]

# the synthetic CNN with tall matrices (n >= 4 m, and a 1 x 12 row), for the full-rank setting:
# there P = M Q is (n, m), and for n well above m a sum of normal matrices is well-conditioned
# whatever the ranks' salts. With wide ones P would be square, and a square normal matrix's
# condition number is heavy-tailed (measured: above 2000 for 1% of salted runs, up to 9e4),
# so a correct float32 Gram-Schmidt (which loses orthogonality as eps * cond(P), or its square
# for the classical one) would sometimes miss the exact average by 1e-3.
TALL = [("conv.weight", (12, 1, 3, 1), "grad"), ("frozen", (3,), "frozen"),
        ("conv.bias", (12,), "grad"), ("fc1.weight", (24, 4), "grad"),
        ("unused.weight", (8, 5), "none"), ("unused.bias", (8,), "none"),
        ("fc1.bias", (24,), "grad"), ("thin.weight", (8, 2), "grad"),
        ("row.weight", (1, 12), "grad"), ("fc2.weight", (20, 5), "grad"),
        ("fc2.bias", (20,), "grad")]


# which parameters have a gradient changes from step to step: kind "late" has none in step 1
# (its first Q drawn in step 2), "gap" has none in step 2 (its error and Q kept for step 3);
# fc1 always has one (so the flat buffer is never empty)
VARYING = [("fc1.weight", (10, 24), "grad"), ("late.weight", (12, 20), "late"),
           ("gap.weight", (8, 16), "gap"), ("gap.bias", (8,), "gap"), ("fc1.bias", (10,), "grad"),
           ("late.bias", (12,), "late")]
SOMETIMES = {"late": (1, 2, 3), "gap": (0, 2, 3)}     # kind -> the steps (from 0) with a gradient

# gradients with a zero dimension (an embedding of an empty vocabulary, a conv without input
# channels): compression_rank gives 0 (r' = 0), so they join the flat buffer, adding nothing
EMPTY = [("empty.weight", (0, 7), "grad"), ("fc1.weight", (10, 24), "grad"),
         ("nochannel.weight", (4, 0, 3, 3), "grad"), ("fc1.bias", (10,), "grad")]


MODELS = {"synthetic": SYNTHETIC, "wide": WIDE, "tall": TALL, "varying": VARYING,
          "empty": EMPTY}


def edge_model(dtype="float32"):
    """:class:`~exercise_utils.models.EdgeNet` (its values do not matter: only its parameters'
    names, shapes, layout and flags do)."""
    from ..models import EdgeNet
    return EdgeNet(dtype=getattr(torch, dtype))


GRADIENTS = ("grad", "transposed", "channels_last")   # the kinds that get a gradient


def has_grad(kind, step):
    """Whether a parameter of ``kind`` gets a gradient in ``step`` (from 0): always for the
    kinds of :data:`GRADIENTS`, in the steps of :data:`SOMETIMES` for those, never else."""
    return kind in GRADIENTS or step in SOMETIMES.get(kind, ())
CONV = ("conv.weight", (6, 2, 3, 3), "channels_last")  # after EdgeNet's: view(n, -1) fails on it


@functools.lru_cache(maxsize=None)
def layout(model):
    """``[(name, shape, kind)]`` of the parameters PowerSGD gets, in order; kind "grad",
    "none", "frozen", "transposed" (a 2-D gradient stored transposed), "channels_last" (a
    conv weight's gradient in channels_last memory: neither is contiguous), "late" or "gap" (a
    gradient in the steps of :data:`SOMETIMES` only). "edgenet": EdgeNet's
    parameters, then a channels_last conv weight (:data:`CONV`)."""
    if model in MODELS:
        return tuple(MODELS[model])
    out = []
    for name, p in edge_model().named_parameters():      # the tied weight once
        kind = ("frozen" if not p.requires_grad else "none" if name.startswith("unused.") else
                "transposed" if not p.is_contiguous() else "grad")
        out.append((name, tuple(p.shape), kind))
    return tuple(out) + (CONV,)


def trainable(model):
    """``[(k, name, shape, kind)]`` of ``self.params`` (the layout without frozen parameters;
    its position is the index of a parameter's state), k the position in the layout."""
    return [(k, *e) for k, e in enumerate(layout(model)) if e[2] != "frozen"]


def gradient(setting, k, step, rank, salt=0):
    """The gradient of the k-th parameter of the setting's layout on ``rank`` at ``step``
    (normal in the setting's dtype, times :data:`SCALE`; in the memory layout of its kind).
    With ``salt`` 0 every rank can rebuild every rank's; where the judge observes the links
    each rank's salt is a number only it was given (``ctx.salt``) and only the judge knows
    them all."""
    _, shape, kind = layout(setting.model)[k]
    gen = salted_generator(1000 * step + 100 * rank + k, salt)
    dtype = getattr(torch, setting.dtype)
    g = torch.randn(shape[::-1] if kind == "transposed" else shape, generator=gen, dtype=dtype)
    if kind == "transposed":
        g = g.t()
    elif kind == "channels_last":
        g = g.contiguous(memory_format=torch.channels_last)
    return g * SCALE[setting.dtype]
