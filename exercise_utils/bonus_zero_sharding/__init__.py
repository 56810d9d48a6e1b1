"""Notebook 07 (bonus), ZeRO stage 1: the ZeRO paper's memory model and a ``ShardedOptimizer``
that keeps optimizer state only for its rank's share of the parameters.

Modules:

* ``checks``: ``check_memory`` and ``check_sharded`` (and the launches they share);
* ``checks_checkpoint``: ``check_checkpoint``;
* ``requirements``: each exercise's contract, clause by clause (quoted from the notebook),
  with the check cases that hold it;
* ``probes``: what runs inside the ranks those checks start;
* ``bench``: optimizer state and memory per rank against AdamW and ``ZeroRedundancyOptimizer``.
"""
