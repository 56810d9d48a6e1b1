"""Notebook 01, parallel SGD with MPI: synchronous data-parallel SGD from nothing but MPI
messages (shards and scatter, parameter broadcast, one-Allreduce gradient averaging, a stop
rule all ranks agree on, one-shot model averaging), and what more processes buy on 2 cores.

Modules:

* ``checks``: the ``check_*`` functions of the notebook's CHECK cells (``check_convergence``
  from ``checks_convergence``);
* ``checks_convergence``: ``check_convergence`` (``converged`` and ``global_loss``);
* ``wire``: what the checks' launches may put on the links between the ranks' hosts (the
  judge's bounds, at grading);
* ``probes``: what runs inside the MPI ranks those checks start;
* ``inputs``: the inputs the probes give the student's functions, salted per rank
  at grading (the judge builds the expected values from the same salts);
* ``requirements``: each exercise's contract, clause by clause (quoted from the notebook),
  with the check cases that hold it;
* ``train``: the training script built from the student's files
  (``mpiexec -n 4 python -m exercise_utils.mpi_parallel_sgd.train``);
* ``bench``: mpi4py's pickle-based against its buffer-based API (an ``mpiexec`` script);
* ``experiments``: the notebook's scaling and averaging experiments, tables and plots;
* ``demo``: ``make demo``, the scaling experiment headless.
"""
