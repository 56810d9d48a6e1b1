"""Checkers of notebook 08 (PowerSGD), one per graded stage of ``work/08_powersgd.py``.

``check_orthogonalize`` (Gram-Schmidt), ``check_compression_rank`` (what is compressed, at
which rank) and ``check_powersgd`` (the ``PowerSGD`` class). One launch per world size (2 and
3 gloo ranks) probes all three stages (see :mod:`.probes`); the results
are kept per file content, so the three checks of an unchanged file cost two launches.

``check_powersgd`` hands ``PowerSGD`` fixed gradients, different on every rank and at every
step, for 4 steps in 4 settings, and checks:

* parameters whose grad is None (an unused layer among them) are skipped;
* the collectives, COUNTED by wrapping ``torch.distributed``: only ``all_reduce``; per step
  (n + m) * r' elements per compressed tensor plus every uncompressed element (1-D tensors
  and matrices that would not shrink), in one flat buffer; ``bytes_sent`` equal to the bytes
  recorded;
* at full rank (r >= min(n, m), every matrix compressed) the result is the exact average;
* at ranks 1 and 2 (warm start, and rank 2 without it) the result equals the paper's
  algorithm replayed for every rank in float64 (:func:`.reference.simulate`):
  error feedback carried between steps, P orthogonalized, Q averaged, Q kept. When the result
  matches a known mistake instead, the message names it.

Used in 08_bonus_powersgd.
"""
import hashlib
from pathlib import Path

import numpy as np

from ..harness import HANG_AFTER, run_ranks
from . import probes
from . import reference as ref

TIMEOUT = HANG_AFTER     # seconds without progress before a launch is a hang (harness)
WORLDS = (2, 3)
# float32 student against the float64 reference: |got - want| <= TOL * max|want| per tensor
# (float32 Gram-Schmidt at full rank: measured up to 2.4e-5; a mistake: 1e-1 and more)
TOL = 2e-4
_CACHE = {}                  # (file digest, world size) -> per-rank results or error text

FLAWS = {
    "no_error_feedback": "error feedback is missing: keep error = M - P Q^T per tensor (after "
                         "the all_reduces, on this rank) and add it to the next step's gradient "
                         "before compressing; without it what P Q^T misses is lost for good "
                         "(with it, the applied updates sum to the true gradients' sum minus "
                         "the last error: nothing is lost, only delayed)",
    "no_orthogonalization": "P is not orthogonalized: call orthogonalize(P) after all-reducing P "
                            "and before Q = M^T P; otherwise P Q^T = P P^T M is no projection",
    "q_not_averaged": "the Q's are summed, not averaged: divide them by the world size after "
                      "their all_reduce",
    "no_warm_start": "a fresh random Q is drawn every step although warm_start=True: keep "
                     "self.qs[i] = Q and start the next step from it",
    "always_warm": "Q is kept although warm_start=False: draw a fresh self.new_q(m, r') every "
                   "step in that case",
}


# ---------------------------------------------------------------- launching, caching
def _results(path, stage, timeout):
    """Yield ``(size, per-rank results of stage)`` for 2 then 3 ranks (the local stages:
    once, from the first launch that ran them)."""
    path = Path(path)
    if not path.is_file():
        raise AssertionError(f"{path} does not exist: run the %%writefile cell that creates "
                             "it first.")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    for size in WORLDS:
        key = (digest, size)
        if key not in _CACHE:
            _CACHE[key] = _launch(path, size, probes.STAGES, timeout)
        res = _CACHE[key]
        if isinstance(res, str) and stage != "powersgd":
            # PowerSGD crashed or hung: run the local stages alone (one process)
            key = (digest, "local")
            if key not in _CACHE:
                _CACHE[key] = _launch(path, 1, probes.STAGES[:2], timeout)
            res = _CACHE[key]
        if isinstance(res, str):
            if " hung: " in res:
                del _CACHE[key]              # maybe a busy machine: try again next time
            raise AssertionError(res)
        for out in res:
            todo = out[stage].get("todo")
            if todo:
                raise AssertionError(
                    f"not implemented yet: {todo} in {path} still raises NotImplementedError."
                    f" Replace the `raise` line with your code, then run the %%writefile cell "
                    f"again.")
        yield size, [out[stage] for out in res]


def _launch(path, size, stages, timeout):
    """Per-rank results of one launch, or the error message (a string) if it failed."""
    try:
        return run_ranks(path, probes.probe, size,
                         "gloo" if "powersgd" in stages else "none", {"stages": stages},
                         timeout, what=f"08_powersgd.py with {size} ranks")
    except AssertionError as err:
        return str(err)


def _local_stage(path, stage, timeout):
    """The results of a stage without communication: the same on every rank; rank 0's."""
    for _, res in _results(path, stage, timeout):
        if "error" in res[0]:
            raise AssertionError(f"{stage} raised {res[0]['error']}")
        return res[0]["results"]


# ---------------------------------------------------------------- stage 1
def check_orthogonalize(path, timeout=TIMEOUT):
    """Check ``orthogonalize(P)``: orthonormal columns, column j from P's columns 0..j; a zero
    column gives no NaN (the eps guard)."""
    for k, got in enumerate(_local_stage(path, "orthogonalize", timeout)):
        p = ref.ortho_input(k).double().numpy()
        call = f"orthogonalize(P) with P of shape {tuple(p.shape)}"
        if got is None:
            raise AssertionError(f"{call} returned None: return the orthogonalized matrix")
        q = got["value"]
        if q.shape != p.shape or got["dtype"] != "torch.float32":
            raise AssertionError(f"{call} returned a {got['type']} of shape {q.shape} and "
                                 f"dtype {got['dtype']}; expected a float32 tensor of P's shape")
        zero = ref.ORTHO_ZERO_COLUMN[1] if k == ref.ORTHO_ZERO_COLUMN[0] else None
        if zero is not None:
            call += f" whose column {zero} is all zeros (as when the gradient is zero)"
            if not np.isfinite(q).all():
                raise AssertionError(f"{call} returned NaN or inf: add eps to each column's "
                                     "norm before dividing by it, so that a zero column stays "
                                     "zero instead of becoming 0 / 0")
        gram = q.T @ q
        want = np.eye(p.shape[1])
        if zero is not None and np.allclose(q[:, zero], 0, atol=1e-6):
            want[zero, zero] = 0          # stays zero (eps); torch.linalg.qr fills it instead
        if not np.allclose(gram, want, atol=1e-4):
            norms = np.sqrt(np.diag(gram))
            hint = ("columns are not unit vectors (norms " + np.array2string(norms, precision=3)
                    + "): divide each by its norm" if not np.allclose(norms, np.diag(want),
                                                                      atol=1e-4) else
                    "columns are not orthogonal: subtract from each column its projections on "
                    "the earlier (already normalised) columns")
            but = " (a zero column may stay zero)" if zero is not None else ""
            raise AssertionError(f"{call}: Q^T Q should be the identity{but}, it is\n"
                                 f"{np.array2string(gram, precision=3)}\n{hint}")
        r = q.T @ p
        if not np.allclose(np.tril(r, -1), 0, atol=1e-4 * max(1, np.abs(p).max())) or \
                not np.allclose(q @ r, p, atol=1e-4 * max(1, np.abs(p).max())):
            raise AssertionError(f"{call}: column j of the result must be built from P's columns"
                                 f" 0..j only (Gram-Schmidt, P = result @ R with R upper-"
                                 f"triangular); Q^T P =\n{np.array2string(r, precision=3)}")


# ---------------------------------------------------------------- stage 2
def check_compression_rank(path, timeout=TIMEOUT):
    """Check ``compression_rank(shape, rank, min_compression_rate)`` on fixed cases."""
    results = _local_stage(path, "compression_rank", timeout)
    for (shape, rank, rate), got in zip(ref.RANK_CASES, results):
        want = ref.compression_rank(shape, rank, rate)
        if got != want:
            call = f"compression_rank({shape}, rank={rank}, min_compression_rate={rate})"
            did = (f"raised {got['raised']}" if isinstance(got, dict) else
                   f"returned {got!r}")
            if len(shape) < 2:
                why = ("tensors with fewer than 2 dimensions (biases, scalars) are always sent "
                       "uncompressed, whatever min_compression_rate")
            else:
                n, m = shape[0], int(np.prod(shape[1:]))
                r = min(n, m, rank)
                why = (f"as a matrix ({n}, {m}); r' = min(n, m, rank) = {r}; compressed: "
                       f"(n + m) * r' * rate = {(n + m) * r * rate:g}, uncompressed: n * m = "
                       f"{n * m}; compress only if the first is smaller")
            raise AssertionError(f"{call} {did}, expected {want}: {why}")


# ---------------------------------------------------------------- stage 3
def check_powersgd(path, timeout=TIMEOUT):
    """Check ``PowerSGD``: collectives and bytes counted, exact at full rank, equal to the
    paper's algorithm (error feedback, orthogonalization, warm start) at ranks 1 and 2."""
    for size, res in _results(path, "powersgd", timeout):
        exact = ref.exact_average(size)
        for config in ref.CONFIGS:
            _check_calls(res, config, size)
            reference = exact if config == "full" else ref.simulate(config, size)
            for rank, out in enumerate(res):
                for step, got in enumerate(out[config]["steps"]):
                    bad = _differs(got["grads"], reference[step])
                    if bad:
                        _explain(config, size, rank, step, got["grads"], bad,
                                 out[config]["steps"], reference)
            for rank in range(1, size):
                for step, (a, b) in enumerate(zip(res[0][config]["steps"],
                                                  res[rank][config]["steps"])):
                    bad = _differs(a["grads"], b["grads"])
                    if bad:
                        raise AssertionError(f"after step {step + 1} ({_setting(config)}, "
                                             f"{size} ranks) rank {rank}'s {bad[0]} differs "
                                             f"from rank 0's: every rank must end with the "
                                             f"same gradients")


def _setting(config):
    cfg = ref.CONFIGS[config]
    return (f"PowerSGD(params, rank={cfg['rank']}, min_compression_rate="
            f"{cfg['min_compression_rate']}, warm_start={cfg['warm_start']})")


def _differs(got, want):
    """(name, max abs difference) of the first gradient that differs, or None."""
    for name, w in want.items():
        g, w = np.asarray(got[name], dtype=np.float64), np.asarray(w, dtype=np.float64)
        if g.shape != w.shape:
            return name, float("inf")
        diff = float(np.max(np.abs(g - w)))
        if not diff <= TOL * max(1e-3, float(np.max(np.abs(w)))):
            return name, diff
    return None


def _check_calls(res, config, size):
    plain, comp = ref.expected_elements(config)
    want = plain + sum(comp)
    for rank, out in enumerate(res):
        for step, got in enumerate(out[config]["steps"]):
            calls, where = got["calls"], f"rank {rank}, step {step + 1} of {_setting(config)}"
            other = [c[0] for c in calls if c[0] != "all_reduce"]
            if other:
                raise AssertionError(f"{where}: made {other}; PowerSGD uses only all_reduce")
            elements = sum(c[1] for c in calls)
            nbytes = sum(c[2] for c in calls)
            if elements != want:
                raise AssertionError(f"{where}: all_reduced {elements} elements in "
                                     f"{[c[1] for c in calls]}, expected {want}: "
                                     + _elements_hint(config, elements, plain, comp))
            if nbytes != 4 * want:
                raise AssertionError(f"{where}: all_reduced {nbytes} bytes for {want} elements:"
                                     f" send float32 (4 bytes an element)")
            if plain and plain not in [c[1] for c in calls]:
                raise AssertionError(f"{where}: no all_reduce of {plain} elements; expected ONE"
                                     f" flat buffer holding every uncompressed gradient "
                                     f"(calls: {[c[1] for c in calls]})")
            if len(calls) > (1 if plain else 0) + 2 * len(comp):
                raise AssertionError(f"{where}: {len(calls)} all_reduce calls; expected the "
                                     f"uncompressed gradients in one buffer, then the P's, then"
                                     f" the Q's (one call per compressed tensor at most)")
            if got["unused_grad"]:
                raise AssertionError(f"{where}: the parameter whose grad was None ("
                                     f"{ref.UNUSED[0]}, an unused layer) has a gradient after "
                                     f"reduce(): leave parameters without a gradient alone")
            if got["bytes_sent"] != nbytes:
                raise AssertionError(f"{where}: bytes_sent is {got['bytes_sent']}, but this rank"
                                     f" passed {nbytes} bytes to all_reduce: count numel() * "
                                     f"element_size() of every tensor you all_reduce in reduce()")
        total = sum(s["bytes_sent"] for s in out[config]["steps"])
        if out[config]["total_bytes"] != total:
            raise AssertionError(f"rank {rank}: total_bytes is {out[config]['total_bytes']} "
                                 f"after {ref.STEPS} reduce() calls of {_setting(config)}; the "
                                 f"sum of their bytes_sent is {total}")


def _elements_hint(config, elements, plain, comp):
    one_d = ref.expected_elements(config, one_d_compressed=True)
    no_rule = ref.expected_elements(config, no_saving_rule=True)
    if elements == one_d[0] + sum(one_d[1]):
        return ("you compressed 1-D tensors (biases): they must be sent uncompressed, whatever "
                "min_compression_rate (compression_rank returns 0 for them)")
    if elements == no_rule[0] + sum(no_rule[1]):
        return ("you compressed matrices that do not shrink: send a matrix uncompressed when "
                "(n + m) * r' * min_compression_rate >= n * m (compression_rank returns 0)")
    return (f"(n + m) * r' per compressed tensor {comp} plus {plain} uncompressed elements "
            f"(1-D tensors and matrices that would not shrink), each sent once per step")


def _explain(config, size, rank, step, got, bad, steps, reference):
    name, diff = bad
    where = (f"rank {rank}: after step {step + 1} of {_setting(config)} with {size} ranks, "
             f"{name} differs by {diff:.1e} from ")
    if config == "full":
        avg = reference[step][name]
        if not _differs({name: got[name]}, {name: size * avg}):
            raise AssertionError(where + f"the average: it is {size} times the average: "
                                 + FLAWS["q_not_averaged"])
        flawed = ref.simulate(config, size, "no_orthogonalization")[step]
        hint = (FLAWS["no_orthogonalization"] if not _differs(got, flawed) else
                "check P = M Q, all_reduce(P), orthogonalize, Q = M^T P, all_reduce(Q) / "
                "world_size, approx = P Q^T")
        raise AssertionError(where + "the exact average. At full rank (r' = min(n, m)) P spans"
                             " the whole column space, so P Q^T must equal the average of the"
                             " ranks' gradients: " + hint)
    for flaw, hint in FLAWS.items():
        flawed = ref.simulate(config, size, flaw)
        if all(not _differs(s["grads"], f) for s, f in zip(steps, flawed)):
            raise AssertionError(where + "PowerSGD: " + hint)
    raise AssertionError(where + "PowerSGD as in the paper (P = M Q with M = gradient + error, "
                         "all_reduce P, orthogonalize P, Q = M^T P, all_reduce Q / world_size, "
                         "approx = P Q^T, error = M - approx, Q kept; new Qs from self.new_q "
                         "for the compressed tensors only, in parameter order)")
