"""What notebook 08's contract says the student's code must give: the judge's side, never
imported by a rank (:mod:`.probes` imports only :mod:`.reference`'s inputs; at grading the
sandbox hides this module from the ranks).

* :func:`compression_rank`: the reference of the student's ``compression_rank``;
* :func:`expected_elements`: elements all-reduced per step;
* :func:`simulate` replays every rank of PowerSGD in one process in float64 (the paper's
  algorithm, the same random Qs as the student's ``new_q``), optionally with one known mistake
  (``flaw``) so that the checker can name it.

Used in 08_bonus_powersgd (:mod:`.checks`, :mod:`.checks_powersgd`).
"""
import numpy as np
import torch

from . import reference
from .reference import SEED, SETTINGS, STEPS, gradient, trainable


def compression_rank(shape, rank, min_compression_rate=1.0):
    """The reference of the student's ``compression_rank`` (0: uncompressed)."""
    if len(shape) < 2:
        return 0
    n, m = int(shape[0]), int(np.prod(shape[1:]))
    r = min(n, m, rank)
    return r if (n + m) * r * min_compression_rate < n * m else 0


def expected_elements(name, step=0, one_d_compressed=False, no_saving_rule=False):
    """Elements all-reduced in ``step``: (uncompressed, [(n + m) * r' per compressed]), of the
    parameters that have a gradient in it."""
    s, plain, comp = SETTINGS[name], 0, []
    for _, _, shape, kind in trainable(s.model):
        if not reference.has_grad(kind, step):
            continue
        r = compression_rank(shape, s.rank, s.rate)
        n, m = (shape[0], int(np.prod(shape[1:]))) if shape else (1, 1)
        if one_d_compressed and len(shape) == 1:
            r = 1 if (n + 1) * s.rate < n else 0
        if no_saving_rule and len(shape) >= 2:
            r = min(n, m, s.rank)
        if r:
            comp.append((n + m) * r)
        else:
            plain += int(np.prod(shape))
    return plain, comp


def _orth(p, flaw):
    if flaw == "no_orthogonalization":
        return p
    q, r = np.linalg.qr(p)
    d = np.sign(np.diagonal(r))
    return q * np.where(d == 0, 1.0, d)


def simulate(name, size, flaw=None, salts=None):
    """PowerSGD on ``size`` ranks in one process (float64, numpy: tiny matrices).

    Args:
        name: a key of :data:`SETTINGS`.
        size: world size.
        salts: each rank's salt (a list, rank 0 first: :func:`.reference.gradient`), or
            None: all 0.
        flaw: None, or one mistake: "no_error_feedback", "no_orthogonalization",
            "q_not_averaged", "no_warm_start" (a fresh Q every step), "always_warm"
            (warm start although warm_start=False).
    Returns:
        list over steps of ``{"grads": {name: averaged gradient}, "errors": {i: [M - approx
        per rank]}, "qs": {i: Q}, "scale": {i: max |M| over ranks}, "compressed": {i: (name,
        n, m, r')}, "skipped": [i]}`` (numpy arrays; i the index in ``self.params``): the
        state of every tensor compressed so far, a tensor without a gradient in this step
        (listed in ``skipped``) keeping its own from an earlier step.
    """
    s = SETTINGS[name]
    gen = torch.Generator().manual_seed(SEED)
    errors, qs, out, kept = {}, {}, [], {"errors": {}, "qs": {}, "scale": {}, "compressed": {}}
    warm = False if flaw == "no_warm_start" else True if flaw == "always_warm" else s.warm
    for step in range(STEPS):
        res = {"grads": {}, "errors": {}, "qs": {}, "scale": {}, "compressed": {}}
        for i, (k, pname, shape, kind) in enumerate(trainable(s.model)):
            if not reference.has_grad(kind, step):
                continue
            grads = [gradient(s, k, step, w, salts[w] if salts else 0).double().numpy()
                     for w in range(size)]
            r = compression_rank(shape, s.rank, s.rate)
            if not r:
                res["grads"][pname] = sum(grads) / size
                continue
            ms = [g.reshape(shape[0], -1) + (errors[i][w] if i in errors and
                                              flaw != "no_error_feedback" else 0)
                  for w, g in enumerate(grads)]
            if not warm or i not in qs:
                qs[i] = torch.randn(ms[0].shape[1], r, generator=gen).double().numpy()
            p = _orth(sum(m @ qs[i] for m in ms), flaw)
            q = sum(m.T @ p for m in ms) / (1 if flaw == "q_not_averaged" else size)
            approx = p @ q.T
            errors[i], qs[i] = [m - approx for m in ms], q
            res["grads"][pname] = approx.reshape(shape)
            res["errors"][i] = errors[i]
            res["qs"][i] = q
            res["scale"][i] = max(float(np.abs(m).max()) for m in ms)
            res["compressed"][i] = (pname, *ms[0].shape, r)
        res["skipped"] = sorted(set(kept["compressed"]) - set(res["compressed"]))
        for table in kept:
            kept[table].update(res[table])
            res[table] = dict(sorted(kept[table].items()))
        out.append(res)
    return out
