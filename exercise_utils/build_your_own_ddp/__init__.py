"""Notebook 06, build your own DDP: a Horovod-style API, then gradient averaging naive, flat,
overlapped with backward and bucketed, benchmarked against ``DistributedDataParallel``.

Modules:

* ``checks``: ``check_api``, ``check_naive``, ``check_flat`` (and the shared launches);
* ``checks_overlap``: ``check_overlap`` and ``check_buckets``;
* ``probes``: what runs inside the ranks those checks start (the recorder, one probe a stage);
* ``reference``: the models, batches and single-process replay probes and checks share;
* ``bench``: the student's stages against torch DDP (a torchrun script), tables and plots.
"""
