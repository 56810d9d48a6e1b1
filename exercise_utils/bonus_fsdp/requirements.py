"""What notebook 09's exercises require, quoted from the notebook's text and docstrings.

``REQUIREMENTS[exercise]`` lists the sentences a correct ``work/09_fsdp.py`` must satisfy, word
for word as the solution notebook states them. Every one has at least one wrong file in
``tests/wrong/`` whose docstring quotes it and which the exercise's check rejects; every wrong
file quotes one (``tests/test_requirements.py``).

Used in 09_bonus_fsdp.
"""
from ..contract import Clause

CONTRACT = {
    "zero2": [
        Clause("pad-zeros-multiple",
               "pad it with zeros to a multiple of ``world_size`` and return this rank's equal "
               "part.",
               cases=()),
        Clause("new-1-d",
               "a NEW 1-D tensor of ceil(numel / N) elements (not a view: the caller keeps only "
               "it)",
               cases=()),
        Clause("average-over-ranks", "the AVERAGE over the ranks of this rank's shard becomes ``self.shard.grad``",
               cases=()),
        Clause("free-parameter-s", "free every parameter's full ``.grad``",
               cases=()),
        Clause("all-gather-updated", "all-gather the updated shards into every rank's parameters.",
               cases=()),
        Clause("no-ddp-no", "(no DDP, no all-reduce)",
               cases=()),
    ],
    "zero3": [
        Clause("unit-s-parameters",
               "a unit's parameters are all-gathered just before the unit runs and freed right "
               "after",
               cases=()),
        Clause("view-gathered-parameters",
               "for a view of the gathered parameters save a note of where it lies instead (so "
               "they can be freed)",
               cases=()),
        Clause("rebuild-noted-one", "rebuild a noted one from the parameters gathered again (once per backward).",
               cases=()),
        Clause("average-over-ranks", "The average over the ranks of this rank's part of ``grad_full``",
               cases=()),
        Clause("zero3-parameters-yields", "``Zero3.parameters()`` yields the shards",
               cases=()),
    ],
    "state_dict": [
        Clause("rank-0-gets",
               "rank 0 gets the whole model's ``state_dict()`` (the keys of the model before "
               "wrapping, tied weights under each of their names, frozen parameters and buffers "
               "included), the other ranks None.",
               cases=()),
        Clause("keeps-shards-frozen", "each keeps its shards of it; frozen parameters and buffers are copied.",
               cases=()),
    ],
}
