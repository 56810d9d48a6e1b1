"""What notebook 09's exercises require, quoted from the notebook's text and docstrings.

``REQUIREMENTS[exercise]`` lists the sentences a correct ``work/09_fsdp.py`` must satisfy, word
for word as the solution notebook states them. Every one has at least one wrong file in
``tests/wrong/`` whose docstring quotes it and which the exercise's check rejects; every wrong
file quotes one (``tests/test_requirements.py``).

Used in 09_bonus_fsdp.
"""
REQUIREMENTS = {
    "zero2": [
        "pad it with zeros to a multiple of ``world_size`` and return this rank's equal part.",
        "a NEW 1-D tensor of ceil(numel / N) elements (not a view: the caller keeps only it)",
        "the AVERAGE over the ranks of this rank's shard becomes ``self.shard.grad``",
        "free every parameter's full ``.grad``",
        "all-gather the updated shards into every rank's parameters.",
        "(no DDP, no all-reduce)",
    ],
    "zero3": [
        "a unit's parameters are all-gathered just before the unit runs and freed right after",
        "for a view of the gathered parameters save a note of where it lies instead (so they "
        "can be freed)",
        "rebuild a noted one from the parameters gathered again (once per backward).",
        "The average over the ranks of this rank's part of ``grad_full``",
        "``Zero3.parameters()`` yields the shards",
    ],
    "state_dict": [
        "rank 0 gets the whole model's ``state_dict()`` (the keys of the model before wrapping, "
        "tied weights under each of their names, frozen parameters and buffers included), the "
        "other ranks None.",
        "each keeps its shards of it; frozen parameters and buffers are copied.",
    ],
}
