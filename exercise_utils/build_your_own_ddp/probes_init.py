"""What runs inside the lone process that probes notebook 06's ``init`` under every launcher.

:func:`probe_init` runs in one process (``run_ranks(..., 1, "none")``) and, for each case of
:data:`INIT_CASES`, forks the processes of a simulated job: each child clears every launcher
variable, sets those a launcher would set (torchrun, MPICH's or Open MPI's ``mpiexec``, or
none at all), calls the student's ``init`` and reports what it returned, the process group it
joined and the arguments that reached ``dist.init_process_group`` (a recording wrapper), then
leaves. With ``gpu`` the child pretends to have CUDA (``torch.cuda.is_available`` true, eight
devices, ``set_device`` recorded) and a backend of NCCL becomes gloo below the wrapper, so the
choice of backend and device shows on a CPU machine; a child that leaves the backend to ``init``
without ``gpu`` pretends to have no CUDA, so that a GPU machine checks it as a CPU one. The children of one case share a fresh
``MASTER_PORT``; the case without any variable uses the documented defaults when port 29500 is
free (one such case at a time on the machine: a file lock).

Used in 06_build_your_own_ddp (by :func:`.checks.check_api`).
"""
import contextlib
import datetime
import fcntl
import inspect
import json
import os
import select
import signal
import socket
import time

import torch
import torch.distributed as dist

INIT_TIMEOUT = 17        # seconds: the timeout_s every child passes to init
CHILD_LIMIT = 120        # seconds a case's children may take before they are killed
DEFAULT_PORT = 29500

# (case, launcher, world size, processes per node, options)
INIT_CASES = [
    ("init-torchrun", "torchrun", 1, 1, {}), ("init-torchrun", "torchrun", 2, 2, {}),
    ("init-torchrun", "torchrun", 3, 3, {}),
    ("init-mpiexec", "mpich", 1, 1, {}), ("init-mpiexec", "mpich", 2, 2, {}),
    ("init-mpiexec", "mpich", 3, 3, {}),
    ("init-openmpi", "openmpi", 2, 2, {}), ("init-openmpi", "openmpi", 3, 3, {}),
    ("init-no-launcher", None, 1, 1, {"defaults": True}),
    ("init-backend-default", "torchrun", 2, 2, {"backend": None}),
    ("init-gpu-device", "torchrun", 4, 2, {"backend": None, "gpu": True}),
    ("init-gpu-device", "mpich", 3, 2, {"backend": None, "gpu": True}),
    ("init-twice", "mpich", 2, 2, {"twice": True}),
]


def launcher_env(launcher, rank, size, per_node):
    """The variables ``launcher`` sets for ``rank`` of ``size`` (``per_node`` per host)."""
    local, nodes = rank % per_node, f"{per_node}"
    env = {"torchrun": {"RANK": rank, "WORLD_SIZE": size, "LOCAL_RANK": local,
                        "LOCAL_WORLD_SIZE": nodes, "GROUP_RANK": rank // per_node,
                        "ROLE_RANK": rank, "ROLE_WORLD_SIZE": size,
                        "TORCHELASTIC_RUN_ID": "dtfs"},
           "mpich": {"PMI_RANK": rank, "PMI_SIZE": size, "MPI_LOCALRANKID": local,
                     "MPI_LOCALNRANKS": nodes},
           "openmpi": {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": size,
                       "OMPI_COMM_WORLD_LOCAL_RANK": local,
                       "OMPI_COMM_WORLD_LOCAL_SIZE": nodes}}.get(launcher, {})
    return {k: str(v) for k, v in env.items()}


VARIABLES = sorted({k for name in ("torchrun", "mpich", "openmpi")
                    for k in launcher_env(name, 0, 1, 1)} | {"MASTER_ADDR", "MASTER_PORT"})


def probe_init(student, ctx, cases):
    """For each of ``cases`` (indices into :data:`INIT_CASES`): per rank, what init did."""
    from ..launch import free_port
    out = []
    for index in cases:
        case, launcher, size, per_node, opts = INIT_CASES[index]
        ctx.case(case)
        with _rendezvous(opts, free_port) as rendezvous:
            out.append(_job(student, launcher, size, per_node, opts, rendezvous))
    return out


@contextlib.contextmanager
def _rendezvous(opts, free_port):
    """MASTER_ADDR / MASTER_PORT for a case: a fresh port, or none at all (the defaults) while
    this process holds the machine's lock on port 29500 and the port is free."""
    if not opts.get("defaults"):
        yield {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        return
    with open("/tmp/dtfs-06-port-29500.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with socket.socket() as s:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", DEFAULT_PORT))
                free = True
            except OSError:
                free = False
        yield {} if free else {"MASTER_PORT": str(free_port())}


def _job(student, launcher, size, per_node, opts, rendezvous):
    """Fork ``size`` children as ``launcher`` would start them; collect their reports."""
    children = {}
    for rank in range(size):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            env = {**launcher_env(launcher, rank, size, per_node), **rendezvous}
            _child(student, env, opts, write)
        os.close(write)
        children[rank] = (pid, read)
    reports, deadline = {}, time.time() + CHILD_LIMIT
    for rank, (pid, read) in children.items():
        data = b""
        while time.time() < deadline:
            ready, _, _ = select.select([read], [], [], 0.1)
            if ready:
                chunk = os.read(read, 65536)
                if not chunk:
                    break
                data += chunk
        os.close(read)
        with contextlib.suppress(ProcessLookupError):
            if time.time() >= deadline:
                os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        reports[rank] = json.loads(data) if data else {
            "error": f"no report after {CHILD_LIMIT} s: init() hung (waiting for ranks that "
                     "never joined?)"}
    return [reports[r] for r in range(size)]


def _child(student, env, opts, write):
    """One process of the simulated job: never returns."""
    code = 0
    try:
        for key in VARIABLES:
            os.environ.pop(key, None)
        os.environ.update(env)
        report = {}
        _patch(student, report, opts.get("gpu"), "backend" in opts)
        kwargs = {"timeout_s": INIT_TIMEOUT}
        if "backend" not in opts:
            kwargs["backend"] = "gloo"
        try:
            report["returned"] = _returned(student.init(**kwargs))
            report["group"] = _group()
            if opts.get("twice"):
                report["again"] = _returned(student.init(**kwargs))
                report["group_again"] = _group()
            if dist.is_initialized():         # no process leaves before all have joined
                _ORIGINAL["barrier"]()
        except Exception as exc:  # noqa: BLE001 - reported to the checker
            report["error"] = f"{type(exc).__name__}: {exc}"
        os.write(write, json.dumps(report, default=repr).encode())
    except BaseException:  # noqa: BLE001 - the child must never return into the probe
        code = 1
    finally:
        os._exit(code)


_ORIGINAL = {"init_process_group": dist.init_process_group, "barrier": dist.barrier}


def _returned(value):
    rank, size, device = value
    return [int(rank), int(size), str(device)]


def _group():
    if not dist.is_initialized():
        return None
    return [dist.get_rank(), dist.get_world_size(), dist.get_backend()]


def _patch(student, report, gpu, default_backend):
    """Record what reaches init_process_group; with ``gpu``, pretend to have CUDA; without it,
    when the backend is left to ``init``, pretend to have none (a GPU machine runs the check
    as a CPU one)."""
    original = _ORIGINAL["init_process_group"]
    signature = inspect.signature(original)
    report["calls"], report["set_device"] = [], []

    def init_process_group(*args, **kwargs):
        bound = signature.bind_partial(*args, **kwargs).arguments
        timeout = bound.get("timeout")
        report["calls"].append({
            "backend": str(bound.get("backend")),
            "timeout": timeout.total_seconds() if isinstance(timeout, datetime.timedelta)
            else timeout})
        if gpu and "nccl" in str(bound.get("backend", "")):
            kwargs = {**bound, "backend": "gloo"}
            kwargs.pop("device_id", None)
            return original(**kwargs)
        return original(*args, **kwargs)
    for module in (dist, student):
        for key, value in list(vars(module).items()):
            if value is original:
                setattr(module, key, init_process_group)
    if default_backend and not gpu:
        torch.cuda.is_available = lambda: False
        torch.cuda.device_count = lambda: 0
    if gpu:
        torch.cuda.is_available = lambda: True
        torch.cuda.device_count = lambda: 8
        torch.cuda.set_device = lambda device: report["set_device"].append(str(device))
        torch.cuda.current_device = lambda: 0
