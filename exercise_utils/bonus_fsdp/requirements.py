"""What notebook 09's exercises promise: their contracts, clause by clause, with the check cases
that hold each clause.

``CONTRACT[exercise]`` lists :class:`~exercise_utils.contract.Clause` rows: every Args / Returns
clause of the docstrings of ``work/09_fsdp.py`` (the functions and methods the student writes)
and every behavioural sentence of the notebook, word for word, and the cases of :mod:`.checks`
that exercise it. Every case rejects at least one known-wrong file of
``tests/wrong/09_flaws.py``, which names the clause it breaks (``tests/test_requirements.py``,
``tests/test_checks.py``).

Used in 09_bonus_fsdp.
"""
from ..contract import Clause

CONTRACT = {
    "zero2": [
        Clause("pad", "pad it with zeros to a multiple of ``world_size`` and return this rank's "
               "equal part.", cases=("shard-values",)),
        Clause("tensors", "tensors: a non-empty list of tensors of one dtype (parameters or "
               "gradients; any shape: 0-d, empty or transposed ones too), concatenated in "
               "order.", cases=("shard-values", "shard-edges")),
        Clause("world-size", "world_size: N, the number of shards (1 or more).",
               cases=("shard-edges",)),
        Clause("new-1-d", "a NEW 1-D tensor of ceil(numel / N) elements (not a view: the caller "
               "keeps only it)", cases=("shard-values", "shard-new")),
        Clause("shard-dtype", "of the tensors' dtype (float64 stays float64, int64 stays "
               "int64)", cases=("shard-dtype",)),
        Clause("numel", "the number of real (unpadded) elements; with numel 0 every shard is "
               "empty.", cases=("shard-values", "shard-edges")),
        Clause("flat-dtype", "The flat vector and its shards keep the tensors' dtype: float32 or "
               "float64 parameters, int64 for integer tensors (nothing goes through float32 on "
               "the way, and an element is not always 4 bytes).",
               cases=("shard-dtype", "zero2-float64")),
        Clause("average-over-ranks", "the AVERAGE over the ranks of this rank's shard becomes "
               "``self.shard.grad``", cases=("zero2-values",)),
        Clause("missing-grad", "a parameter without ``.grad`` counts as zeros",
               cases=("zero2-features", "zero2-values")),
        Clause("free-grads", "free every parameter's full ``.grad`` and the flat buffer BEFORE "
               "the optimizer step", cases=("zero2-grads-freed", "zero2-freed-before-step")),
        Clause("freed-before-step", "**frees the full gradients before the optimizer step** "
               "(every parameter's `.grad` and the flat buffer: while its optimizer steps, a "
               "rank holds only its shard of the gradient)",
               cases=("zero2-freed-before-step",)),
        Clause("all-gather-updated", "all-gather the updated shards into every rank's "
               "parameters.", cases=("zero2-values",)),
        Clause("no-all-reduce", "(no DDP, no all-reduce)",
               cases=("zero2-collectives", "zero2-wire")),
        Clause("one-of-each", "every `step()` issues exactly one reduce-scatter (into the padded "
               "shard) and one all-gather (of the whole padded vector) and nothing else",
               cases=("zero2-collectives", "zero2-wire")),
        Clause("any-model", "Any model: float32 or float64 parameters (keep that dtype all the "
               "way), transposed ones (not contiguous: `reshape`, not `view`), 0-d ones, a weight "
               "tied between two layers (`parameters()` lists it once).",
               cases=("zero2-features", "zero2-float64")),
        Clause("memory", "the bytes alive after a step are at most the parameters plus the `1/N` "
               "shards of parameter, gradient and momentum (plus 16 kB for small tensors)",
               cases=("zero2-memory",)),
    ],
    "zero3": [
        Clause("gathered-while-running", "a unit's parameters are all-gathered just before the "
               "unit runs and freed right after", cases=("zero3-collectives",
                                                         "zero3-forward-memory", "zero3-memory")),
        Clause("attribute-none", "replaces each trainable parameter of a unit by a plain "
               "attribute that is `None` except while the unit runs",
               cases=("zero3-attrs-none",)),
        Clause("reshard-every-attribute", "`reshard()`: drop the views (set every attribute "
               "back to `None`, both of a tied weight's) and the gathered vector.",
               cases=("zero3-attrs-none", "zero3-memory")),
        Clause("reshard-frees", "Free the gathered parameters: nothing may keep them alive after "
               "forward.", cases=("zero3-forward-memory", "zero3-memory")),
        Clause("view-gathered-parameters", "for a view of the gathered parameters save a note of "
               "where it lies instead (so they can be freed)",
               cases=("zero3-forward-memory",)),
        Clause("root-views", "A unit's forward may use the root's parameters too (a weight tied "
               "between a unit and the outside): `pack` must not note such a view as one of its "
               "own unit's.", cases=("zero3-features",)),
        Clause("rebuild-noted-one", "rebuild a noted one from the parameters gathered again "
               "(once per backward).", cases=("zero3-collectives", "zero3-values")),
        Clause("average-over-ranks", "The average over the ranks of this rank's part of "
               "``grad_full``", cases=("zero3-values",)),
        Clause("accumulate", "gradients of two backward passes before a step accumulate (never "
               "overwrite the shard's `.grad` yourself).", cases=("zero3-accumulate",)),
        Clause("any-model", "Any model, as for ZeRO-2: float32 or float64 (the shards, the "
               "gathered vectors and the rebuilt views in the model's dtype), transposed and 0-d "
               "parameters.", cases=("zero3-float64", "zero3-features")),
        Clause("zero3-parameters-yields", "``Zero3.parameters()`` yields the shards",
               cases=("zero3-parameters",)),
        Clause("collectives", "per step, forward all-gathers each unit once (at its padded "
               "size), backward gathers each unit at most once and reduce-scatters each once, "
               "nothing else", cases=("zero3-collectives", "zero3-wire")),
        Clause("memory", "after the optimizer step at most `1/N` of parameters, gradients and "
               "momentum (plus 16 kB)", cases=("zero3-memory",)),
        Clause("equals-one-process", "after 4 steps the outputs equal one process's",
               cases=("zero3-values",)),
    ],
    "state_dict": [
        Clause("rank-0-gets", "rank 0 gets the whole model's ``state_dict()`` (the keys of the "
               "model before wrapping, tied weights under each of their names, frozen parameters "
               "and buffers included), the other ranks None.",
               cases=("state-rank0", "state-keys", "state-values", "state-wire")),
        Clause("dtypes", "Values keep the model's dtypes (float32 or float64; integer buffers "
               "such as BatchNorm's `num_batches_tracked` stay int64).",
               cases=("state-float64",)),
        Clause("resharded", "Both leave every unit resharded (every attribute `None`, no gathered "
               "vector alive after them).", cases=("state-resharded",)),
        Clause("load-shards", "each copies its shards of it into its existing shards",
               cases=("state-load", "state-load-in-place")),
        Clause("load-frozen-buffers", "and the frozen parameters and buffers into the model's "
               "own tensors", cases=("state-load", "state-float64")),
        Clause("in-place", "Loading copies **in place**, into the existing shards, frozen "
               "parameters and buffers: an optimizer built before the load keeps working.",
               cases=("state-load-in-place",)),
        Clause("continues", "two more steps follow the single-process model",
               cases=("state-load",)),
    ],
}
