"""Notebook 02, shared-memory training: processes and threads, ``DistributedSampler``'s
partition rebuilt by hand, and Hogwild! training of one shared model by several processes.

Modules:

* ``checks``: the ``check_*`` functions of the notebook's CHECK cells (sampler, Hogwild);
* ``probes``: what runs inside the processes those checks start (and the inputs they share);
* ``requirements``: each exercise's contract, clause by clause (quoted from the notebook),
  with the check cases that hold it;
* ``train``: Hogwild! against serial training with the student's file
  (``python -m exercise_utils.shared_memory_hogwild.train``);
* ``experiments``: the notebook's runs of it, tables and plots, and the ``set_epoch`` demo.
"""
