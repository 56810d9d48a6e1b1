"""Notebook 08 (bonus), PowerSGD: rank-r gradient compression by one warm-started power
iteration with error feedback; accuracy against bytes, beside torch's ``powerSGD_hook``.

Modules:

* ``checks``: ``check_orthogonalize``, ``check_compression_rank`` (and ``check_powersgd``,
  from ``checks_powersgd``), one launch of 3 ranks for all three;
* ``checks_powersgd``: ``check_powersgd``, setting by setting, step by step;
* ``launches``: the one launch of 3 ranks the checks share, cached per file content;
* ``probes``: what runs inside the ranks those checks start (the recorder and the probe);
* ``expected``: the reference ``compression_rank`` and PowerSGD replayed in float64 (the
  judge's; no rank imports it);
* ``reference``: the inputs (sweeps) the probes hand the student's code;
* ``requirements``: each exercise's contract, clause by clause (quoted from the notebook),
  with the check cases that hold it;
* ``experiments``: training accuracy against bytes sent (a torchrun script), tables, plots;
* ``paper``: the paper's CIFAR-10 figures, its data column recomputed from ResNet-18;
* ``network``: step time against the link rate on two hosts, and the break-even rate.
* ``tries``: the try cells after each part of the file (part 1 in one process, part 2 on
  2 gloo ranks: one ``reduce()`` of a tiny model), printing what it computed.
"""
