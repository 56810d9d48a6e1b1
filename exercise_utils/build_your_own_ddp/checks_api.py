"""Parts of notebook 06's ``check_api``: ``init`` and the calls of ``DistributedOptimizer``.

:func:`verify_init` runs the student's ``init`` in simulated jobs (:mod:`.probes_init`, one lone
launch, kept per file content): torchrun's, MPICH's and Open MPI's variables at 1, 2 and 3
processes, no launcher at all (rank 0 of 1, the default rendezvous), ``backend=None`` on a
CPU machine (gloo) and with a simulated GPU (NCCL, ``cuda:<local rank>`` made current, two
hosts), a second call, and the ``timeout_s`` that must reach ``init_process_group``.
:func:`verify_main_init` checks what ``init`` returned in the check's real launches;
:func:`verify_log` the calls ``DistributedOptimizer`` made (the strategy once per step between
backward and the local step, a closure called once first, ``zero_grad``'s ``set_to_none``
passed on), :func:`verify_closure_loss` what ``step(closure)`` returned.

Used in 06_build_your_own_ddp (by :func:`.checks.check_api`).
"""
import hashlib
from pathlib import Path

from ..contract import CheckFailure, fail
from ..harness import run_ranks
from ..notebook_files import no_file
from . import probes_init
from . import reference as ref
from .probes_init import INIT_CASES, INIT_TIMEOUT, launcher_env

_CACHE = {}             # file digest -> the probe's reports

NAMES = {"torchrun": "torchrun", "mpich": "MPICH's mpiexec", "openmpi": "Open MPI's mpiexec"}


def verify_init(path, timeout):
    """Judge ``init`` under every simulated launcher (one lone launch, kept per file
    content); True when it passed, False when it still raises NotImplementedError."""
    path = Path(path)
    if not path.is_file():
        raise CheckFailure(no_file(path))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest not in _CACHE:
        [_CACHE[digest]] = run_ranks(path, probes_init.probe_init, 1, "none",
                                     {"cases": list(range(len(INIT_CASES)))}, timeout,
                                     what="init() under simulated launchers",
                                     case="init-torchrun")
    reports = _CACHE[digest]
    if any(report.get("error", "").startswith("NotImplementedError")
           for job in reports for report in job):
        return False
    for (case, launcher, size, per_node, opts), job in zip(INIT_CASES, reports):
        for rank, report in enumerate(job):
            _check_one(case, launcher, size, per_node, opts, rank, report)
    for (case, launcher, size, per_node, opts), job in zip(INIT_CASES, reports):
        for rank, report in enumerate(job):
            timeouts = [c["timeout"] for c in report["calls"]]
            if timeouts != [INIT_TIMEOUT] * len(timeouts):
                where = _where(launcher, size, per_node, opts)
                fail("init-timeout", f"init(timeout_s={INIT_TIMEOUT}) {where} called "
                     f"dist.init_process_group with timeout "
                     f"{timeouts} (seconds); pass timeout=datetime.timedelta(seconds=timeout_s)"
                     " (gloo's default is 30 minutes: a bug would hang that long)")
    return True


def _where(launcher, size, per_node, opts):
    hosts = size // per_node
    how = (f"under {NAMES[launcher]} with {size} process(es)" if launcher else
           "in a process started without any launcher (no launcher variables"
           + (", no MASTER_ADDR / MASTER_PORT: the defaults)" if opts.get("defaults") else ")"))
    if hosts > 1:
        how += f" on {hosts} hosts ({per_node} per host)"
    if opts.get("gpu"):
        how += " on a machine with GPUs (simulated)"
    backend = "backend left None" if "backend" in opts else "backend='gloo'"
    return f"{how}, {backend}"


def _check_one(case, launcher, size, per_node, opts, rank, report):
    env = launcher_env(launcher, rank, size, per_node)
    where = f"{_where(launcher, size, per_node, opts)}, on rank {rank} ({env or 'no variables'})"
    if "error" in report:
        taken = "EADDRINUSE" in report["error"] or "address already in use" in report["error"]
        fail(case, f"init() {where} raised {report['error'][:600]}" + (
            ": two processes believed they were rank 0 (both listened on MASTER_PORT): read "
            "the rank and world size from the launcher's variables" if taken else ""))
    local = rank % per_node
    device = f"cuda:{local}" if opts.get("gpu") else "cpu"
    returned, group = report["returned"], report["group"]
    if returned[:2] != [rank, size] or not group or group[:2] != [rank, size]:
        joined = f"a group as rank {group[0]} of {group[1]}" if group else "no process group"
        fail(case, f"init() {where} returned (rank, world_size) = {tuple(returned[:2])} and "
                   f"joined {joined}; expected rank {rank} of {size}: read them from the "
                   "launcher's variables (torchrun: RANK, WORLD_SIZE; MPICH: PMI_RANK, "
                   "PMI_SIZE; Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE; none: rank 0 "
                   "of 1) and "
                   "initialise the default process group")
    requested = [c["backend"] for c in report["calls"]]
    want = "nccl" if opts.get("gpu") else "gloo"
    if "backend" in opts and (not requested or want not in requested[-1].lower()):
        fail(case, f"init() {where} asked init_process_group for backend {requested}; expected "
                   f"{want}: with backend None, NCCL when CUDA is available, else gloo")
    if returned[2] != device:
        fail(case, f"init() {where} returned the device {returned[2]!r}; expected {device!r}: "
                   "cuda:<local rank> with NCCL (the local rank, not the global one: "
                   "LOCAL_RANK, MPI_LOCALRANKID, OMPI_COMM_WORLD_LOCAL_RANK), cpu with gloo")
    if opts.get("gpu") and not any(d in (str(local), device) for d in report["set_device"]):
        fail(case, f"init() {where} called torch.cuda.set_device with {report['set_device']}; "
                   f"expected {device}: make cuda:<local rank> the current CUDA device")
    if opts.get("twice") and (report.get("again") != returned
                              or report.get("group_again") != group):
        fail(case, f"init() called twice {where}: the second call returned "
                   f"{report.get('again')}, the first {returned}: when the process group is "
                   "already initialised, do not initialise it again; return the same")


def verify_main_init(res, size, where):
    """What init(backend='gloo') returned in the check's own launch of ``size`` ranks."""
    case = "init-mpiexec" if "mpiexec" in where else "init-torchrun"
    for rank, out in enumerate(res):
        init = out["init"]
        want = [rank, size, "cpu"]
        if init["returned"] != want or not init["initialized"] or init["group"] != want[:2]:
            fail(case, f"rank {rank} of {size} ({where}): init(backend='gloo') returned "
                       f"{tuple(init['returned'])}, process group initialised: "
                       f"{init['initialized']} (rank, size {init['group']}); expected "
                       f"{tuple(want)} and an initialised gloo group: read the rank and size "
                       "from the launcher's variables")


# ---------------------------------------------------------------- DistributedOptimizer
def _expected_log(strategy, how, n):
    kind = strategy if isinstance(strategy, str) else "callable"
    reduce = [f"{kind} of {n} gradients", "optimizer.step"]
    zero = "optimizer.zero_grad(set_to_none=True)"
    if how == "closure":
        return lambda step: ["closure", zero, "backward"] + reduce
    if how == "zero_grad":
        return lambda step: [zero.replace("True", str(step == 1)),
                             f"then {n if step == 2 else 0} gradients, all zero: True",
                             "backward"] + reduce
    return lambda step: [zero, "backward"] + reduce


def verify_log(runs, case, strategy, how):
    n = len(ref.grad_params("edge"))
    want = _expected_log(strategy, how, n)
    call = {"closure": "dopt.step(closure)", "zero_grad": "dopt.zero_grad(set_to_none=False), "
            "then dopt.zero_grad(), then dopt.zero_grad(set_to_none=False), each followed by "
            "backward and dopt.step()"}.get(how, "dopt.zero_grad(); loss.backward(); "
                                                 "dopt.step()")
    for rank, run in enumerate(runs):
        expected = [line for step in range(len(run["batches"])) for line in want(step)]
        if run["log"] != expected:
            first = next(i for i, (a, b) in enumerate(zip(run["log"] + [None] * len(expected),
                                                          expected + [None] * len(run["log"])))
                         if a != b)
            fail(case, f"rank {rank}: with DistributedOptimizer(opt, model, strategy="
                 f"{strategy!r}) and the loop {call}, the calls were {run['log'][:first + 2]}"
                 f"...; expected {expected[:first + 2]}...: step() calls the strategy once on "
                 f"the model's parameters, then optimizer.step() (a closure is called first, "
                 f"once); zero_grad(set_to_none=...) passes through to the optimizer, "
                 f"set_to_none (default True) included")


def verify_closure_loss(run, rank):
    for step, (returned, computed) in enumerate(run["losses"]):
        if returned != computed:
            fail("dopt-closure", f"rank {rank}: in step {step} DistributedOptimizer.step(closure)"
                 f" returned {returned!r}; expected the closure's loss {computed!r} (as "
                 f"torch.optim's step(closure) returns it)")
