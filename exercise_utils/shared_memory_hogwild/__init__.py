"""Notebook 02, shared-memory training: processes and threads, ``DistributedSampler``'s
partition rebuilt by hand, and Hogwild! training of one shared model by several processes.

Modules:

* ``checks``: the ``check_*`` functions of the notebook's CHECK cells (sampler, Hogwild);
* ``probes``: what runs inside the processes those checks start (and the inputs they share);
* ``requirements``: what each exercise requires, quoted from the notebook (each has a wrong
  file in ``tests/wrong/``);
* ``train``: Hogwild! against serial training with the student's file
  (``python -m exercise_utils.shared_memory_hogwild.train``);
* ``experiments``: the notebook's runs of it, tables and plots, and the ``set_epoch`` demo.
"""
