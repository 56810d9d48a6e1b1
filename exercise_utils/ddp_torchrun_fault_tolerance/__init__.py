"""Notebook 05, DistributedDataParallel under torchrun: a ``Trainer`` with snapshots that lose
nothing, restarts after injected crashes, the learning-rate scaling rule, a two-node job on
one machine and a node that dies, and uneven inputs with DDP's ``join``.

Modules:

* ``checks``: ``check_trainer`` and ``check_snapshots``;
* ``probes``: the entry point every torchrun worker of a checked job runs (recorders, the
  simulated ``ddp_setup``);
* ``requirements``: each exercise's contract, clause by clause (quoted from the notebook),
  with the check cases that hold it;
* ``runner``: settings, data, model, fault injection and ``main`` of the student's trainer;
* ``lr_scaling``: the accuracy drop with more workers and its fix (a torchrun script);
* ``multinode``: two torchrun agents on one machine form one job (on loopback, or on two
  hosts of ``exercise_utils.cluster``); cluster and SLURM commands;
* ``node_failure``: a host dies in a two-host job: fixed size, replaced, elastic;
* ``hello``: the multi-node hello-world every worker runs (copy it to a cluster);
* ``join``: uneven inputs under DDP, the hang and ``model.join()`` (a torchrun script).
"""
