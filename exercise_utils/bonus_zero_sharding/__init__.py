"""Notebook 07 (bonus), ZeRO stage 1: the ZeRO paper's memory model and a ``ShardedOptimizer``
that keeps optimizer state only for its rank's share of the parameters.

Modules:

* ``checks``: ``check_memory``, ``check_sharded`` and ``check_checkpoint``;
* ``probes``: what runs inside the ranks those checks start;
* ``bench``: optimizer state and memory per rank against AdamW and ``ZeroRedundancyOptimizer``.
"""
