"""Notebook 09 (bonus), ZeRO stages 2 and 3 (FSDP) from scratch, measured against FSDP2.

Modules:

* ``checks``: ``check_zero2`` (``shard_flat`` and ``Zero2``): the judge, which also exports
  the two checks of ``checks_zero3``;
* ``checks_zero3``: ``check_zero3`` and ``check_state_dict``;
* ``launches``: their launches (one per world size and stage set, kept per file content) and
  what the checkers share;
* ``wire``: the bytes the launches of ``Zero2`` and ``Zero3`` may put on the links between the
  ranks, where those are observed (at grading);
* ``shards``: ``shard_flat``'s sweep, run in a lone process;
* ``probes``: what runs inside the ranks of ``check_zero2``'s launches (with the core's
  ``exercise_utils.recorder`` logging every collective), on the models and data of ``nets``;
* ``probes_zero3``: the same for ``check_zero3`` and ``check_state_dict``;
* ``nets``: those models and data;
* ``references``: the judge's single-process references (computed in the checker, never in a
  rank: hidden from the ranks at grading);
* ``memory``: the bytes of the tensors a rank actually holds (probes and benchmark);
* ``requirements``: each exercise's contract, clause by clause (quoted from the notebook),
  with the check cases that hold it;
* ``bench``: peak memory and step time of DDP, ZeRO-1, your ZeRO-2 and ZeRO-3 and FSDP2.
* ``tries``: the try cells after each part of ``work/09_fsdp.py`` (2 gloo ranks beside one
  process; not graded).
"""
