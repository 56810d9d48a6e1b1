"""Notebook 04, data-parallel CIFAR-10: the ResNet "bag of tricks" trainer on several processes
(``rank_process`` and ``train``), and what a second rank buys.

Modules:

* ``checks``: ``check_train`` (and ``check_rank_process``, from ``checks_rank``), the two
  CHECK cells' checkers;
* ``checks_rank``: ``check_rank_process``'s verdicts;
* ``probes``: what runs inside the 3 processes those checks start (recording trainer parts,
  simulated GPUs, the processes kept in step between runs);
* ``probes_rank``: ``rank_process`` with a stand-in ``train``, in every run;
* ``requirements``: each exercise's contract, clause by clause (quoted from the notebook),
  with the check cases that hold it;
* ``tricks``: the trainer's parts (whitening, label smoothing, EMA, optimizer, augmentation);
* ``runner``: settings, data and the launcher the student's file calls (``runner.main``);
* ``experiments``: time and accuracy for 1, 2 (and 4) ranks; the all-reduce cost;
* ``tries``: the try cell after part 1 of the file (``rank_process`` on 2 processes with a
  stand-in ``train``; nothing judged).
"""
