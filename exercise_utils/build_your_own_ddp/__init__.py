"""Notebook 06, build your own DDP: a Horovod-style API, then gradient averaging naive, flat,
overlapped with backward and bucketed, benchmarked against ``DistributedDataParallel``.

Modules:

* ``checks``: ``check_api``, ``check_naive``, ``check_flat``;
* ``checks_api``: the parts of ``check_api`` for ``init`` (under simulated launchers) and
  ``DistributedOptimizer``;
* ``checks_overlap``: ``check_overlap`` and ``check_buckets``;
* ``launches``: the launches the checks share (one per world size for every stage, kept per
  file content), and the rejection of communication below the recorder;
* ``probes``: what runs inside the ranks of ``check_api``'s launches, many cases per launch,
  with the core's ``exercise_utils.recorder`` logging every collective they see;
* ``probes_grad``: the same for naive, flat, overlap and buckets;
* ``probes_init``: the simulated jobs of ``init`` (torchrun's and MPICH's variables);
* ``requirements``: each exercise's contract, clause by clause (quoted from the notebook),
  with the check cases that hold it;
* ``expected``: the buckets BucketDDP must build (the judge's; no rank imports it);
* ``reference``: the models (float32 and float64 EdgeNets among them) and batches probes and
  checks share;
* ``references``: the single-process replay the checks compare with (the judge's; no rank
  imports it);
* ``wire``: what each stage's launch may put on the links of a mesh (the judge's; no rank
  imports it), held against the bytes the kernel counted where links are observed;
* ``bench``: the student's stages against torch DDP (a torchrun script), tables and plots;
* ``network``: the same benchmark on two hosts with links of 100 Mbit/s, 1 Gbit/s and
  unshaped: where overlap and buckets pay;
* ``tries``: the try cells after each part of the file (2 ranks; each prints what the part
  did beside one process; nothing judged).
"""
