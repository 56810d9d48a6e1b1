"""Notebook 04, data-parallel CIFAR-10: the ResNet "bag of tricks" trainer on several processes
(``rank_process`` and ``train``), and what a second rank buys.

Modules:

* ``checks``: ``check_rank_process`` and ``check_train``;
* ``probes``: what runs inside the two ranks those checks start (recording trainer parts);
* ``requirements``: each exercise's contract, clause by clause (quoted from the notebook),
  with the check cases that hold it;
* ``tricks``: the trainer's parts (whitening, label smoothing, EMA, optimizer, augmentation);
* ``runner``: settings, data and the launcher the student's file calls (``runner.main``);
* ``experiments``: time and accuracy for 1, 2 (and 4) ranks; the all-reduce cost.
"""
