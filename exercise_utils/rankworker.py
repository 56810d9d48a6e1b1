"""Worker process of the checker harness (see :mod:`exercise_utils.harness`).

One rank: beat (:mod:`.heartbeat`), take its secret and fingerprint the checker's code
(:mod:`.integrity`), set up communication (MPI, gloo or none), import the student file, call
the probe, and write the result (or the error) as plain data (:mod:`.plaindata`: JSON and
numeric arrays, never a pickle), signed, to ``OUT/rank{R}.report``. ``OUT`` is the rank's own
folder (``{rank}`` in ``--out`` reads as the rank: each rank of a launch has its own; at
grading no other rank's sandbox shows it, :mod:`exercise_utils.hosts`).
With ``--spawn N`` it starts N such ranks itself (gloo / none; forked once torch is imported)
and stops all of them as soon as one fails, so that a crashed rank never leaves the others
waiting.

Launched by the harness, e.g.::

    python -P -m exercise_utils.rankworker --spawn 2 --backend gloo --student work/x.py \
        --probe exercise_utils.mpi_parallel_sgd.probes:probe_sgd --kwargs k.pkl \
        --out '/tmp/dir/r{rank}'

Used by every checker (01_mpi_parallel_sgd onwards).
"""
import argparse
import contextlib
import datetime
import gc
import importlib
import importlib.util
import os
import pickle
import signal
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

from . import heartbeat, integrity, limits, plaindata, spawn_template


def load_student(path):
    """Import the student file at ``path`` as a fresh module and return it."""
    name = "student_" + Path(path).stem.replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def gloo_group(timeout_s, threads=None):
    """Inside a torchrun worker: join the job's gloo group (``env://``) for the block.

    Yields ``(rank, world_size)``. A block that ends normally waits for every rank (barrier);
    either way the garbage collector then frees what still holds the group (DDP models and
    autograd graphs in reference cycles: freed only at interpreter exit, their gloo threads can
    abort the process with SIGABRT, seen in CI) before the group is destroyed.

    Args:
        timeout_s: seconds a collective waits before gloo raises (a missing peer fails fast).
        threads: torch threads of this worker (None: leave as is).
    """
    import torch
    import torch.distributed as dist
    if threads:
        torch.set_num_threads(threads)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    try:
        yield dist.get_rank(), dist.get_world_size()
        dist.barrier()
    finally:
        gc.collect()
        dist.destroy_process_group()


def not_implemented(student, exc):
    """``{"todo": function}`` for a ``NotImplementedError`` raised in the student's file:
    the function (qualified name, e.g. ``Trainer.save_snapshot``) that still raises it.

    Probes that run several graded stages in one launch return this for a stage whose code
    is not written yet, so the other stages are still checked.
    """
    frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)
              if frame.f_code.co_filename == student.__file__]
    code = frames[-1].f_code if frames else None
    return {"todo": getattr(code, "co_qualname", code.co_name) if code else "your code"}


def _student_frames(exc, student):
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if f.filename == student]
    where = mine[-1].name if mine else "your code"
    shown = mine or frames[-3:]
    text = "".join(traceback.format_list(shown)) + f"{type(exc).__name__}: {exc}"
    return where, text


def probe_idle(student, ctx):
    """A probe that does nothing: the run the bytes on a mesh's links are calibrated on (a
    group set up and taken down; ``tests/test_wire.py``)."""
    return ctx.rank


def _report(out, rank, payload, secret):
    """Write ``payload`` as plain data, signed; a value that is not plain data (an object the
    probe passed on from the student's code) becomes an error report that says so."""
    try:
        blob = plaindata.dumps(payload)
    except plaindata.PlainDataError as exc:
        blob = plaindata.dumps({
            "ok": False, "type": "TypeError", "where": "your code", "time": time.time(),
            "message": f"the check cannot report what your code gave back: {exc}",
            "traceback": "", "case": payload.get("case"),
            "tampered": payload.get("tampered", [])})
    tmp = Path(out) / f".rank{rank}.tmp"
    tmp.write_bytes(integrity.sign(secret, blob))
    tmp.rename(Path(out) / f"rank{rank}.report")


def _rank():
    """This rank, before any communication is set up (torch's RANK, else MPICH's PMI_RANK)."""
    return int(os.environ.get("RANK", os.environ.get("PMI_RANK", 0)))


class Context(SimpleNamespace):
    """What a probe gets beside the student module: ``rank``, ``size``, ``backend``, ``comm``
    (MPI), ``salt`` (see :func:`_salt`), and :meth:`case`."""

    def __init__(self, phase, **kwargs):
        super().__init__(**kwargs)
        self._phase, self.current = phase, None

    def case(self, name, detail=None):
        """Say which check case runs from now on: an error or a hang in the student's code is
        charged to it (:class:`exercise_utils.contract.CheckFailure`'s ``case``); ``detail``:
        which run of it (its settings, e.g. ``"1F1B, m = 2, float64"``), named in a hang's
        first line."""
        self.current = self._phase.case = name
        self._phase.detail = detail


def _context(args, rank, phase):
    size = int(os.environ.get("WORLD_SIZE", os.environ.get("PMI_SIZE", 1)))
    ctx = Context(phase, rank=rank, size=size, backend=args.backend, comm=None,
                  salt=_salt(args.out, float(args.timeout)))
    if args.backend == "mpi":
        from mpi4py import MPI
        ctx.comm = MPI.COMM_WORLD
        ctx.rank, ctx.size = ctx.comm.Get_rank(), ctx.comm.Get_size()
    elif args.backend == "gloo":
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=float(args.timeout)))
    return ctx


def own_folder(out, rank):
    """The folder of rank ``rank``: ``out`` with ``{rank}`` read as the rank."""
    return str(out).replace("{rank}", str(rank))


def _salt(out, timeout):
    """A number only this rank knows, else 0 (:func:`exercise_utils.harness.run_ranks`'s
    ``salts``): its folder's ``salt``, read and deleted. Where the ranks of a launch share one
    sandbox (their folders ``.../r<rank>`` side by side), this then waits (up to ``timeout``
    seconds) until every rank has taken its own, so that no student code runs while another
    rank's file is there; where each rank has a sandbox of its own (at grading) no other rank
    could read it anyway. Probes mix it into this rank's inputs, which the other ranks then
    cannot rebuild."""
    path = Path(out) / "salt"
    try:
        salt = int(path.read_text())
    except FileNotFoundError:
        return 0
    path.unlink()
    end = time.monotonic() + timeout
    while list(Path(out).parent.glob("r*/salt")) and time.monotonic() < end:
        time.sleep(0.01)
    return salt


def salted_generator(seed, salt=0):
    """A ``torch.Generator`` for inputs a probe derives from ``seed`` and a rank's ``salt``
    (``ctx.salt``, :func:`_salt`): with salt 0 the seed alone (every rank can rebuild every
    rank's inputs); with a rank's salt a seed only that rank and the judge can compute."""
    import torch
    return torch.Generator().manual_seed((seed + 1_000_003 * salt) % (1 << 63))


def _warm_up():
    """Build an optimizer before the student's code starts: the first one imports
    ``torch._dynamo`` (seconds, more on a busy machine), which would otherwise land between
    two collectives of a group with a short timeout (``--warm-up``, notebook 04)."""
    import torch
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


def _finish(ctx):
    if ctx.backend == "gloo":
        import torch.distributed as dist
        gc.collect()    # objects holding the group freed at exit can abort gloo ("terminate called")
        dist.barrier()
        dist.destroy_process_group()


def run_one(args):
    """Run the probe on this rank; report the result or the error; return an exit code.

    Before the student file is imported: the heartbeat starts (:mod:`.heartbeat`), the rank
    takes its secret, and the checker's code is fingerprinted (:mod:`.integrity`).
    """
    rank = _rank()
    args.out = own_folder(args.out, rank)
    limits.apply_in_rank()      # at grading: memory, file size, CPU (before any fork)
    template = _spawn_template(args.probe)
    phase = heartbeat.start(args.out, rank, student=args.student)
    try:
        return _run_probe(args, rank, phase)
    finally:
        phase.stop()
        if template:
            spawn_template.stop()


def _spawn_template(probe):
    """For a probe that asks for it, the template its ``spawn`` workers are forked from
    (:mod:`.spawn_template`), forked now: before the heartbeat, the secret, any process group
    or the student's code."""
    module_name, func_name = probe.split(":")
    try:
        wanted = spawn_template.wanted(getattr(importlib.import_module(module_name), func_name))
    except (ImportError, AttributeError):      # reported where the probe is looked up
        return False
    return wanted and spawn_template.start()


def _run_probe(args, rank, phase):
    secret = integrity.take_secret(args.out)
    if secret is None:
        print(f"rank {rank}: no secret for this run in {args.out}", file=sys.stderr)
        return 3
    phase("init")
    ctx = _context(args, rank, phase)
    _share_threads(ctx.size)
    phase("start")
    if args.warm_up:
        _warm_up()
    module_name, func_name = args.probe.split(":")
    probe = getattr(importlib.import_module(module_name), func_name)
    kwargs = pickle.loads(Path(args.kwargs).read_bytes())
    guard = integrity.Guard()
    phase("import")
    try:
        student = load_student(args.student)
        phase("probe")
        value = probe(student, ctx, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - everything a student file can do
        where, text = _student_frames(exc, args.student)
        notes = [str(n) for n in getattr(exc, "__notes__", None) or ()]   # (a probe's: where)
        _report(args.out, ctx.rank, {"ok": False, "type": type(exc).__name__,
                                     "message": " ".join([str(exc), *notes]),
                                     "where": where, "traceback": text, "time": time.time(),
                                     "case": ctx.current, "tampered": guard.changed()}, secret)
        if ctx.backend == "mpi":
            ctx.comm.Abort(1)
        return 1
    _report(args.out, ctx.rank, {"ok": True, "value": value, "tampered": guard.changed(),
                                 "case": ctx.current}, secret)
    phase("exit")
    _finish(ctx)
    return 0


def _share_threads(size):
    """Give this rank its share of the cores for torch's threads, as a fresh interpreter reads
    it from ``OMP_NUM_THREADS`` (:func:`.launch.run` sets cores // ranks), else cores // size.

    A rank forked from a process that imported torch (a zygote, :func:`spawn`) keeps that
    process's setting instead, every core: 2 or 3 ranks on 2 cores then run 4 to 6 threads
    that spin while they wait for each other (a sample of the suite's checks, three at a
    time on 2 cores: 306 s of wall and 432 s of CPU, against 91 s and 78 s with a share
    each)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    from .launch import core_share
    given = os.environ.get("OMP_NUM_THREADS", "")
    threads = int(given) if given.isdigit() and int(given) > 0 else core_share(size)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def spawn(args, n):
    """Start ``n`` ranks of this worker; stop them all as soon as one fails.

    The ranks are forked from this process after it imported torch and the probe's module
    once: started afresh, every rank spends ~2 s of CPU importing torch (most of a check's
    cost on 2 cores). Nothing has run on torch before the fork (no threads of its own yet);
    each rank then beats, takes its secret and sets up its group as a launched one does.
    """
    _preload(args, torch=n > 1 or args.backend == "gloo")
    sys.stdout.flush()
    sys.stderr.flush()
    from .forking import freeze_for_fork
    freeze_for_fork()               # each rank's gc.collect() walks only its own objects
    pids = []
    for r in range(n):
        pid = os.fork()
        if pid == 0:                                    # the rank
            os.environ.update(RANK=str(r), WORLD_SIZE=str(n))
            code = 1
            try:
                code = run_one(args)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # noqa: BLE001 - report, then leave without cleanup
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids.append(pid)
    codes = {}
    while len(codes) < n:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            time.sleep(0.05)
            continue
        codes[pid] = os.waitstatus_to_exitcode(status)
        if codes[pid] != 0:
            break
    for pid in pids:
        if pid not in codes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            codes[pid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return max(abs(c) for c in codes.values())


def _preload(args, torch=True):
    """Import what every rank needs before the ranks fork: the probe's module, and torch with
    ``torch`` (a lone rank of a pure-function check imports only what its probe needs)."""
    import numpy  # noqa: F401
    if torch:
        import torch  # noqa: F401
        import torch.distributed  # noqa: F401
    importlib.import_module(args.probe.split(":")[0])


def main():
    from .sandbox import harden
    harden()        # at grading: unreadable to other sandboxes (other submissions' ranks)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for opt in ("--student", "--probe", "--kwargs", "--out"):
        parser.add_argument(opt, required=True)
    parser.add_argument("--backend", choices=["mpi", "gloo", "none"], default="none")
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--spawn", type=int, default=0)
    parser.add_argument("--warm-up", action="store_true", help="import torch._dynamo first")
    args = parser.parse_args()
    sys.exit(spawn(args, args.spawn) if args.spawn else run_one(args))


if __name__ == "__main__":
    main()
