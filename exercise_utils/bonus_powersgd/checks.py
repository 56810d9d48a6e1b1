"""Checkers of notebook 08 (PowerSGD), one per graded stage of ``work/08_powersgd.py``.

``check_orthogonalize`` (Gram-Schmidt), ``check_compression_rank`` (what is compressed, at
which rank) and ``check_powersgd`` (the ``PowerSGD`` class, :mod:`.checks_powersgd`). One
launch of 3 gloo ranks probes all three stages (:mod:`.probes`), PowerSGD in worlds of 1, 2
and 3 ranks (rank 0 alone and ranks 1 and 2 together in groups of their own, then all 3);
the results are kept per file content, so the three checks of an unchanged file cost one
launch. Every failure is a
:class:`~exercise_utils.contract.CheckFailure` naming the case of the contract
(:mod:`.requirements`) that found it.

* ``orthogonalize`` on float32 and float64 matrices, one column, a zero column (eps), nearly
  parallel columns, columns of norms far below 1 (eps added to the norm, not under the square
  root) and far above: a tensor of P's shape and dtype, orthonormal columns, column j from P's
  columns 0..j (P = result @ R, R upper-triangular); float64 held to float64 precision.
* ``compression_rank`` on about 100 shapes (0-d to 4-D, some with a zero dimension), ranks
  above min(n, m), rates 0 to 3 with ties, each as a ``torch.Size`` and as a tuple: equal to
  :func:`.expected.compression_rank`, an int.

Used in 08_bonus_powersgd.
"""

import numpy as np

from ..contract import fail
from ..harness import check
from . import expected
from . import reference as ref
from .launches import TIMEOUT, _local_stage


# ---------------------------------------------------------------- stage 1
ORTHO_TOL = {"float32": 1e-4, "float64": 1e-9}   # |Q^T Q - I|, |tril(Q^T P)| / max(1, |P|)
ORTHO_DOC = ("(the docstring: a tensor of P's shape and dtype whose columns are orthonormal, "
             "column j built from P's columns 0..j only)")


def ortho_verdict(k, got):
    """:func:`verdict` on the k-th input of :data:`.reference.ORTHO_CASES`; on columns scaled
    far from 1 (``ortho-eps-norm``) a failure also says where eps goes."""
    _, shape, dtype, special = ref.ORTHO_CASES[k]
    zero = special[1] if isinstance(special, tuple) and special[0] == "zero" else None
    found = verdict(ref.ortho_input(k).double().numpy(), dtype, got, zero)
    if found and isinstance(special, tuple) and special[0] == "scale":
        found = (found[0], f"{found[1]}\nP's entries are of the order of {special[1]:g}, its "
                 f"columns' norms far {'below' if special[1] < 1 else 'above'} 1. The "
                 f"docstring: eps is added to each column's norm before dividing by it "
                 f"(column / (norm + eps)); under the square root (column / sqrt(sum of "
                 f"squares + eps)) it shortens every column whose squared norm is not far "
                 f"above eps")
    return found


def verdict(p, dtype, got, zero=None):
    """None if ``got`` (the probe's record of ``orthogonalize(P)``: type, dtype, value or
    raised) meets the contract for ``P`` (``p`` in float64, of dtype ``dtype``; column
    ``zero`` all zeros, or None), else ``(aspect, message)``; aspect "type", "orthonormal" or
    "triangular"."""
    shape = tuple(p.shape)
    call = f"orthogonalize(P) with P of shape {shape} ({dtype})"
    if zero is not None:
        call += f" whose column {zero} is all zeros (as when the gradient is zero)"
    if "raised" in got:
        return "type", f"{call} raised {got['raised']}: it must work on any such P {ORTHO_DOC}"
    q = got["value"]
    if q is None:
        return "type", (f"{call} returned None: return the result (P itself if you changed "
                        f"it in place)")
    if got["type"] != "torch.Tensor" or q.shape != shape or got["dtype"] != dtype:
        return "type", (f"{call} returned a {got['type']} of shape {tuple(q.shape)} and dtype "
                        f"{got['dtype'] or '?'}; expected a torch tensor of P's shape and dtype "
                        f"({shape}, {dtype}): compute in P's dtype {ORTHO_DOC}")
    if not np.isfinite(q).all():
        return "orthonormal", (f"{call} returned NaN or inf: add eps to each column's norm "
                               f"before dividing by it (the docstring's eps), so that a zero "
                               f"column stays zero instead of becoming 0 / 0")
    tol = ORTHO_TOL[dtype] + _eps_share(p, zero)
    gram, want = q.T @ q, np.eye(shape[1])
    if zero is not None and np.allclose(q[:, zero], 0, atol=1e-6):
        want[zero, zero] = 0          # stays zero (eps); torch.linalg.qr fills it instead
    if not np.allclose(gram, want, atol=tol):
        norms = np.sqrt(np.diag(gram))
        hint = ("columns are not unit vectors (norms " + np.array2string(norms, precision=3)
                + "): divide each by its norm" if not np.allclose(norms, np.diag(want), atol=tol)
                else "columns are not orthogonal: subtract from each column its projections on "
                "the earlier (already normalised) columns")
        but = " (a zero column may stay zero)" if zero is not None else ""
        off = float(np.max(np.abs(gram - want)))
        return "orthonormal", (f"{call}: Q^T Q should be the identity{but}, it is off by "
                               f"{off:.1e} (tolerance {tol:g} for {dtype}):\n"
                               f"{np.array2string(gram, precision=3)}\n{hint}"
                               + (": compute in float64 throughout" if dtype == "float64" else ""))
    r, scale = q.T @ p, tol * max(1.0, float(np.abs(p).max()))
    if not np.allclose(np.tril(r, -1), 0, atol=scale) or not np.allclose(q @ r, p, atol=scale):
        return "triangular", (f"{call}: column j of the result must be built from P's columns "
                              f"0..j only (Gram-Schmidt, P = result @ R with R upper-triangular; "
                              f"torch.linalg.qr(P).Q is also accepted); Q^T P =\n"
                              f"{np.array2string(r, precision=3)}")
    return None


def _eps_share(p, zero, eps=1e-8):
    """What dividing by norm + eps (the docstring) may cost a unit column: a few eps over the
    smallest norm Gram-Schmidt divides by (|R_jj| of P = QR; the zero column left out)."""
    norms = np.abs(np.diagonal(np.linalg.qr(p)[1]))
    norms = [x for j, x in enumerate(norms) if j != zero]
    return 4 * eps / min(norms) if norms and min(norms) > 0 else 0.0


@check
def check_orthogonalize(path, timeout=TIMEOUT):
    """Check ``orthogonalize(P)`` on every input of :data:`.reference.ORTHO_CASES`: the
    baseline's orthonormal columns, then its Gram-Schmidt structure, then one column, a zero
    column, float64 and columns of norms far from 1 (each input's own case)."""
    verdicts = [ortho_verdict(k, got) for k, got in
                enumerate(_local_stage(path, "orthogonalize", timeout))]
    base = [k for k, c in enumerate(ref.ORTHO_CASES) if c[0] == "ortho-orthonormal"]
    for k in base:
        if verdicts[k] and verdicts[k][0] != "triangular":
            fail("ortho-orthonormal", verdicts[k][1])
    for k in base:
        if verdicts[k]:
            fail("ortho-gram-schmidt", verdicts[k][1])
    for k, (case, *_) in enumerate(ref.ORTHO_CASES):
        if verdicts[k]:
            fail(case, verdicts[k][1])


# ---------------------------------------------------------------- stage 2
RANK_DOC = ("(the docstring: 0 for tensors with fewer than 2 dimensions; otherwise r' = "
            "min(n, m, rank) for the matrix (n, m), n = shape[0], m = the product of the other "
            "dimensions, if (n + m) * r' * min_compression_rate < n * m, else 0)")


def _rank_message(shape, rank, rate, got, want, given):
    call = f"compression_rank({given}, rank={rank}, min_compression_rate={rate})"
    did = f"raised {got['raised']}" if isinstance(got, dict) else f"returned {got[1]!r}"
    if len(shape) < 2:
        why = ("tensors with fewer than 2 dimensions (biases, scalars) are always sent "
               "uncompressed, whatever min_compression_rate")
    else:
        n, m = shape[0], int(np.prod(shape[1:]))
        r = min(n, m, rank)
        why = (f"as a matrix ({n}, {m}); r' = min(n, m, rank) = {r}; compressed: "
               f"(n + m) * r' * rate = {(n + m) * r * rate:g}, uncompressed: n * m = {n * m}; "
               f"compress only if the first is smaller")
        if 0 in shape:
            why += (". The docstring: A shape with a zero dimension (no elements) gives 0, "
                    "whatever the rate (r' = 0: nothing to compress); shape[0] may be 0, so "
                    "never divide by it")
    return f"{call} {did}, expected {want}: {why} {RANK_DOC}"


@check
def check_compression_rank(path, timeout=TIMEOUT):
    """Check ``compression_rank(shape, rank, min_compression_rate)`` on every case of
    :func:`.reference.rank_cases`, shapes as ``torch.Size`` (each case its own check case, in
    order), then as plain tuples (``rank-tuple``), then shapes with a zero dimension in both
    forms (``rank-empty``), then the type of every result (an int)."""
    results = _local_stage(path, "compression_rank", timeout)
    cases = ref.rank_cases()
    for i, (case, shape, rank, rate) in enumerate(cases):
        want, got = expected.compression_rank(shape, rank, rate), results[i]
        if case != "rank-empty" and (isinstance(got, dict) or got[1] != want):
            fail(case, _rank_message(shape, rank, rate, got, want, f"torch.Size({list(shape)})"))
    for i, (case, shape, rank, rate) in enumerate(cases):
        want, got = expected.compression_rank(shape, rank, rate), results[len(cases) + i]
        if case != "rank-empty" and (isinstance(got, dict) or got[1] != want):
            fail("rank-tuple", _rank_message(shape, rank, rate, got, want, f"{shape!r}") +
                 ". shape may be a plain tuple as well as a torch.Size (the docstring's Args)")
    for i, (case, shape, rank, rate) in enumerate(cases + cases):
        want, got = expected.compression_rank(shape, rank, rate), results[i]
        if case == "rank-empty" and (isinstance(got, dict) or got[1] != want):
            given = f"torch.Size({list(shape)})" if i < len(cases) else f"{shape!r}"
            fail(case, _rank_message(shape, rank, rate, got, want, given))
    for (_, shape, rank, rate), got in zip(cases + cases, results):
        if not _is_int(got[0]):
            fail("rank-int", f"compression_rank({shape}, rank={rank}, min_compression_rate="
                             f"{rate}) returned a {got[0]} ({got[1]!r}); the docstring promises "
                             f"an int: return a Python int (e.g. int(...))")


def _is_int(kind):
    """Whether a result of this type (module.name) is the int the docstring promises: a Python
    int (a bool is one too). numpy's integers are not: ``isinstance(numpy.int64(2), int)`` is
    False, and ``json``, for one, refuses them."""
    module, name = kind.split(".", 1)
    return module == "builtins" and name in ("int", "bool")


from .checks_powersgd import check_powersgd  # noqa: E402,F401 - the CHECK cell imports it here
