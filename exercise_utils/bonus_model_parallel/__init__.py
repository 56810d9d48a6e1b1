"""Notebook 10 (bonus), tensor and pipeline parallelism from scratch, measured against torch's
``tensor.parallel`` and ``pipelining``.

Modules:

* ``checks``: ``check_tensor_parallel`` (f, g, the column- and row-parallel layers, the
  parallel MLP and attention), the judge;
* ``checks_pp``: ``check_schedules`` and ``check_pipeline``, the judges (with the GPipe / 1F1B
  orders they expect, which no rank can import);
* ``orders``: the GPipe and 1F1B orders the pipeline checks expect (the judge's);
* ``nets``: the judge's single-process reference blocks (MLP, attention; the Linear+Tanh stack
  of the pipeline check) and the salted weights, inputs and upstream gradients both the ranks
  and the judge build;
* ``probes``: what runs inside the ranks of ``check_tensor_parallel`` (the core's
  ``exercise_utils.recorder`` counting every collective);
* ``probes_pp``: what runs in ``check_schedules`` (one process, no communication) and inside the
  ranks of ``check_pipeline`` (every point-to-point message recorded, a message to a stage that
  is not a neighbour stopped before it is made, the order of the stage's forwards and
  backwards logged);
* ``wire``: what the tensor- and pipeline-parallel launches may put on the wire (the judge's:
  hidden at grading);
* ``requirements``: the contract, clause by clause, with the check cases that hold it;
* ``bench``: the bubble of GPipe and 1F1B, their activation memory, and your tensor-parallel
  MLP and 1F1B pipeline against torch's ``ColwiseParallel`` / ``RowwiseParallel`` and
  ``Schedule1F1B``;
* ``bench_parts``: the parts of ``bench`` that run inside its ranks;
* ``network``: the same model data-, tensor- and pipeline-parallel on two hosts of the core's
  ``exercise_utils.cluster`` at 100 Mbit/s and 1 Gbit/s: bytes per step on the links and step
  time;
* ``network_ranks``: the part of ``network`` that runs inside its ranks.
* ``tries``: the try cells after each part of the file (2 ranks; each prints what it
  computed beside one process; nothing judged).

Used in 10_bonus_model_parallel.
"""
