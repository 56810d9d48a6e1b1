"""Known-wrong files of notebook 02, as patches of the solution (see tests/flaws.py): one flaw
each, the way a student would make it, naming the clause of the contract it breaks
(exercise_utils/shared_memory_hogwild/requirements.py) and the check case that must reject it."""
from flaws import Def, Flaw

PAD = """        total = math.ceil(dataset_len / num_replicas) * num_replicas
        while len(order) < total:
            order += order[:total - len(order)]
"""
SEEDED = "        g.manual_seed(seed + epoch)\n"
STEP = """            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
"""
CHECK_CODES = """    failed = [f"rank {rank} (exit code {p.exitcode})" for rank, p in enumerate(procs)
              if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"Hogwild worker(s) failed: {', '.join(failed)}")
"""
ARGS = "(rank, num_workers, model, dataset, epochs,\n"
JOIN_ALL = "    for p in procs:\n        p.join()\n"

FLAWS = [
    # ------------------------------------------------------------------ sampler
    Flaw("sampler", "returns_tensor", clause="returns", case="sampler-type",
         why="returns the share as a tensor (handy for indexing a dataset), not a list of int.",
         expect="returned a torch.Tensor",
         patch=(("    return order[rank:total:num_replicas]\n",
                 "    return torch.tensor(order[rank:total:num_replicas])\n"),)),
    Flaw("sampler", "floor_plus_one", clause="equal-lengths", case="sampler-length",
         why="computes ceil(n / num_replicas) as n // num_replicas + 1, one too many whenever "
             "the dataset divides evenly.",
         expect="every replica must get ceil(dataset_len / num_replicas)",
         patch=(("        total = math.ceil(dataset_len / num_replicas) * num_replicas\n",
                 "        total = (dataset_len // num_replicas + 1) * num_replicas\n"),)),
    Flaw("sampler", "rank_seeded", clause="one-order", case="sampler-cover",
         why="seeds each replica's shuffle with seed + epoch + rank (so that the replicas get "
             "different orders), so they cut their shares from different orders: some samples "
             "go to two replicas, others to none.",
         expect="one order for everybody",
         patch=((SEEDED, "        g.manual_seed(seed + epoch + rank)\n"),)),
    Flaw("sampler", "ignores_epoch", clause="order", case="sampler-epoch",
         why="shuffles with the seed alone, ignoring the epoch: every epoch repeats the same order.",
         expect="partition_indices ignores the epoch",
         patch=((SEEDED, "        g.manual_seed(seed)\n"),)),
    Flaw("sampler", "ignores_seed", clause="order", case="sampler-seed",
         why="seeds the generator with the epoch alone: every run with another seed gets the "
             "same orders.",
         expect="partition_indices ignores the seed",
         patch=((SEEDED, "        g.manual_seed(epoch)\n"),)),
    Flaw("sampler", "python_shuffle", clause="order", case="sampler-order",
         why="shuffles with Python's random.Random(seed + epoch) instead of torch.randperm with a "
             "torch.Generator: an order that changes with seed and epoch, but not the one "
             "DistributedSampler uses.",
         expect="with one replica the share is the whole order",
         patch=(("""        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(dataset_len, generator=g).tolist()
""", """        import random
        order = list(range(dataset_len))
        random.Random(seed + epoch).shuffle(order)
"""),)),
    Flaw("sampler", "always_shuffles", clause="order", case="sampler-no-shuffle",
         why="ignores shuffle=False and shuffles every time.",
         expect="shuffle=False: no shuffle",
         patch=(("    if shuffle:\n", "    if True:\n"),)),
    Flaw("sampler", "drops_before_shuffle", clause="drop-last", case="sampler-drop",
         why="with drop_last it shuffles only the samples it keeps, so the same last samples of "
             "the dataset are dropped in every epoch (DistributedSampler shuffles first, then "
             "cuts the tail).",
         expect="shuffle first, then cut",
         patch=(("    if shuffle:\n",
                 "    used = dataset_len // num_replicas * num_replicas if drop_last else "
                 "dataset_len\n    if shuffle:\n"),
                ("        order = torch.randperm(dataset_len, generator=g).tolist()\n",
                 "        order = torch.randperm(used, generator=g).tolist()\n"
                 "        order += list(range(used, dataset_len))\n"))),
    Flaw("sampler", "pads_last_sample", clause="equal-lengths", case="sampler-padding",
         why="pads by repeating the last sample of the order instead of the order from its start.",
         expect="pads the shuffled order by repeating it from its start",
         patch=(("""        while len(order) < total:
            order += order[:total - len(order)]
""", """        if order:
            order += [order[-1]] * (total - len(order))
"""),)),
    Flaw("sampler", "contiguous_blocks", clause="share", case="sampler-interleave",
         why="gives every replica a contiguous block of the padded order (like notebook 01's "
             "shards) instead of every num_replicas-th index: the same lengths, other samples.",
         expect="order[rank:total:num_replicas]",
         patch=(("    return order[rank:total:num_replicas]\n",
                 "    per = len(order) // num_replicas\n"
                 "    return order[rank * per:(rank + 1) * per]\n"),)),
    Flaw("sampler", "pads_once", clause="again", case="sampler-small",
         why="pads by appending the start of the order once, which is enough unless the dataset "
             "is smaller than half the padded length (2 samples, 5 replicas: 4 indices instead "
             "of 5).",
         expect="repeated again and again",
         patch=(("""        while len(order) < total:
            order += order[:total - len(order)]
""", """        order += order[:total - len(order)]
"""),)),
    Flaw("sampler", "empty_dataset", clause="any-size", case="sampler-empty",
         why="pads by repeating the order total // dataset_len + 1 times, which divides by zero "
             "for an empty dataset.",
         expect="raised ZeroDivisionError",
         patch=((PAD, """        total = math.ceil(dataset_len / num_replicas) * num_replicas
        order = (order * (total // dataset_len + 1))[:total]
"""),)),
    Flaw("sampler", "sampler_argument_order", clause="signature", case="sampler-signature",
         why="puts drop_last before epoch, in the order of DistributedSampler's own arguments "
             "(shuffle, seed, drop_last), so a positional call mixes them up.",
         expect="partition_indices(13, 3, 0, True, 7, 2, False)",
         patch=(("def partition_indices(dataset_len, num_replicas, rank, shuffle=True, seed=0, "
                 "epoch=0,\n                      drop_last=False):\n",
                 "def partition_indices(dataset_len, num_replicas, rank, shuffle=True, seed=0, "
                 "drop_last=False,\n                      epoch=0):\n"),)),
    Flaw("sampler", "global_rng", clause="own-generator", case="sampler-global-rng",
         why="seeds torch's global random number generator (torch.manual_seed) instead of a "
             "torch.Generator of its own. The indices are right, but every call resets the random "
             "state of the whole training process (initialisation, dropout, augmentation) to seed "
             "+ epoch.",
         expect="changed torch's global random state",
         patch=(("""        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(dataset_len, generator=g).tolist()
""", """        torch.manual_seed(seed + epoch)
        order = torch.randperm(dataset_len).tolist()
"""),)),
    # ------------------------------------------------------------------ train_worker alone
    Flaw("hogwild", "same_data", clause="partition", case="worker-partition",
         why="every worker shuffles and trains on the whole dataset (no DistributedSampler), so "
             "the workers read the same samples and an epoch is num_workers passes over the data.",
         expect="it must read exactly its own partition",
         patch=(("""    sampler = DistributedSampler(dataset, num_replicas=num_workers, rank=rank, shuffle=True,
                                 seed=seed)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
""", """    torch.manual_seed(seed + rank)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
"""), ("        sampler.set_epoch(epoch)\n", ""))),
    Flaw("hogwild", "default_seed", clause="sampler", case="worker-partition",
         why="builds the DistributedSampler without seed=seed: every run shuffles with the "
             "default seed 0, whatever seed it was given.",
         expect="with set_epoch(0) gives",
         patch=(("""rank=rank, shuffle=True,
                                 seed=seed)
""", "rank=rank, shuffle=True)\n"),)),
    Flaw("hogwild", "no_set_threads", clause="threads", case="worker-threads",
         why="never calls torch.set_num_threads: every worker keeps the default (all the cores).",
         expect="call torch.set_num_threads(threads) in the worker",
         patch=(("    torch.set_num_threads(threads)\n", ""),)),
    Flaw("hogwild", "no_set_epoch", clause="epochs", case="worker-set-epoch",
         why="never calls sampler.set_epoch(epoch): every epoch repeats epoch 0's order and "
             "partition.",
         expect="call sampler.set_epoch(epoch)",
         patch=(("        sampler.set_epoch(epoch)\n", ""),)),
    Flaw("hogwild", "momentum", clause="epochs", case="worker-sgd",
         why="the usual training loop's SGD with momentum=0.9: every worker keeps its own "
             "private momentum buffer, which is no longer the algorithm of the paper (and not "
             "what was asked).",
         expect="one plain SGD step per batch",
         patch=(("    optimizer = torch.optim.SGD(model.parameters(), lr=lr)\n",
                 "    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)\n"),)),
    Flaw("hogwild", "no_zero_grad", clause="epochs", case="worker-sgd",
         why="never zeroes the gradients, so each step uses the sum of every gradient so far.",
         expect="one plain SGD step per batch",
         patch=(("            optimizer.zero_grad()\n", ""),)),
    Flaw("hogwild", "trains_a_copy", clause="itself", case="worker-in-place",
         why="trains a deep copy of the model (to keep the caller's model safe from half-done "
             "updates), so the caller's model never changes.",
         expect="did not change the model it was given",
         patch=(("    torch.set_num_threads(threads)\n",
                 "    torch.set_num_threads(threads)\n    import copy\n"
                 "    model = copy.deepcopy(model)\n"),)),
    Flaw("hogwild", "float_inputs", clause="any-model", case="worker-float64",
         why="casts every batch to float32 (as for images loaded as uint8), so a float64 model "
             "gets float32 inputs.",
         expect="in check case 'worker-float64'",
         patch=(("            F.cross_entropy(model(x), y).backward()\n",
                 "            F.cross_entropy(model(x.float()), y).backward()\n"),)),
    Flaw("hogwild", "manual_update", clause="any-model", case="worker-edge",
         why="updates the parameters by hand, p -= lr * p.grad for every parameter, which fails "
             "on frozen parameters and unused layers (their .grad is None).",
         expect="in check case 'worker-edge'",
         patch=(("    optimizer = torch.optim.SGD(model.parameters(), lr=lr)\n", ""),
                (STEP, """            model.zero_grad()
            F.cross_entropy(model(x), y).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= lr * p.grad
"""))),
    # ------------------------------------------------------------------ hogwild, 3 workers
    Flaw("hogwild", "trains_in_parent", clause="spawn", case="hogwild-processes",
         why="calls train_worker for every rank in this process, one after the other, instead "
             "of starting processes.",
         expect="samples were read by this process",
         patch=(Def("hogwild", """
             def hogwild(model, dataset, num_workers, epochs=1, batch_size=32, lr=0.05, seed=0,
                         threads=None):
                 threads = threads or max(1, (os.cpu_count() or 1) // num_workers)
                 for rank in range(num_workers):
                     train_worker(rank, num_workers, model, dataset, epochs, batch_size, lr,
                                  seed, threads)
             """),)),
    Flaw("hogwild", "every_rank_zero", clause="args", case="hogwild-partition",
         why="gives every worker the same arguments, rank 0 included (as the mnist_hogwild "
             "example does), so every worker reads rank 0's partition.",
         expect="every sample must be read exactly 3 times",
         patch=((ARGS, "(0, num_workers, model, dataset, epochs,\n"),)),
    Flaw("hogwild", "ignores_threads", clause="args", case="hogwild-threads",
         why="always gives the workers their share of the cores, ignoring the threads argument.",
         expect="with the `threads` that hogwild was given",
         patch=(("    threads = threads or max(1, (os.cpu_count() or 1) // num_workers)\n",
                 "    threads = max(1, (os.cpu_count() or 1) // num_workers)\n"),)),
    Flaw("hogwild", "one_at_a_time", clause="together", case="hogwild-together",
         why="starts each worker and joins it before starting the next, so the workers train one "
             "after the other: every worker reads its partition and the model is trained, but "
             "nothing runs in parallel.",
         expect="at most 1 worker process(es) were running at the same time",
         patch=(("    for p in procs:\n        p.start()\n" + JOIN_ALL,
                 "    for p in procs:\n        p.start()\n        p.join()\n"),)),
    Flaw("hogwild", "locked_steps", clause="no-lock", case="hogwild-lock-free",
         why="protects the shared parameters with one lock around every worker's whole SGD step "
             "(zero_grad, forward, backward, step), handed to the workers through a wrapper: no "
             "update is lost, but the workers take turns and nothing runs lock-free.",
         expect="the workers' steps never ran at the same time",
         patch=((STEP, """            with _LOCK or contextlib.nullcontext():
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
"""), ("import os\n", "import contextlib\nimport os\n\n_LOCK = None\n"),
                ("ctx.Process(target=train_worker, args=(rank,",
                 "ctx.Process(target=_locked, args=(lock, rank,"),
                ('    ctx = mp.get_context("spawn")\n', '    ctx = mp.get_context("spawn")\n'
                 '    lock = ctx.Lock()\n'),
                ("\n\ndef hogwild(", """

def _locked(lock, *args):
    global _LOCK
    _LOCK = lock
    train_worker(*args)


def hogwild("""))),
    Flaw("hogwild", "private_copies", clause="share-memory", case="hogwild-shared",
         why="starts the workers with fork and never calls model.share_memory(): every worker "
             "trains its own copy-on-write copy, and the parent's model never changes.",
         expect="the model in the parent process is unchanged",
         patch=(("""    model.share_memory()
    ctx = mp.get_context("spawn")
""", """    ctx = mp.get_context("fork")     # starts in milliseconds, unlike spawn
"""),)),
    Flaw("hogwild", "fork_context", clause="spawn", case="hogwild-spawn",
         why="shares the model but starts the workers with fork (milliseconds instead of "
             "seconds).",
         expect="were started with fork",
         patch=(('    ctx = mp.get_context("spawn")\n', '    ctx = mp.get_context("fork")\n'),)),
    # ------------------------------------------------------------------ crashes
    Flaw("hogwild", "ignores_crash", clause="raise", case="crash-exception",
         why="joins the workers but never looks at their exit codes: a crashed worker goes "
             "unnoticed.",
         expect="returned normally although rank 0's worker raised",
         patch=((CHECK_CODES, ""),)),
    Flaw("hogwild", "asserts_exit_codes", clause="raise", case="crash-type",
         why="checks the exit codes with assert, which raises AssertionError (and nothing at "
             "all under python -O), not RuntimeError.",
         expect="raised AssertionError",
         patch=((CHECK_CODES, """    for rank, p in enumerate(procs):
        assert p.exitcode == 0, f"rank {rank} failed with exit code {p.exitcode}"
"""),)),
    Flaw("hogwild", "vague_message", clause="raise", case="crash-message",
         why="raises RuntimeError('a Hogwild worker failed'), naming neither the rank nor the "
             "exit code.",
         expect="name the rank (0) and its exit code (1)",
         patch=(('        raise RuntimeError(f"Hogwild worker(s) failed: {\', \'.join(failed)}")\n',
                 '        raise RuntimeError("a Hogwild worker failed")\n'),)),
    Flaw("hogwild", "positive_codes_only", clause="signal", case="crash-signal",
         why="treats only positive exit codes as failures (if p.exitcode > 0), so a worker "
             "killed by a signal (negative exit code) goes unnoticed.",
         expect="returned normally although rank 0's worker was killed by signal 9",
         patch=(("              if p.exitcode != 0]\n", "              if p.exitcode > 0]\n"),)),
    Flaw("hogwild", "raise_before_join", clause="join-first", case="crash-joined",
         why="joins the workers in order and raises at the first one that failed, leaving the "
             "workers after it unjoined (still running).",
         expect="never joined",
         patch=((JOIN_ALL + CHECK_CODES, """    for rank, p in enumerate(procs):
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"Hogwild worker rank {rank} failed (exit code {p.exitcode})")
"""),)),
    Flaw("hogwild", "threads_all_cores", clause="threads-none", case="default-threads",
         why="with threads=None every worker gets all the cores (os.cpu_count() threads) "
             "instead of its share, so num_workers processes oversubscribe the machine (section "
             "5 measures the cost).",
         expect="threads=None means max(1, os.cpu_count() // num_workers)",
         patch=(("    threads = threads or max(1, (os.cpu_count() or 1) // num_workers)\n",
                 "    threads = threads or os.cpu_count()\n"),)),
    Flaw("hogwild", "threads_no_floor", clause="threads-none", case="default-threads",
         why="threads=None gives os.cpu_count() // num_workers without the floor of one: with "
             "more workers than cores that is 0, and every worker dies in "
             "torch.set_num_threads(0).",
         expect="with more workers than cores the share is 0",
         patch=(("    threads = threads or max(1, (os.cpu_count() or 1) // num_workers)\n",
                 "    threads = threads or (os.cpu_count() or 1) // num_workers\n"),)),
    Flaw("hogwild", "drop_last_loader", clause="sampler", case="worker-partition",
         why="DataLoader(..., drop_last=True): a partition that does not divide by the batch "
             "size loses its last samples every epoch.",
         expect="it must read exactly its own partition",
         patch=(("    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)\n",
                 "    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, "
                 "drop_last=True)\n"),)),
]
