"""Notebook 08's try cells (issue 39): each part of ``work/08_powersgd.py`` run as soon as it
is written, printing what it computed beside what it should be, in numbers a student can read
(:mod:`exercise_utils.tries`). Not a check: nothing is judged or graded here (the CHECK cells
do that); a wrong part shows as a difference, a part not written yet as the short box of
:mod:`exercise_utils.display`.

    from exercise_utils.bonus_powersgd import tries
    tries.run("local")          # part 1, in one process: orthogonalize and compression_rank
    tries.run("powersgd")       # part 2, on 2 gloo ranks: one reduce() of a tiny model

Used in 08_bonus_powersgd.
"""
import torch
import torch.distributed as dist

from .. import tries as core
from .probes import Recorder

WORK = "work/08_powersgd.py"
# (shape, rank asked for, the r' compression_rank should give, what the shape is)
SHAPES = [((10,), 2, 0, "a bias: never compressed"),
          ((50, 320), 2, 2, "DropoutNet's largest matrix"),
          ((4, 4), 2, 0, "a tie: (4 + 4) x 2 = 16 = 4 x 4"),
          ((6, 2, 3, 3), 4, 4, "a conv weight, viewed as (6, 18)"),
          ((3, 8), 5, 0, "r' = min(3, 8, 5) = 3 does not shrink it"),
          ((0, 5), 1, 0, "no elements")]
TINY = ((20, 12), (12, 3))          # the tiny model's Linear layers (in, out)


def run(piece, work=WORK):
    """Run the try of ``piece`` (``"local"``: part 1, one process; ``"powersgd"``: part 2,
    2 gloo ranks) with the file ``work``; print what it computed."""
    core.run(TRIES, piece, work)


# ----------------------------------------------------------------------------- in the ranks
def _max(t):
    """The largest absolute value of tensor ``t``, as a short string (``1.2e-16``)."""
    return f"{float(t.detach().abs().max()):.1e}" if t.numel() else "0"


def _try_orthogonalize(mine):
    """Lines: orthogonalize on a random float64 matrix, then on one with a zero column."""
    torch.manual_seed(0)
    P = torch.randn(6, 3, dtype=torch.float64)
    out = mine.orthogonalize(P.clone())
    eye = torch.eye(3, dtype=torch.float64)
    zero = P.clone()
    zero[:, 1] = 0
    z = mine.orthogonalize(zero)
    norms = ", ".join(f"{float(n):.3f}" for n in z.norm(dim=0))
    unit = P[:, 0] / P[:, 0].norm()
    gaps = [_max(out[:, 0] - unit), _max(out[:, 0] + unit)]
    return [f"orthogonalize(P), P random 6 x 3 float64: {tuple(out.shape)} {out.dtype}",
            f"  max |result^T result - I| = {_max(out.T @ out - eye)} (expected 1e-8 or less: "
            "the eps)",
            f"  max |column 0 - P's column 0 / its norm| = {min(gaps, key=float)} (up to its "
            "sign, which QR may flip; expected below 1e-7)",
            f"the same P with column 1 zero: column norms {norms} (expected 1.000, 0.000, "
            "1.000)",
            f"  any NaN or inf: {not bool(torch.isfinite(z).all())} (expected False)"]


def _try_compression_rank(mine):
    """Lines: compression_rank of each of :data:`SHAPES` and the float32 bytes it means."""
    lines = ["compression_rank(shape, rank) = r' (expected), float32 bytes sent:"]
    for shape, rank, expected, what in SHAPES:
        r = mine.compression_rank(shape, rank)
        n, m = (shape[0] if shape else 1), 1
        for d in shape[1:]:
            m *= d
        sent = (f"(n + m) r' x 4 = {4 * (n + m) * r} instead of {4 * n * m}" if r
                else f"{4 * n * m} (uncompressed)")
        lines.append(f"  {str(shape):<12} rank {rank}: {r!r} ({expected}), {sent}; {what}")
    return lines


def try_local(mine, ctx):
    """Part 1, in one process: orthogonalize and compression_rank beside what they should
    give. Returns the lines to print."""
    return _try_orthogonalize(mine) + _try_compression_rank(mine)


def _tiny_model(rank):
    """The tiny float32 model of :data:`TINY` (the same on every rank), with this rank's
    gradients (of its own batch)."""
    torch.manual_seed(0)
    layers = [torch.nn.Linear(i, o) for i, o in TINY]
    model = torch.nn.Sequential(layers[0], torch.nn.Tanh(), layers[1])
    torch.manual_seed(1 + rank)
    x, t = torch.randn(8, TINY[0][0]), torch.randn(8, TINY[-1][1])
    torch.nn.functional.mse_loss(model(x), t).backward()
    return model


def _projection_gap(approx, average):
    """Max |approx - U U^T average|, U an orthonormal basis of approx's columns: about zero
    when approx is the projection of the average on the span of its P (linearity)."""
    r = max(int(torch.linalg.matrix_rank(approx)), 1)
    U = torch.linalg.svd(approx, full_matrices=False).U[:, :r]
    return _max(approx - U @ (U.T @ average))


def _bytes_lines(comp, calls, params):
    """What ``reduce()`` sent, beside what it should send and what sending everything costs.

    Args:
        comp: the student's PowerSGD after one ``reduce()``.
        calls: the collectives it made (:class:`.probes.Recorder`'s ``calls``).
        params: the model's parameters.
    Returns:
        The lines: the calls and bytes recorded and ``bytes_sent``; (n + m) r per compressed
        matrix plus the biases; the uncompressed size.
    """
    (n1, m1), (n2, m2) = [(o, i) for i, o in TINY]
    expected = n1 + m1 + n2 + m2 + n1 + n2
    whole = sum(p.numel() for p in params)
    return [f"reduce() at rank 1: {len(calls)} collective(s) of {[c[1] for c in calls]} "
            f"elements, {sum(c[2] for c in calls)} bytes (your bytes_sent: {comp.bytes_sent})",
            f"  expected ({n1} + {m1}) + ({n2} + {m2}) + {n1} + {n2} = {expected} elements, "
            f"{4 * expected} bytes; uncompressed {whole} elements, {4 * whole} bytes "
            f"({whole / expected:.1f}x more)"]


def _result_lines(comp, params, own, average):
    """What ``reduce()`` left, beside what it should be.

    Args:
        comp: the student's PowerSGD after one ``reduce()``.
        params: the model's parameters, in the order given to it.
        own: ``{index: this rank's gradient before reduce()}``.
        average: the true averages of the gradients, in parameter order.
    Returns:
        The lines: each weight against the true average and its projection, its error
        feedback; the biases; the errors and Q's kept.
    """
    lines = []
    for i, p in enumerate(params):
        if p.dim() < 2:
            continue
        g, avg, err = p.grad, average[i], comp.errors.get(i)
        fed = _max(err + g - own[i]) if err is not None and err.shape == g.shape else "n/a"
        lines += [f"weight {tuple(g.shape)}: now of rank {int(torch.linalg.matrix_rank(g))}, "
                  f"max |approx - true average| {_max(g - avg)} (the average's max "
                  f"{_max(avg)}: rank 1 keeps only part of it)",
                  f"  max |approx - the average projected on approx's columns| "
                  f"{_projection_gap(g, avg)} (expected below 1e-6)",
                  f"  max |errors[{i}] + approx - this rank's gradient| {fed} (expected "
                  "below 1e-6)"]
    biases = [_max(p.grad - average[i]) for i, p in enumerate(params) if p.dim() < 2]
    kept = sum(e.numel() for e in comp.errors.values())
    shapes = ", ".join(f"{i}: {tuple(e.shape)}" for i, e in sorted(comp.errors.items()))
    qs = ", ".join(f"{i}: {tuple(q.shape)}" for i, q in sorted(comp.qs.items()))
    return lines + [f"biases (sent whole): max |result - true average| {', '.join(biases)} "
                    "(expected below 1e-6)",
                    f"error feedback kept on this rank: errors {{{shapes}}}: {kept} numbers, "
                    f"{4 * kept} bytes (one per weight entry)",
                    f"warm start kept: qs {{{qs}}}"]


def try_powersgd(mine, ctx):
    """Part 2, on 2 gloo ranks: one ``reduce()`` at rank 1 of a tiny model's gradients (each
    rank its own), the bytes it sent, the result against the true average, the error-feedback
    memory. Returns the lines to print."""
    params = list(_tiny_model(ctx.rank).parameters())
    own = {i: p.grad.clone() for i, p in enumerate(params)}
    average = []
    for p in params:
        total = p.grad.clone()
        dist.all_reduce(total)
        average.append(total / ctx.size)
    comp = mine.PowerSGD(iter(params), rank=1)
    with Recorder(mine) as seen:
        comp.reduce()
    return _bytes_lines(comp, seen.calls, params) + _result_lines(comp, params, own, average)


TRIES = {
    "local": core.Try(try_local, ("orthogonalize", "compression_rank"),
                      "orthogonalize and compression_rank", ranks=1, backend="none"),
    "powersgd": core.Try(try_powersgd, ("orthogonalize", "compression_rank", "PowerSGD.reduce"),
                         "PowerSGD.reduce"),
}
