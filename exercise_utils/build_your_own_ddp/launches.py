"""The launches shared by notebook 06's checkers: every stage probed in one launch per world
size, kept per file content.

2 ranks started like torchrun starts them (``RANK``, ``WORLD_SIZE``) and 3 ranks under
``mpiexec`` (``PMI_RANK``, ``PMI_SIZE``) run :func:`.probes.probe`; the five checks of an
unchanged file cost two launches. When a launch fails (a crash or a hang), the stage it was in
keeps that error and the other stages run again without it, so one broken stage costs only its
own points. Communication that bypassed the recorded ``torch.distributed`` functions
(:mod:`.recorder`) fails the stage it happened in: a collective below them as an integrity
violation. Where links are observed (at grading) each stage runs in launches of its own, rank
r on host r of a mesh (under ``mpiexec`` the probe tells the ranks host 0's name for the
rendezvous), and the bytes on its links are held to what the stage asks for (:mod:`.wire`).
Every failure is a :class:`~exercise_utils.contract.CheckFailure` charged to a case
of the contract (:mod:`.requirements`): the case the ranks were running (``ctx.case``).

Used in 06_build_your_own_ddp (by :mod:`.checks` and :mod:`.checks_overlap`).
"""
import hashlib
import re
import tempfile
from pathlib import Path

from ..contract import CheckFailure
from ..notebook_files import no_file, unwritten
from ..harness import HANG_AFTER, observing, run_ranks, salting
from .. import recorder
from . import probes
from . import reference as ref
from . import wire

TIMEOUT = HANG_AFTER     # seconds without progress before a launch is a hang (harness)


GLOO_TIMEOUT = 20            # seconds a collective waits before gloo raises
MASTER = "h0"                # on a mesh's hosts: host 0's name, which every host resolves


WORLDS = ((2, "none", "torchrun-style environment: RANK, WORLD_SIZE"),
          (3, "mpi", "mpiexec: PMI_RANK, PMI_SIZE"))


_CACHE = {}                  # (file digest, world size, salted, observed) -> launch outcome


def stage_results(path, stage, timeout):
    """Yield ``(size, where, per-rank results of stage)`` for 2 then 3 ranks. Where links are
    observed (:func:`~exercise_utils.harness.observing`) the stage runs in a launch of its own
    and, once the caller has checked what the ranks reported, the bytes on its links are held
    to what the stage asks for (:func:`.wire.judge`), unless a piece of it is not written yet
    (``"unwritten"``: the check then fails naming it)."""
    path = Path(path)
    if not path.is_file():
        raise CheckFailure(no_file(path))
    digest, failed, observed = hashlib.sha256(path.read_bytes()).hexdigest(), set(), observing()
    for size, backend, where in WORLDS:
        entry = _CACHE.setdefault((digest, size, salting(), observed),
                                  {"results": {}, "errors": {}, "links": {}})
        while stage not in entry["results"]:
            if stage in entry["errors"]:
                message, case = entry["errors"][stage]
                if " hung: " in message:     # maybe a busy machine: try again next time
                    del entry["errors"][stage]
                raise CheckFailure(message, case)
            todo = [stage] if observed else [
                s for s in probes.STAGES if s not in entry["results"] and s not in
                entry["errors"] and (s == stage or s not in failed)]
            results, errors, links = _launch(path, size, backend, todo, stage, timeout)
            entry["results"].update(results)
            entry["errors"].update(errors)
            entry["links"].update({s: links for s in results})
        failed |= set(entry["errors"])       # a stage that failed with 2 ranks: not again
        try:
            recorder.verify_no_hidden(entry["results"][stage], f"in stage '{stage}'",
                                      "dist.all_reduce / dist.broadcast")
        except AssertionError as err:
            raise CheckFailure(str(err), HIDDEN_CASE[stage]) from None
        yield size, where, entry["results"][stage]
        if not any(out.get("unwritten") for out in entry["results"][stage]):
            # (a piece not written yet sent nothing: its check fails on it, by name, anyway)
            wire.judge(entry["links"].get(stage), stage, size, backend)


def _launch(path, size, backend, stages, wanted, timeout):
    """One launch probing ``stages``: ({stage: per-rank results}, {}, {link: bytes}) or, when
    it failed, ({}, {the stage that failed: message}, {}) so that the other stages run again
    without it. The links' bytes: where they were observed (else empty)."""
    with tempfile.TemporaryDirectory(prefix="dtfs-myddp-") as progress:
        salts, links = {}, {}    # (at grading each rank's batches derive from its own number)
        try:
            res = run_ranks(path, probes.probe, size, backend,
                            dict(stages=stages, progress=progress,
                                 gloo_timeout=min(GLOO_TIMEOUT, timeout / 2),
                                 master=MASTER if observing() else None), timeout,
                            what=f"06_myddp.py with {size} ranks", salts=salts, links=links)
            mark_salts(res, salts)
        except CheckFailure as err:
            where, note = _where_failed(progress, str(err), size, err.case)
            failed = where.split(":")[0] if where.split(":")[0] in stages else wanted
            case = err.case if stage_of(err.case) == failed else probes.FIRST_CASE[failed]
            return {}, {failed: (f"{err}{note}{_context(where)}", case)}, {}
    return {s: [r[s] for r in res] for s in stages}, {}, links


def mark_salts(value, salts):
    """Put ``salts`` (the judge's) in every run of the ranks' results (a dict with an "init"),
    replacing whatever a rank put there: :func:`.references.reference` reads them."""
    if isinstance(value, dict):
        if "init" in value:
            value["salts"] = dict(salts)
        for item in value.values():
            mark_salts(item, salts)
    elif isinstance(value, (list, tuple)):
        for item in value:
            mark_salts(item, salts)


HIDDEN_CASE = {"api": "bcast-values", "naive": "naive-calls", "flat": "flat-one-buffer",
               "overlap": "overlap-calls", "buckets": "buckets-calls"}


def stage_of(case):
    """The stage whose probe runs ``case`` (the cases of the API: init, bcast, partition,
    dopt)."""
    prefix = (case or "").split("-")[0]
    return "api" if prefix in ("init", "bcast", "partition", "dopt") else prefix


def _where_failed(folder, message, size, case=None):
    """Where the launch failed: the stage of the rank that raised, unless its error is a
    consequence of another rank's (a lost connection, a timeout, a hang): then the
    earliest stage any rank was in, where the ranks' collectives began to differ. Where the
    ranks could not note their stages (on hosts: each rank its own /tmp), the stage of the
    failing ``case``."""
    files = {r: Path(folder) / f"rank{r}" for r in range(size)}
    done = {r: f.read_text() for r, f in files.items() if f.exists()}
    if not done:
        return (stage_of(case) if stage_of(case) in probes.STAGES else "api"), ""
    match = re.match(r"rank (\d+) raised", message)
    if match and int(match.group(1)) in done and not re.search(
            r"Connection (reset|closed)|[Tt]imed out|Broken pipe|hung: ", message):
        return done[int(match.group(1))], ""
    order = [s.split(":")[0] for s in done.values() if s.split(":")[0] in probes.STAGES]
    where = min(order, key=probes.STAGES.index) if order else "api"
    return where, (f"\nRanks issued different collectives? When this happened the ranks were "
                   f"in stages {[done.get(r, '?') for r in range(size)]} (rank 0, 1, ...): "
                   "every rank must make the same collective calls, in the same order")


def _context(where):
    if where.startswith("buckets"):
        cap = ref.BUCKET_CAPS["buckets-values"]
        return (f"\n(while checking BucketDDP(EdgeNet(), bucket_cap_mb={cap} / 2**20), a "
                f"{cap}-byte cap among others: its out.weight and proj have 256 bytes each; a "
                "parameter larger than the cap must get a bucket of its own)")
    if where in ("naive", "flat"):
        return (f"\n(while checking allreduce_{where}: among the parameters it is given are "
                "some without a gradient, frozen ones and ones unused in this backward "
                "(requires_grad True, grad None): skip every parameter whose grad is None; "
                "one is stored transposed, one is 0-d)")
    return f"\n(while checking stage '{where.split(':')[0]}' of your file)"


def raise_if_todo(res, path):
    for out in res:
        todo = (out.get("init") or {}).get("todo") or out.get("todo")
        if todo:
            raise CheckFailure("not implemented yet: " + unwritten(todo, path))
