"""Notebook 02, shared-memory training: processes and threads, ``DistributedSampler``'s
partition rebuilt by hand, and Hogwild! training of one shared model by several processes.

Modules:

* ``checks``: the ``check_*`` functions of the notebook's CHECK cells (the sampler's here,
  ``check_hogwild`` from ``checks_hogwild``);
* ``checks_hogwild``: the Hogwild check (``train_worker`` alone, three workers, crashes);
* ``reference``: the judge's reference (``DistributedSampler``'s partition);
* ``probes``: what runs inside the processes those checks start (and the inputs they share);
* ``recorders``: what the Hogwild probe watches the workers with: the dataset that logs every
  read, the start/join counter, and the gate that tells lock-free workers from serialized ones;
* ``requirements``: each exercise's contract, clause by clause (quoted from the notebook),
  with the check cases that hold it;
* ``train``: Hogwild! against serial training with the student's file
  (``python -m exercise_utils.shared_memory_hogwild.train``);
* ``experiments``: the notebook's runs of it, tables and plots, and the ``set_epoch`` demo.
"""
