"""Helpers, launchers and checkers of the course Distributed Training from Scratch.

Modules (flat, one topic each): ``config`` (quick mode), ``data`` (datasets),
``models`` (networks), ``launch`` and ``launch_many`` (run distributed programs safely),
``harness`` and ``rankworker`` (checker harness), ``bench`` (timing and plots), and per
notebook:
01 ``checks_mpi``, ``mpi_sgd``, ``mpi_experiments``, ``bench_mpi``;
02 ``checks_sampler``, ``checks_hogwild``, ``hogwild``, ``hogwild_experiments``;
03 ``checks_ring``, ``bench_ring``, ``checks_dist``, ``checks_syncbn``, ``dist_train``,
``dist_experiments``, ``dist_demos``;
04 ``cifar_tricks`` (the trainer's parts), ``cifar_dp`` (settings and launcher),
``checks_cifar``, ``cifar_experiments``;
05 ``ddp_run`` (settings, fault injection, main), ``checks_ddp``, ``multinode``,
``ddp_hello``, ``lr_scaling``, ``ddp_join``;
06 ``checks_myddp`` and ``myddp_probe`` (the checkers and what runs in the ranks),
``ddp_bench``;
07 ``checks_zero`` and ``zero_probe``, ``zero_bench``;
08 ``checks_powersgd`` and ``powersgd_probe``, ``powersgd_experiment``, ``powersgd_paper``.
"""
from .config import QUICK, quick

__all__ = ["QUICK", "quick"]
__version__ = "0.1.0"
