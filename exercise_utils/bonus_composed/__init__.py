"""Notebook 11 (bonus), the pieces of a GPT on a mesh: process groups from scratch, the
vocabulary split across a tensor-parallel group, ring attention, sequence parallelism, and one
training step of a small GPT composed of them on a data x pipeline x tensor mesh.

Modules:

* ``checks``: ``check_mesh`` and ``check_vocab_parallel``, the judges;
* ``checks_ring``: ``check_ring_attention``, the judge of the ring;
* ``checks_sp``: ``check_sequence_parallel``, the judge of sequence parallelism;
* ``checks_step``: ``check_composed_step``, the judge of the composed step;
* ``refs``: the judge's expected mesh, single-process embedding, cross-entropy, attention and
  GPT, and the rules of the ring's pieces (hidden at grading);
* ``inputs``: the salted inputs both the ranks and the judge build;
* ``probes``: what runs inside the ranks of ``check_mesh`` and ``check_vocab_parallel`` (every
  ``dist.new_group`` logged, the collectives recorded);
* ``probes_sp``: what runs inside the ranks of ``check_sequence_parallel`` (the collectives of
  each phase recorded);
* ``probes_step``: what runs inside the ranks of ``check_composed_step`` (every message and
  collective logged with its peer or group);
* ``probes_ring``: what runs inside the ranks of ``check_ring_attention`` (every point-to-point
  message recorded, the block products counted, what the forward keeps measured);
* ``wire``: what the vocabulary-split, ring, sequence-parallel and composed-step launches may
  put on the wire (the judge's: hidden at grading);
* ``requirements``: the contract, clause by clause, with the check cases that hold each;
* ``bench``: your ring attention on 1, 2 and 4 ranks, the balanced split against the
  contiguous one: memory kept for the backward and work per rank;
* ``bench_memory``: a rank's parameters and saved activations with the GPT split along one
  dimension of your ``Mesh`` at a time (``n x 1 x 1``, ``1 x n x 1``, ``1 x 1 x n``), against
  one process;
* ``bench_sp``: your sequence-parallel block against tensor parallelism only on 2 and 4
  ranks: what the forward keeps (in the norm's region and elsewhere) and the ring bytes;
* ``bench_torch``: your composed step beside torch's composition (``parallelize_module``
  inside ``torch.distributed.pipelining`` stages on a ``DeviceMesh``): step times, gradients;
* ``network``, ``network_ranks``: your composed step on two hosts of four ranks, tensor
  parallelism inside a host or across the link, at 100 Mbit/s and 1 Gbit/s (the bytes that
  cross, the step time);
* ``tries``: the try cells after each part of the file (nothing judged).

Used in 11_bonus_composed.
"""
