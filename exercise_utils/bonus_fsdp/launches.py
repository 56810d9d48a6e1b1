"""The launches of notebook 09's checks: one per world size and stage set, kept per file content,
their results read (not implemented yet, communication below the recorder), and the helpers the
checkers share.

Used in 09_bonus_fsdp.
"""
import hashlib
import math
from pathlib import Path

from ..contract import CheckFailure
from ..notebook_files import no_file, unwritten
from ..harness import HANG_AFTER, observing, run_ranks, salting
from ..recorder import verify_no_hidden
from . import nets, probes, references

WORLD_SIZES = (2, 3)
GLOO_TIMEOUT = 15
ATOL, RTOL = 1e-5, 1e-4
TIGHT = (1e-10, 1e-8)      # float64 results: nothing may have passed through float32
SLACK = 16_000             # bytes of activations and small tensors a measurement may include
SHARDED = 3                # tensors of a shard's size per unit: the shard, its gradient, momentum
GATHERS = ("all_gather", "all_gather_into_tensor")
SCATTERS = ("reduce_scatter", "reduce_scatter_tensor")
FP32 = 4
FIXED = 2 * nets.WIDTH * FP32          # the frozen gain and the buffer: on every rank
FIRST = {"zero2": "zero2-collectives", "zero3": "zero3-collectives", "state_dict": "state-rank0"}
_CACHE = {}
LINKS = {}                  # launch key -> bytes per directed link (where observed)
SALTS = {}                  # launch key -> {rank: salt} the judge gave (at grading; else none)


def _key(path, size, stages):
    """A launch's key: the file's content, the world, the stages, and whether links are
    observed and inputs salted (:func:`..harness.observing`, :func:`..harness.salting`: such a
    check never reuses a launch without)."""
    return (hashlib.sha256(Path(path).read_bytes()).hexdigest(), size, tuple(stages),
            observing(), salting())


def launch(path, size, stages):
    """The per-rank results of the launch of ``stages`` with ``size`` ranks (run once per file
    content); where links are observed (at grading every launch's ranks run on the hosts of a
    mesh) the bytes of each directed link are kept too (:func:`links_of`)."""
    key = _key(path, size, stages)
    if key not in _CACHE:
        links = {}      # (filled where links are observed: harness.observing)
        salts = {}      # (at grading each rank's batches derive from a number only it knows)
        _CACHE[key] = run_ranks(path, probes.probe, size, "none",
                                dict(stages=list(stages), gloo_timeout=GLOO_TIMEOUT),
                                HANG_AFTER, what=f"09_fsdp.py with {size} ranks",
                                case=FIRST[stages[0]], links=links, salts=salts)
        if links:
            LINKS[key] = links
        SALTS[key] = salts
    return _CACHE[key]


def salts_of(path, size, stages):
    """``{rank: salt}`` the judge gave the launch of ``stages`` with ``size`` ranks (empty
    where none were given: every batch unsalted)."""
    return SALTS.get(_key(path, size, stages), {})


def links_of(path, size, stages):
    """The bytes per directed link the network counted in the launch of ``stages`` with
    ``size`` ranks (read outside the ranks), or None where links are not observed."""
    return LINKS.get(_key(path, size, stages))


def stage_results(path, stages, stage):
    """Yield ``(size, per-rank results of stage)`` for 2 then 3 ranks."""
    path = Path(path)
    if not path.is_file():
        raise CheckFailure(no_file(path))
    for size in WORLD_SIZES:
        res = launch(path, size, stages)
        try:     # point-to-point messages are off-topic in zero2 and zero3 (the collectives
            # they count could be replaced by them), not in full_state_dict (any way of
            # gathering on rank 0 that gives the right state dict is right)
            verify_no_hidden([{"hidden": [e for name in stages for e in out["hidden"][name]
                                          if name != "state_dict" or "." in e[0]]}
                              for out in res], f"with {size} ranks",
                             "dist.all_gather_into_tensor / dist.reduce_scatter_tensor")
        except AssertionError as err:          # an integrity violation: no case of the contract
            raise CheckFailure(str(err)) from None
        for out in res:
            for name in stages:
                if "todo" in out[name]:
                    raise CheckFailure("not implemented yet: " +
                                       unwritten(out[name]["todo"], path))
        salts = salts_of(path, size, stages)
        yield size, [references.attach(stage, size, out[stage], salts) for out in res]


def padded(numel, size):
    return math.ceil(numel / size) * size


def kb(n):
    return f"{n / 1e3:.1f} kB"


def kinds(events):
    """(all-gathers, reduce-scatters, others) of recorded events, each as (name, numel)."""
    colls = [(e[1], e[2]) for e in events if e[0] == "coll"]
    return ([c for c in colls if c[0] in GATHERS], [c for c in colls if c[0] in SCATTERS],
            [c for c in colls if c[0] not in GATHERS + SCATTERS])
