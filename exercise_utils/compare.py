"""How a check compares what the ranks computed with what it expected, and names the likely
cause of a difference (a sum instead of an average, another rank's values, a replayed mistake).

Owns: :func:`assert_close` (named arrays within a tolerance, or a CheckFailure naming the rank,
the tensor and the error), :func:`likely_cause`, :func:`whose`, :func:`held_by`,
:func:`state_arrays`. Called by the topics' checks (on the judge's side) after
:func:`.harness.run_ranks` returned the ranks' reports; imports nothing of the launching.
"""
import numpy as np

from .contract import CheckFailure


def _replayed(actual, expected, mistakes, atol, rtol):
    """" Likely cause: <mistake>." for the first replayed mistake ``actual`` matches, or ""."""
    for mistake, replay in (mistakes or {}).items():
        values = replay()
        if all(np.allclose(np.asarray(actual[n], dtype=np.float64),
                           np.asarray(values[n], dtype=np.float64), atol=atol, rtol=rtol)
               for n in expected if n in values):
            return f" Likely cause: {mistake}"
    return ""


def whose(actual, candidates, atol=0.0, rtol=0.0):
    """The key of the first of ``candidates`` (key -> dict name -> array, or an array) that
    ``actual`` (the same) equals within the tolerance, shapes included; None if none does.
    Tells "a rank holding another rank's values" and "one step behind" from other mistakes."""
    def arrays(value):
        return value if isinstance(value, dict) else {"value": value}
    got = arrays(actual)
    for key, values in candidates.items():
        want = arrays(values)
        if want and all(name in got and np.shape(got[name]) == np.shape(want[name]) and
                        np.allclose(np.asarray(got[name], dtype=np.float64),
                                    np.asarray(want[name], dtype=np.float64),
                                    atol=atol, rtol=rtol)
                        for name in want):
            return key
    return None


def likely_cause(actual, expected, start=None, size=None):
    """What a mismatch most likely comes from, as a sentence for the message, or "".

    ``actual``/``expected``: dicts name -> array; ``start``: the same arrays before the
    update (then the update ``actual - start`` is compared with ``expected - start``);
    ``size``: the number of ranks. Recognised: a NaN (where it first appeared), a result that
    never moved, about ``size`` or ``1/size`` times the expected update (a sum instead of an
    average, or divided twice), the opposite sign.
    """
    names = list(expected)
    for name in names:
        bad = np.flatnonzero(~np.isfinite(np.asarray(actual[name], dtype=np.float64)))
        if bad.size:
            return (f" Likely cause: a NaN or infinity, first in {name} (flat index {bad[0]}, "
                    f"{bad.size} element{'s' * (bad.size != 1)}): look for a division by zero "
                    f"(a count or a world size of 0?) or an uninitialised buffer (torch.empty).")
    base = {n: np.asarray(start[n], dtype=np.float64) if start is not None else 0.0
            for n in names}
    got = np.concatenate([(np.asarray(actual[n], dtype=np.float64) - base[n]).ravel()
                          for n in names] or [np.zeros(0)])
    want = np.concatenate([(np.asarray(expected[n], dtype=np.float64) - base[n]).ravel()
                           for n in names] or [np.zeros(0)])
    norm = float(want @ want)
    if norm == 0.0:
        return ""
    what = "update" if start is not None else "value"
    if float(got @ got) <= 1e-6 * norm:
        return (f" Likely cause: nothing moved (the {what}s are zero): was the result computed "
                f"but never written back (into p.grad, or into the tensor in place)?")
    k = float(got @ want) / norm
    if float((got - k * want) @ (got - k * want)) > 0.05 ** 2 * norm:
        return ""
    if size and size > 1 and abs(k - size) < 0.15 * size:
        return (f" Likely cause: about {k:.2f} times the expected {what} with {size} ranks: "
                f"summed instead of averaged? Divide the sum by the world size.")
    if size and size > 1 and abs(k - 1 / size) < 0.15 / size:
        return (f" Likely cause: about 1/{size} of the expected {what} with {size} ranks: "
                f"divided by the world size twice, or averaged what was already an average?")
    if abs(k + 1) < 0.15:
        return f" Likely cause: the {what} has the opposite sign."
    return ""


def assert_close(actual, expected, what, rank=None, atol=1e-5, rtol=1e-4, case=None,
                 dtype=False, start=None, size=None, mistakes=None, others=None):
    """Compare named arrays; raise a CheckFailure naming the rank, the tensor and the error,
    and, where one is recognised, the likely cause (:func:`likely_cause`).

    Args:
        actual, expected: dicts name -> array-like (or a single array-like).
        what: what the values are ("parameters after 4 steps").
        rank: the rank the actual values come from (for the message).
        atol, rtol: tolerances as in ``numpy.allclose``.
        case: the check case that compares them (:mod:`.contract`).
        dtype: also require each actual array to have the expected one's dtype.
        start: the values before the update (same names), for the likely cause.
        size: the number of ranks, for the likely cause.
        mistakes: ``{what the mistake is: a function returning the values it gives}``
            (replays of known mistakes, called only on a mismatch): the first the actual
            values match (to 10 times the tolerance) is named as the likely cause.
        others: ``{rank: its expected values}`` for the other ranks: actual values that are
            another rank's (within the tolerance) are named as the likely cause.
    """
    if not isinstance(expected, dict):
        actual, expected = {"value": actual}, {"value": expected}
    where = f"rank {rank}" if rank is not None else "your result"
    missing = sorted(set(expected) - set(actual))
    if missing:
        raise CheckFailure(f"{where}: {what} lacks {missing}", case)
    for name, exp in expected.items():
        if dtype and np.asarray(actual[name]).dtype != np.asarray(exp).dtype:
            raise CheckFailure(f"{where}: {name} is {np.asarray(actual[name]).dtype}, expected "
                               f"{np.asarray(exp).dtype} ({what}): keep the dtype you were "
                               f"given", case)
        a, e = np.asarray(actual[name], dtype=np.float64), np.asarray(exp, dtype=np.float64)
        if a.shape != e.shape:
            raise CheckFailure(f"{where}: {name} has shape {a.shape}, expected {e.shape} "
                               f"({what})", case)
        if not np.allclose(a, e, atol=atol, rtol=rtol):
            diff = float(np.max(np.abs(a - e)))
            if start is not None and not isinstance(start, dict):
                start = {"value": start}
            cause = (_replayed(actual, expected, mistakes, 10 * atol, 10 * rtol) or
                     held_by(actual, others, rank, atol, rtol) or
                     likely_cause({n: actual[n] for n in expected}, expected, start, size))
            raise CheckFailure(f"{where} differs by {diff:.1e} in {name} ({what}; max abs "
                               f"difference, tolerance {atol:g} + {rtol:g}*|expected|).{cause}",
                               case)


def held_by(actual, others, rank, atol=0.0, rtol=0.0):
    """" Likely cause: ..." when ``actual`` equals what another rank should hold (``others``:
    rank -> its expected values), else ""."""
    def empty(values):      # an empty share says nothing about whose it is
        return all(np.size(v) == 0 for v in (values.values() if isinstance(values, dict)
                                             else [values]))
    other = whose(actual, {q: v for q, v in (others or {}).items() if q != rank and not empty(v)},
                  atol, rtol)
    if other is None:
        return ""
    holder = f"rank {rank}" if rank is not None else "this rank"
    return (f" Likely cause: {holder} holds what rank {other} should hold: a rank index is off "
            f"(the pieces sent in the wrong order, counted from the root instead of from rank "
            f"0, or the wrong source / destination).")


def state_arrays(model):
    """Return ``{name: numpy copy}`` of a model's parameters and buffers (for results)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}
