"""The command lines a launch runs: executables found next to this Python (``mpiexec``), a
torchrun agent's command, and a one-node torchrun job whose agent and workers are forked from a
zygote of their own (:mod:`.zygote`).

Owns: :func:`find_executable`, :func:`agent_command`, :func:`forked`, :func:`builds_optimizer`,
:data:`ZYGOTE`, :data:`OPTIMIZER`, :data:`FRESH_STORE_ENV`. Called by :mod:`.launch` (which
re-exports them for its callers: ``launch.find_executable``, ...), :mod:`.sessions` and
:mod:`.cluster`.
"""
import os
import re
import shutil
import sys
from pathlib import Path


# Workers of a restarted attempt (--max-restarts) otherwise share the agent's store with the dead
# attempt's keys and can read a dead worker's address: measured on torch 2.14, 2 of 3 restarts
# failed or hung with the shared store, 0 of 3 with a fresh store each. Every torchrun agent gets it.
FRESH_STORE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def find_executable(name):
    """Find ``name`` next to this Python first (a venv's ``mpiexec``), then on PATH.

    Raises:
        FileNotFoundError: with instructions to install it.
    """
    here = os.path.dirname(sys.executable)
    found = shutil.which(name, path=here + os.pathsep + os.environ.get("PATH", ""))
    if found:
        return found
    hints = {"mpiexec": "pip install mpich mpi4py (or: conda install -c conda-forge mpich mpi4py); "
                        "it must be in the same environment as this Python (" + sys.executable + ")",
             "torchrun": "pip install torch in the environment of " + sys.executable}
    raise FileNotFoundError(f"{name} not found next to {sys.executable} nor on PATH. "
                            f"Install it: {hints.get(name, 'install it')}.")


def agent_command(script, nnodes, nproc_per_node, endpoint, rdzv_id, args=(), module=False,
                  max_restarts=0, python=None, extra=(), fork=False):
    """One torchrun agent's command (a list), as run on each node of the job.

    Args:
        script: the training script (or module name with ``module=True``).
        nnodes: number of nodes (agents) in the job.
        nproc_per_node: workers this agent starts.
        endpoint: ``HOST:PORT`` of the rendezvous (the same on every node).
        rdzv_id: job id, the same on every node (separates jobs sharing an endpoint).
        args: the script's arguments.
        module: run ``script`` as ``python -m script`` (torchrun's ``-m``).
        max_restarts: worker-group restarts before the agent gives up.
        python: interpreter (default: this one, i.e. ``python -m torch.distributed.run``,
            which is what the ``torchrun`` console script runs); ``"torchrun"`` writes
            ``torchrun`` instead.
        extra: more torchrun options (e.g. ``["--rdzv-conf=join_timeout=20"]``).
        fork: the agent and its workers forked from a zygote of their own (:func:`forked`;
            not with ``python``): what runs, not what a student would type.
    Returns:
        list[str].
    """
    options = [f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}",
               "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}",
               f"--max-restarts={max_restarts}", *map(str, extra)]
    if fork and python is None:
        return forked(options, module, script, args)
    head = (["torchrun"] if python == "torchrun"
            else [python or sys.executable, "-m", "torch.distributed.run"])
    return [*head, *options, *(["-m"] if module else []), str(script), *map(str, args)]


ZYGOTE = ["-P", "-m", "exercise_utils.zygote"]


# what every torchrun job's zygote imports once, before its agent and workers are forked
TORCHRUN_PRELOAD = ("numpy", "torch", "torch.distributed", "torch.distributed.run")


# imported by the first optimizer a process builds (~1.4 s of CPU): a zygote imports it once
# for its children where they will build one (:func:`builds_optimizer`), not where they never do
OPTIMIZER = "torch._dynamo"


_OPTIM = re.compile(r"\boptim\b|torch\.optim|\.optim\b")


def builds_optimizer(*paths):
    """Whether code in one of these files (a script, a student's file, a probe's module and
    its package's probes) mentions torch's optimizers, so that its processes will likely
    build one. Unreadable paths count as no."""
    for path in paths:
        try:
            if _OPTIM.search(Path(path).read_text(errors="replace")):
                return True
        except OSError:
            continue
    return False


def forked(options, module, script, args):
    """``python -m torch.distributed.run OPTIONS [-m] SCRIPT ARGS`` as one process that
    imports torch once (:data:`TORCHRUN_PRELOAD`) and forks the agent and every worker
    (:mod:`exercise_utils.zygote`: ``--socket auto --no-hold``); it listens on an abstract
    socket of its own network namespace (a job's sandbox, a host's: nothing on disk to leave
    behind when a timeout kills it) and its stubs find it in the environment."""
    source = script
    if module:
        import importlib.util
        try:
            source = importlib.util.find_spec(str(script)).origin
        except (ImportError, AttributeError, ValueError):
            source = None
    preload = [*TORCHRUN_PRELOAD, *([OPTIMIZER] if source and builds_optimizer(source) else [])]
    return [sys.executable, *ZYGOTE, "--socket", "auto", "--no-hold",
            *[a for name in preload for a in ("--preload", name)], "--",
            sys.executable, *ZYGOTE, "--stub", "auto", "--module", "torch.distributed.run",
            "--", *map(str, options), "--no-python",
            sys.executable, *ZYGOTE, "--stub", "auto", "--script",
            "module" if module else "path", "--", str(script), *map(str, args)]
