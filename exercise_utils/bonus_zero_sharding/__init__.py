"""Notebook 07 (bonus), ZeRO stage 1: the ZeRO paper's memory model and a ``ShardedOptimizer``
that keeps optimizer state only for its rank's share of the parameters.

Modules:

* ``checks``: ``check_sharded`` and the launches it shares with ``check_checkpoint``
  (``check_memory`` is imported from there too);
* ``checks_memory``: ``check_memory`` (a sweep of the memory model, judged in the checker's
  process);
* ``probes_memory``: calls the student's ``bytes_per_device`` in a lone process;
* ``checks_sharded``: what ``check_sharded`` holds the ranks' results to;
* ``checks_checkpoint``: ``check_checkpoint``;
* ``replay``: the judge's reference: the unsharded optimizer replayed in the checker's
  process, on the gradients the ranks report where they agree with its own;
* ``wire``: what the launches may put on the links of a mesh (the judge's; no rank imports
  it), held against the bytes the kernel counted where links are observed;
* ``requirements``: each exercise's contract, clause by clause (quoted from the notebook),
  with the check cases that hold it;
* ``probes``, ``probes_runs``, ``probes_checkpoint``: what runs inside the ranks those checks
  start (``probes.probe``, the launch's entry point, runs both stages);
* ``probes_base``: what the stages share (settings, models, batches, the optimizer-state
  readers, one lockstep step), also used by ``replay``, ``wire`` and the checks;
* ``tries``: the try cells after each part of the file (issue 39): the memory model and the
  partition in the notebook's process, the steps and a checkpoint on 2 gloo ranks;
* ``bench``: optimizer state and memory per rank against AdamW and ``ZeroRedundancyOptimizer``.
"""
