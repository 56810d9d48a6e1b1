"""Helpers, launchers and checkers of the course Distributed Training from Scratch.

The shared core, which every notebook uses:
``config`` (quick mode), ``data`` (datasets), ``models`` (the course's networks),
``launch`` and ``launch_many`` (run distributed programs with live output and a hard timeout;
``outcomes``: how a launch ended; ``ports``: free ports; ``commands``: the command lines it runs),
``processes`` (find and stop everything a launch started), ``harness`` and ``rankworker``
(run a checker's probe against a student file in fresh processes), ``sessions`` (a check's
session, its zygote and the ``@check`` decorator), ``hostlaunch`` (a check's launch on hosts of
its own, bytes read on the wire), ``reports`` (what the ranks report, read by the judge),
``stops`` (why a launch was stopped: hangs, limits, time), ``compare`` (the judge's
comparisons and likely causes), ``zygote`` (MPI ranks
forked from one process that imported torch once; ``forking``: what such a child needs), ``contract`` (each exercise's clauses and
the check case that holds each; a check's verdict), ``heartbeat`` (tell a
hang from a slow machine), ``integrity`` (signed results, guarded checker code), ``pgwatch`` (collectives that bypass
``torch.distributed``'s functions), ``bench`` (timing,
tables, JSON and plots), ``notebook_files`` (the ``%%writefile`` files of a notebook),
``linebuf`` (line-buffered MPI ranks), ``cluster`` (hosts in network namespaces with
shaped links, on one machine) with ``netns`` (the namespaces; those a dead owner left, removed)
and ``links`` (link rates, shaping, byte counters), ``hosts`` (at grading, each rank of a check
on a host of its own) with ``hostranks`` (the launcher that asks each host's zygote for its
rank), ``hostsweep`` (what a check left on the hosts, removed) and ``hostlimits`` (the hosts'
cgroups), ``sandbox`` (student code in bubblewrap at grading) with ``sides`` (which modules
ranks may import, which are the judge's and hidden) and
``display`` (what a student sees of a check: one line, or a short box), ``progress`` (what
a student sees while something runs: a check's line, a launch's bars) and ``tries`` (the try
cells after each part of an exercise: the part run on 2 ranks, what it computed printed).

One package per notebook, named after the notebook's stem without ``NN_`` (each package's
docstring lists its modules): ``mpi_parallel_sgd`` (01), ``shared_memory_hogwild`` (02),
``torch_distributed_collectives`` (03), ``resnet_cifar_data_parallel`` (04),
``ddp_torchrun_fault_tolerance`` (05), ``build_your_own_ddp`` (06), ``bonus_zero_sharding``
(07), ``bonus_powersgd`` (08). A notebook's CHECK cells import from its package's ``checks``
(or ``checks_<exercise>``), e.g. ``from exercise_utils.build_your_own_ddp.checks import
check_api``. A topic package imports the core and its own modules, never another topic's.
"""
from .config import QUICK, quick
from .display import install as _install_display
from .sandbox import private_tmpdir as _private_tmpdir

_private_tmpdir()   # at grading only: this kernel's temporary folder, the one its sandboxes see
_install_display()  # in a notebook: a failed check is a short box, not the checker's traceback

__all__ = ["QUICK", "quick"]
__version__ = "0.1.0"
