"""Notebook 05, DistributedDataParallel under torchrun: a ``Trainer`` with snapshots that lose
nothing, restarts after injected crashes, the learning-rate scaling rule, a two-node job on
one machine and a node that dies, and uneven inputs with DDP's ``join``.

Modules:

* ``checks``: ``check_trainer`` (and ``check_snapshots`` of ``checks_snapshots``): the judge
  of the records a checked job leaves, case by case;
* ``checks_snapshots``: ``check_snapshots``: jobs A (uninterrupted) and B (resumed, a crash
  during a write);
* ``jobs``: one checked job (launch, records, a failure charged to what the code was doing);
* ``agent``: what torchrun's agent does for a checked job, in one process that forks its
  workers (torch imported once);
* ``probes``: the entry point every worker of a checked job runs (the ``Trainer`` seen through
  a recording subclass, recorders of saves, loads and renames);
* ``digests``: a trainer's state and a snapshot as plain data (hashes, sums, dtypes);
* ``simulate``: the GPU paths of ``ddp_setup``, ``Trainer`` and ``load_snapshot``, simulated on
  the CPU;
* ``requirements``: each exercise's contract, clause by clause (quoted from the notebook),
  with the check cases that hold it;
* ``runner``: settings, data, models (the checks' ``check_net``), fault injection and
  ``main`` of the student's trainer;
* ``lr_scaling``: the accuracy drop with more workers and its fix (a torchrun script);
* ``multinode``: two torchrun agents on one machine form one job (on loopback, or on two
  hosts of ``exercise_utils.cluster``); cluster and SLURM commands;
* ``node_failure``: a host dies in a two-host job: fixed size, replaced, elastic;
* ``hello``: the multi-node hello-world every worker runs (copy it to a cluster);
* ``join``: uneven inputs under DDP, the hang and ``model.join()`` (a torchrun script);
* ``tries``: the try cell after part 1 of the file (``ddp_setup`` and a ``Trainer`` on 2
  processes started as torchrun starts them; nothing judged).
"""
