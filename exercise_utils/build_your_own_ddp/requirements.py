"""What notebook 06's exercises promise: their contracts, clause by clause, with the check cases
that hold each clause.

``CONTRACT[exercise]`` lists :class:`~exercise_utils.contract.Clause` rows: every Args / Returns
/ Raises clause of the exercise's docstrings (the ``%%writefile work/06_myddp.py`` cell) and
every behavioural sentence of the notebook, word for word, and the cases of :mod:`.checks`,
:mod:`.checks_api` and :mod:`.checks_overlap` that exercise it. Every case rejects at least
one known-wrong file of ``tests/wrong/06_flaws.py``, which names the clause it breaks
(``tests/test_requirements.py``, ``tests/test_checks.py``); the ``"<stage>-wire"`` cases (the
bytes on the links, :mod:`.wire`) each reject a cheat of ``tests/cheats/wire/``
(``tests/test_wire.py``).

Used in 06_build_your_own_ddp.
"""
from ..contract import Clause

ANY_MODEL = ("Every stage must work for any model: float32 or float64 parameters (keep the "
             "gradients' dtype all the way: a float32 buffer rounds float64 gradients), frozen "
             "and tied parameters, a parameter stored transposed (not contiguous: `reshape` works "
             "on its gradient, `view(-1)` does not), a 0-d one, BatchNorm buffers (an int64 "
             "counter among them), and trainable parameters that get no gradient in a step "
             "(their `grad` stays `None`).")

CONTRACT = {
    "api": [
        Clause("join",
               "Join the job started by ``torchrun`` or ``mpiexec``; return ``(rank, "
               "world_size, device)``.", cases=("init-torchrun", "init-mpiexec")),
        Clause("launcher-env",
               "The rank, world size and local rank come from the launcher's environment: "
               "torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``; MPICH's mpiexec sets "
               "``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``; Open MPI's sets "
               "``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``, "
               "``OMPI_COMM_WORLD_LOCAL_RANK``",
               cases=("init-torchrun", "init-mpiexec", "init-openmpi")),
        Clause("no-launcher",
               "Without any of them: rank 0 of 1. The rendezvous address is ``MASTER_ADDR`` / "
               "``MASTER_PORT`` (default ``127.0.0.1`` / ``29500``; the course's launcher sets "
               "both).", cases=("init-no-launcher",)),
        Clause("returns",
               "``(rank, world_size, device)``: device ``cuda:<local rank>`` with NCCL (made "
               "the current CUDA device), ``cpu`` with gloo.",
               cases=("init-torchrun", "init-gpu-device")),
        Clause("backend", "``None``: NCCL when CUDA is available, else gloo.",
               cases=("init-backend-default", "init-gpu-device")),
        Clause("timeout",
               "timeout_s: seconds a collective may wait for the other ranks before it raises",
               cases=("init-timeout",)),
        Clause("initialise-once",
               "Initialise the default process group with ``init_method=\"env://\"`` unless it "
               "is already initialised.", cases=("init-twice",)),
        Clause("partition-global-batch",
               "batch_size: the GLOBAL batch: examples per optimizer step, all ranks together. "
               "It stays the same whatever the number of ranks (same training, more workers).",
               cases=("partition-sizes",)),
        Clause("partition-seed",
               "The order depends on it (another seed, another order) and on nothing else: not "
               "on the rank, not on the world size.",
               cases=("partition-seed", "partition-same-steps")),
        Clause("partition-shuffled",
               "One shuffled order of the dataset, drawn from `seed` alone, is cut into steps",
               cases=("partition-shuffled",)),
        Clause("partition-returns",
               "``(loader, per_rank_batch)``: ``per_rank_batch = batch_size // world_size``; "
               "the loader yields this rank's batches of exactly ``per_rank_batch`` examples",
               cases=("partition-sizes",)),
        Clause("partition-step-k",
               "Step k (the k-th batch of every rank) trains on the examples at positions "
               "``k * batch_size`` to ``(k + 1) * batch_size - 1`` of the shuffled order, each "
               "rank taking a disjoint ``per_rank_batch`` of them",
               cases=("partition-disjoint", "partition-same-steps")),
        Clause("partition-same-count",
               "Every rank yields the same number of batches, ``len(dataset) // batch_size`` (an"
               " extra batch on one rank would leave it alone in an all-reduce, hanging); an "
               "incomplete last batch is dropped, so every step trains on exactly ``batch_size``"
               " examples.", cases=("partition-sizes",)),
        Clause("partition-raises",
               "ValueError: ``batch_size`` is not divisible by the world size.",
               cases=("partition-indivisible",)),
        Clause("bcast-copy",
               "Copy rank ``root``'s parameters AND buffers (e.g. BatchNorm running statistics) "
               "into every rank's ``model``, in place (an optimizer built before keeps working).",
               cases=("bcast-values", "bcast-buffers", "bcast-in-place", "api-wire")),
        Clause("bcast-root", "root: the rank whose values everyone gets.",
               cases=("bcast-root",)),
        Clause("bcast-any-model",
               "float32 or float64, with tied, frozen, transposed and 0-d parameters, and "
               "integer buffers (BatchNorm's ``num_batches_tracked``, an int64 counter: never "
               "send it through a float32 buffer). Every tensor keeps its dtype.",
               cases=("bcast-float64", "bcast-int-buffer")),
        Clause("dopt-strategy",
               "strategy: ``\"naive\"`` (``allreduce_naive``), ``\"flat\"`` (``allreduce_flat``)"
               " or a function ``reduce(params)``",
               cases=("dopt-naive", "dopt-flat", "dopt-callable")),
        Clause("dopt-step",
               "``step()`` calls the strategy once on the model's parameters, then "
               "``optimizer.step()``; ``zero_grad()`` passes through to the optimizer.",
               cases=("dopt-naive", "dopt-flat")),
        Clause("dopt-closure",
               "``step(closure)`` takes a closure as ``torch.optim`` does (it clears the "
               "gradients, computes the loss, calls ``backward()`` and returns the loss): call "
               "it once first, then average and step as above, and return its loss (never hand "
               "the closure to ``optimizer.step``: it would recompute local gradients after the "
               "averaging).", cases=("dopt-closure",)),
        Clause("dopt-zero-grad",
               "``zero_grad(set_to_none=True)`` passes ``set_to_none`` on to the optimizer's.",
               cases=("dopt-zero-grad", "dopt-naive")),
    ],
    "naive": [
        Clause("one-per-parameter",
               "Average every gradient over the ranks: ONE ``dist.all_reduce`` PER PARAMETER.",
               cases=("naive-calls", "naive-wire")),
        Clause("skip-none",
               "params: parameters; those whose ``grad`` is ``None`` (frozen, unused) are "
               "skipped.", cases=("naive-no-grad", "naive-unused")),
        Clause("average",
               "On return each ``p.grad`` holds the average over ranks (sum, then divide by the "
               "world size), in place.", cases=("naive-values", "naive-in-place")),
        Clause("any-gradient",
               "Gradients are float32 or float64 (keep their dtype) and may be 0-d or stored "
               "transposed; a skipped parameter's ``grad`` stays ``None``.",
               cases=("naive-float64", "naive-edge-model", "naive-no-grad")),
        Clause("any-model", ANY_MODEL, cases=("naive-edge-model", "naive-float64")),
    ],
    "flat": [
        Clause("one-buffer",
               "Average every gradient over the ranks with ONE ``dist.all_reduce`` of ONE flat "
               "buffer.", cases=("flat-one-buffer", "flat-wire")),
        Clause("skip-none", "params: parameters; those whose ``grad`` is ``None`` are skipped.",
               cases=("flat-no-grad", "flat-unused")),
        Clause("copy-back",
               "divide by the world size and copy the pieces back into each ``p.grad`` "
               "(``_unflatten_dense_tensors`` returns views of the buffer).",
               cases=("flat-values", "flat-unused")),
        Clause("in-place",
               "Copy in place: each ``p.grad`` stays the tensor it was, with its own storage "
               "(neither ``p.grad = piece`` nor ``p.grad.data = piece``).",
               cases=("flat-in-place",)),
        Clause("any-gradient",
               "Gradients are float32 or float64: the buffer has their dtype (a float32 buffer "
               "rounds float64 gradients); they may be 0-d or stored transposed (``reshape``, "
               "not ``view(-1)``); a skipped parameter's ``grad`` stays ``None``.",
               cases=("flat-float64", "flat-edge-model")),
        Clause("any-model", ANY_MODEL, cases=("flat-edge-model", "flat-float64")),
    ],
    "overlap": [
        Clause("broadcast-and-hooks",
               "At construction: broadcast rank 0's parameters and buffers "
               "(``broadcast_parameters``), then register "
               "``p.register_post_accumulate_grad_hook(...)`` on every parameter that requires a"
               " gradient.", cases=("overlap-broadcast", "overlap-calls")),
        Clause("hook-async",
               "The hook runs as soon as backward has accumulated that parameter's gradient and "
               "starts ``dist.all_reduce(p.grad, async_op=True)`` (it must not wait: backward "
               "goes on computing the earlier layers' gradients while this one travels).",
               cases=("overlap-async", "overlap-during-backward", "overlap-calls",
                      "overlap-wire")),
        Clause("finish",
               "``finish_gradient_synchronization()``, called after ``loss.backward()`` and "
               "before the optimizer step, waits for every started all-reduce and divides those "
               "gradients by the world size.",
               cases=("overlap-values", "overlap-second-step")),
        Clause("any-model", ANY_MODEL, cases=("overlap-values", "overlap-float64")),
    ],
    "buckets": [
        Clause("cap-mib",
               "bucket_cap_mb: bucket capacity in MiB (``bucket_cap_mb * 1024 * 1024`` bytes).",
               cases=("buckets-cap-mib",)),
        Clause("broadcast",
               "module: the model; rank 0's parameters and buffers are broadcast at "
               "construction.", cases=("buckets-broadcast",)),
        Clause("reverse-order",
               "take the parameters that require a gradient (frozen ones are skipped; a tied "
               "parameter appears once, ``named_parameters`` already deduplicates) in REVERSE "
               "registration order, the order backward produces their gradients",
               cases=("buckets-packing",)),
        Clause("greedy",
               "fill buckets greedily: a parameter joins the current bucket unless that would "
               "take the bucket's bytes over the cap, in which case it starts a new bucket (a "
               "bucket may hold exactly the cap).",
               cases=("buckets-packing", "buckets-exact-cap")),
        Clause("bytes",
               "A parameter's bytes are ``p.numel() * p.element_size()``: 4 per element in "
               "float32, 8 in float64.", cases=("buckets-float64",)),
        Clause("larger-than-cap",
               "A parameter larger than the cap therefore gets a bucket of its own. No bucket "
               "is empty.", cases=("buckets-packing", "buckets-values")),
        Clause("one-per-bucket",
               "when the LAST one arrives, the bucket's gradients are flattened into one buffer "
               "and ``dist.all_reduce(buffer, async_op=True)`` starts (one per bucket per "
               "backward).",
               cases=("buckets-calls", "buckets-async", "buckets-during-backward",
                      "buckets-wire")),
        Clause("finish",
               "``finish_gradient_synchronization()`` waits for each bucket, divides by the "
               "world size and copies the values back into the ``p.grad`` (unflatten); "
               "afterwards the next backward starts counting again.",
               cases=("buckets-values", "buckets-second-step")),
        Clause("no-sync",
               "``no_sync()``: a context manager; a backward inside it launches no communication"
               " at all (gradients just accumulate locally in ``p.grad``); the next backward "
               "outside it reduces the accumulated gradients.", cases=("buckets-no-sync",)),
        Clause("nested-no-sync",
               "Nested ``no_sync()`` blocks: communication stays off until the outermost one "
               "ends.", cases=("buckets-nested-no-sync",)),
        Clause("idle-finish",
               "With no gradient arrived since the last call (e.g. right after backward passes "
               "inside ``no_sync()``) it does nothing: no error, no communication, no division.",
               cases=("buckets-idle-finish",)),
        Clause("unused-raises",
               "If some did not (a layer the forward skipped), "
               "``finish_gradient_synchronization()`` raises ``RuntimeError`` naming every "
               "trainable parameter that got no gradient in that backward (and no other), "
               "before an optimizer step could let the replicas drift apart.",
               cases=("buckets-unused-error", "buckets-unused-stale")),
        Clause("reset-first",
               "The counters are reset first, so the next backward starts afresh.",
               cases=("buckets-after-error",)),
        Clause("any-model", ANY_MODEL, cases=("buckets-values", "buckets-float64")),
    ],
}
