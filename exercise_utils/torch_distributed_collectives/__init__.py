"""Notebook 03, torch.distributed from first principles: process groups, point-to-point and
collectives, a ring all-reduce, partitions, exact gradient averaging for unequal partitions,
a CPU SyncBatchNorm, the uneven-batch hang, and the seed notebook's five experiments explained.

Modules:

* ``checks``: ``check_partition``, ``check_average_gradients`` (``check_sync_batchnorm`` too,
  from the next module);
* ``checks_batchnorm``: ``check_sync_batchnorm``;
* ``checks_ring``: ``check_ring_allreduce``;
* ``probes``, ``probes_ring``, ``probes_batchnorm``: what runs inside the ranks those checks start;
* ``wire``: what the averaging and SyncBatchNorm launches may put on the wire (the judge's);
* ``requirements``: each exercise's contract, clause by clause (quoted from the notebook),
  with the check cases that hold it;
* ``bench``: the student's ring all-reduce against ``dist.all_reduce`` (a torchrun script);
* ``train``: config-driven data-parallel training built from the student's files (torchrun);
* ``uneven``: what ``train`` does when the ranks' steps do not line up (Join, async_op);
* ``experiments``: the seed's experiments and the hang demo, in one launch; tables and plots;
* ``demos``: run a demo that is meant to fail and show the lines that matter.
"""
