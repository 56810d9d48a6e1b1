"""The launch of 08's probes and its cache, shared by :mod:`.checks` and :mod:`.checks_powersgd`.

One launch of 3 gloo ranks probes all three stages (:mod:`.probes`); its results are kept per
file content (and whether links are observed), so the three checks of an unchanged file cost
one launch. Its own module so that neither checker module imports the other at load time.

Used in 08_bonus_powersgd.
"""
import hashlib
from pathlib import Path

from ..contract import CheckFailure
from ..notebook_files import no_file, unwritten
from ..harness import HANG_AFTER, observing, run_ranks
from . import probes

TIMEOUT = HANG_AFTER     # seconds without progress before a launch is a hang (harness)
WORLDS = (1, 2, 3)       # the world sizes PowerSGD runs in (one launch: probes._worlds)
_CACHE = {}              # (wire_key, "worlds" or "local") -> per-rank results or CheckFailure
LINKS = {}               # wire_key -> bytes per directed link of its launch (where observed)
SALTS = {}               # wire_key -> {rank: salt} of its launch (where observed; else none)


# ---------------------------------------------------------------- launching, caching
def _results(path, stage, timeout):
    """Yield ``(size, per-rank results of stage)`` for 1, 2 then 3 ranks, all from one launch
    of 3 gloo ranks (:func:`.probes._worlds`); a local stage: rank 0's, or, if PowerSGD crashed
    or hung in that launch, from a launch of the local stages alone."""
    path = Path(path)
    if not path.is_file():
        raise CheckFailure(no_file(path))
    digest = wire_key(path)
    key = (digest, "worlds")
    if key not in _CACHE:
        LINKS[digest], SALTS[digest] = {}, {}
        _CACHE[key] = _launch(path, probes.STAGES, timeout, LINKS[digest], SALTS[digest])
    res = _CACHE[key]
    if isinstance(res, CheckFailure) and stage != "powersgd":
        key = (digest, "local")
        if key not in _CACHE:
            _CACHE[key] = _launch(path, probes.STAGES[:2], timeout)
        res = _CACHE[key]
    if isinstance(res, CheckFailure):
        if " hung: " in str(res):
            del _CACHE[key]                  # maybe a busy machine: try again next time
        raise CheckFailure(str(res), res.case)
    for out in res:
        todo = out[stage].get("todo")
        if todo:
            raise CheckFailure("not implemented yet: " + unwritten(todo, path))
    if stage != "powersgd":
        yield 1, [res[0][stage]]
        return
    worlds = [r[stage] for r in res]
    for size in WORLDS:
        yield size, [w[f"w{size}"] for w in worlds if f"w{size}" in w]


def wire_key(path):
    """The key of a file's launch in the caches: its content, and whether links are observed
    (:func:`..harness.observing`): an observed check never reuses an unobserved launch."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest(), observing()


def world_salts(path, size):
    """The salts of the ranks of the world of ``size`` ranks in the launch of ``path``, its
    rank 0 first (:func:`.probes._worlds`: 1 rank is the launch's rank 0, 2 ranks its ranks 1
    and 2), or None where the launch gave none (links not observed: all 0)."""
    salts = SALTS.get(wire_key(path))
    if not salts:
        return None
    return [salts[r] for r in ({1: (0,), 2: (1, 2)}.get(size) or range(size))]


def _launch(path, stages, timeout, links=None, salts=None):
    """Per-rank results of one launch (3 gloo ranks; the local stages alone: one process
    without communication), or the CheckFailure it raised. ``links`` receives the bytes the
    network counted on each link where that is observed (:func:`..harness.run_ranks`),
    ``salts`` each rank's salt (its gradients derive from it: :func:`.reference.gradient`)."""
    try:
        if "powersgd" not in stages:
            return run_ranks(path, probes.probe, 1, "none", {"stages": stages}, timeout,
                             case="ortho-orthonormal", what="08_powersgd.py (local stages)")
        return run_ranks(path, probes.probe, 3, "gloo", {"stages": stages}, timeout,
                         case="psgd-values", what="08_powersgd.py with 1, 2 and 3 ranks",
                         links=links, salts=salts)
    except CheckFailure as err:
        return err


def _local_stage(path, stage, timeout):
    """The results of a stage without communication (rank 0's of the first launch)."""
    for _, res in _results(path, stage, timeout):
        return res[0]["results"]
