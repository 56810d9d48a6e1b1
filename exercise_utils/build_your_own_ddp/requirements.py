"""What notebook 06's exercises require, quoted from the notebook's text and docstrings.

``REQUIREMENTS[exercise]`` lists the sentences a correct ``work/06_myddp.py`` must satisfy, word
for word as the solution notebook states them. Every one has at least one wrong file in
``tests/wrong/`` whose docstring quotes it and which the exercise's check rejects; every wrong
file quotes one (``tests/test_requirements.py``). A requirement without a wrong file is either
checked next time or deleted from the notebook.

Used in 06_build_your_own_ddp.
"""
from ..contract import Clause

CONTRACT = {
    "api": [
        Clause("rank-world-size",
               "The rank, world size and local rank come from the launcher's environment: "
               "torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``; MPICH's mpiexec sets "
               "``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``",
               cases=()),
        Clause("copy-rank-root",
               "Copy rank ``root``'s parameters AND buffers (e.g. BatchNorm running statistics) "
               "into every rank's ``model``, in place (an optimizer built before keeps working).",
               cases=()),
        Clause("order-depends-another",
               "The order depends on it (another seed, another order) and on nothing else: not "
               "on the rank, not on the world size.",
               cases=()),
        Clause("step-k-k",
               "Step k (the k-th batch of every rank) trains on the examples at positions ``k * "
               "batch_size`` to ``(k + 1) * batch_size - 1`` of the shuffled order, each rank "
               "taking a disjoint ``per_rank_batch`` of them",
               cases=()),
        Clause("rank-yields-same",
               "Every rank yields the same number of batches, ``len(dataset) // batch_size`` (an"
               " extra batch on one rank would leave it alone in an all-reduce, hanging); an "
               "incomplete last batch is dropped, so every step trains on exactly ``batch_size``"
               " examples.",
               cases=()),
    ],
    "naive": [
        Clause("params-parameters-those",
               "params: parameters; those whose ``grad`` is ``None`` (frozen, unused) are "
               "skipped.",
               cases=()),
        Clause("return-p-grad",
               "On return each ``p.grad`` holds the average over ranks (sum, then divide by the "
               "world size), in place.",
               cases=()),
    ],
    "flat": [
        Clause("params-parameters-those", "params: parameters; those whose ``grad`` is ``None`` are skipped.",
               cases=()),
        Clause("divide-world-size",
               "divide by the world size and copy the pieces back into each ``p.grad`` "
               "(``_unflatten_dense_tensors`` returns views of the buffer).",
               cases=()),
    ],
    "overlap": [
        Clause("at-construction-broadcast",
               "At construction: broadcast rank 0's parameters and buffers "
               "(``broadcast_parameters``), then register "
               "``p.register_post_accumulate_grad_hook(...)`` on every parameter that requires a"
               " gradient.",
               cases=()),
        Clause("hook-runs-as",
               "The hook runs as soon as backward has accumulated that parameter's gradient and "
               "starts ``dist.all_reduce(p.grad, async_op=True)`` (it must not wait: backward "
               "goes on computing the earlier layers' gradients while this one travels).",
               cases=()),
        Clause("finish-gradient-synchronization",
               "``finish_gradient_synchronization()``, called after ``loss.backward()`` and "
               "before the optimizer step, waits for every started all-reduce and divides those "
               "gradients by the world size.",
               cases=()),
    ],
    "buckets": [
        Clause("bucket-cap-mb", "bucket_cap_mb: bucket capacity in MiB (``bucket_cap_mb * 1024 * 1024`` bytes).",
               cases=()),
        Clause("take-parameters-that",
               "take the parameters that require a gradient (frozen ones are skipped; a tied "
               "parameter appears once, ``named_parameters`` already deduplicates) in REVERSE "
               "registration order, the order backward produces their gradients",
               cases=()),
        Clause("parameter-larger-than", "A parameter larger than the cap therefore gets a bucket of its own.",
               cases=()),
        Clause("finish-gradient-synchronization",
               "``finish_gradient_synchronization()`` waits for each bucket, divides by the "
               "world size and copies the values back into the ``p.grad`` (unflatten); "
               "afterwards the next backward starts counting again.",
               cases=()),
        Clause("no-sync-context",
               "``no_sync()``: a context manager; a backward inside it launches no communication"
               " at all (gradients just accumulate locally in ``p.grad``); the next backward "
               "outside it reduces the accumulated gradients.",
               cases=()),
        Clause("if-some-did",
               "If some did not (a layer the forward skipped), "
               "``finish_gradient_synchronization()`` raises ``RuntimeError`` naming every "
               "trainable parameter that got no gradient in that backward, before an optimizer "
               "step could let the replicas drift apart.",
               cases=()),
    ],
}
