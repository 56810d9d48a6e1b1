"""Known-wrong files of notebook 01, as patches of the solution (see tests/flaws.py): one flaw
each, the way a student would make it, naming the clause of the contract it breaks
(exercise_utils/mpi_parallel_sgd/requirements.py) and the check case that must reject it."""
from flaws import Def, Flaw

BOUNDS = "shard_bounds"
SCATTER = "scatter_shards"

FLAWS = [
    # ------------------------------------------------------------------ shards
    Flaw("shards", "drop_remainder", clause="tile", case="bounds-tile",
         why="every shard has n // size samples, so the remainder is silently dropped.",
         expect="shard_bounds(1, 2) returned [[0, 0], [0, 0]]",
         patch=(Def(BOUNDS, """
             def shard_bounds(n_samples, size):
                 per = n_samples // size
                 return [(r * per, (r + 1) * per) for r in range(size)]
             """),)),
    Flaw("shards", "skip_empty", clause="tile", case="bounds-count",
         why="leaves out the empty shards (a rank without samples gets no pair), so with more "
             "ranks than samples there are fewer pairs than ranks.",
         expect="returned 0 shards; expected one (start, stop) pair per rank (1)",
         patch=(("        bounds.append((start, stop))\n",
                 "        if stop > start:\n            bounds.append((start, stop))\n"),)),
    Flaw("shards", "last_takes_rest", clause="sizes", case="bounds-sizes",
         why="the last rank takes the whole remainder, so shard sizes differ by more than one.",
         expect="may differ by at most one",
         patch=(Def(BOUNDS, """
             def shard_bounds(n_samples, size):
                 per = n_samples // size
                 return [(r * per, n_samples if r == size - 1 else (r + 1) * per)
                         for r in range(size)]
             """),)),
    Flaw("shards", "proportional_bounds", clause="sizes", case="bounds-larger-first",
         why="the textbook formula rank * n // size: shards tile the range and differ by at most "
             "one, but the larger ones come last (11 samples on 3 ranks: 3, 4, 4, not 4, 4, 3).",
         expect="shard_bounds(1, 2) returned [[0, 0], [0, 1]]",
         patch=(Def(BOUNDS, """
             def shard_bounds(n_samples, size):
                 return [(r * n_samples // size, (r + 1) * n_samples // size) for r in range(size)]
             """),)),
    Flaw("shards", "torch_chunk", clause="any-size", case="scatter-empty",
         why="cuts the dataset with torch.tensor_split on the sample count per rank computed with "
             "a ceiling: right whenever every rank gets a sample, but with more ranks than samples "
             "the list of pieces is shorter than the world and comm.scatter refuses it.",
         expect="scatter-empty",
         patch=(("        pieces = [(x[a:b].clone(), y[a:b].clone())\n"
                 "                  for a, b in shard_bounds(len(x), comm.Get_size())]\n",
                 "        sizes = [b - a for a, b in shard_bounds(len(x), comm.Get_size()) if b > a]\n"
                 "        pieces = list(zip(x.split(sizes), y.split(sizes)))\n"),)),
    Flaw("shards", "scatter_ignores_root", clause="scatter", case="scatter-root",
         why="correct shards, but always scattered from rank 0 (ignores the root argument).",
         expect="rank 0 raised TypeError in check case 'scatter-root'",
         patch=(("    if comm.Get_rank() == root:\n", "    if comm.Get_rank() == 0:\n"),
                ("    return comm.scatter(pieces, root=root)\n",
                 "    return comm.scatter(pieces, root=0)\n"))),
    Flaw("shards", "counted_from_root", clause="scatter", case="scatter-root",
         why="numbers the shards from the root (the root keeps the first shard, the next rank "
             "the second, ...): right with root=0, every rank holds another's otherwise.",
         expect="Likely cause: rank 0 holds what rank 1 should hold",
         patch=(("    return comm.scatter(pieces, root=root)\n",
                 "    if pieces is not None:\n"
                 "        size = comm.Get_size()\n"
                 "        pieces = [pieces[(r - root) % size] for r in range(size)]\n"
                 "    return comm.scatter(pieces, root=root)\n"),)),
    Flaw("shards", "shuffled_first", clause="scatter", case="scatter-shard",
         why="shuffles the samples on root before cutting them (as a DistributedSampler would): "
             "every rank gets the right number of samples, but not its shard x[start:stop].",
         expect="rank 0 received samples",
         patch=(("    if comm.Get_rank() == root:\n",
                 "    if comm.Get_rank() == root:\n"
                 "        import torch\n"
                 "        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))\n"
                 "        x, y = x[order], y[order]\n"),)),
    Flaw("shards", "numpy_shards", clause="types", case="scatter-type",
         why="sends numpy copies of the pieces (smaller pickles, the student thought) and returns "
             "them: the right numbers, but not torch tensors, so training on them fails.",
         expect="returned a shard of types ['numpy.float32', 'numpy.int64']",
         patch=(("        pieces = [(x[a:b].clone(), y[a:b].clone())\n"
                 "                  for a, b in shard_bounds(len(x), comm.Get_size())]\n",
                 "        pieces = [(x[a:b].numpy(), y[a:b].numpy())\n"
                 "                  for a, b in shard_bounds(len(x), comm.Get_size())]\n"),)),
    Flaw("shards", "scatterv_float32", clause="types", case="scatter-float64",
         why="the buffer API: Scatterv into float32 receive buffers (the dtype of the images the "
             "student had in mind), so a float64 dataset comes back rounded to float32.",
         expect="(float64), root=0: rank 0 returned a shard of types ['torch.float32'",
         patch=(Def(SCATTER, """
             def scatter_shards(comm, x, y, root=0):
                 import numpy as np
                 import torch
                 from mpi4py import MPI
                 rank, size = comm.Get_rank(), comm.Get_size()
                 n, shape = comm.bcast((len(x), tuple(x.shape[1:])) if rank == root else None,
                                       root=root)
                 bounds = shard_bounds(n, size)
                 width = int(np.prod(shape))
                 a, b = bounds[rank]
                 xs, ys = np.empty((b - a, *shape), np.float32), np.empty(b - a, np.int64)
                 xsend = ysend = None
                 if rank == root:
                     counts, starts = [q - p for p, q in bounds], [p for p, _ in bounds]
                     xsend = [x.numpy().astype(np.float32),
                              ([c * width for c in counts], [s * width for s in starts]),
                              MPI.FLOAT]
                     ysend = [y.numpy(), (counts, starts), MPI.INT64_T]
                 comm.Scatterv(xsend, xs, root=root)
                 comm.Scatterv(ysend, ys, root=root)
                 return torch.from_numpy(xs), torch.from_numpy(ys)
             """),)),
    Flaw("shards", "bcast_labels", clause="receive-own", case="scatter-received",
         why="scatters the inputs but broadcasts the small label tensor whole, each rank slicing "
             "its own labels out of it: every rank receives all the labels.",
         expect="but its shard holds only 80",
         patch=(Def(SCATTER, """
             def scatter_shards(comm, x, y, root=0):
                 size, rank = comm.Get_size(), comm.Get_rank()
                 pieces = None
                 if rank == root:
                     pieces = [x[a:b].clone() for a, b in shard_bounds(len(x), size)]
                 xs = comm.scatter(pieces, root=root)
                 y = comm.bcast(y, root=root)
                 a, b = shard_bounds(len(y), size)[rank]
                 return xs, y[a:b].clone()
             """),)),
    Flaw("shards", "scatter_views", clause="receive-own", case="scatter-received",
         why="scatters the slices x[a:b] themselves: each is a view, pickled with the whole "
             "storage of x, so every rank receives the whole dataset and holds it under its "
             "shard.",
         expect="is pickled with all of x's storage",
         patch=(("        pieces = [(x[a:b].clone(), y[a:b].clone())\n",
                 "        pieces = [(x[a:b], y[a:b])\n"),)),
    Flaw("shards", "bcast_whole_dataset", clause="receive-own", case="scatter-received",
         why="broadcasts the whole dataset to every rank, which then slices out its own shard: "
             "every rank returns the right shard, but each one received (and held) all samples.",
         expect="rank 1 received 44 numbers, but its shard holds only 16",
         patch=(Def(SCATTER, """
             def scatter_shards(comm, x, y, root=0):
                 x, y = comm.bcast((x, y), root=root)
                 a, b = shard_bounds(len(x), comm.Get_size())[comm.Get_rank()]
                 return x[a:b], y[a:b]
             """),)),
    # ------------------------------------------------------------------ broadcast
    Flaw("broadcast", "parameters_only", clause="buffers", case="bcast-values",
         why="broadcasts model.parameters() only, so the BatchNorm running statistics (buffers) "
             "of the other ranks keep their own values.",
         expect="in bn.running_mean",
         patch=(("    for tensor in model.state_dict().values():\n",
                 "    for tensor in model.parameters():\n"),
                ("        comm.Bcast(tensor.numpy(), root=root)\n",
                 "        comm.Bcast(tensor.data.numpy(), root=root)\n"))),
    Flaw("broadcast", "wrong_root", clause="equals-root", case="bcast-root",
         why="always broadcasts from rank 0, whatever root was asked for.",
         expect="must hold rank 2's parameters and buffers",
         patch=(("        comm.Bcast(tensor.numpy(), root=root)\n",
                 "        comm.Bcast(tensor.numpy(), root=0)\n"),)),
    Flaw("broadcast", "float32_flat", clause="any-model", case="bcast-float64",
         why="one flat float32 buffer for every floating tensor (fewer messages), the integer "
             "buffers on their own: exact for a float32 model, a float64 one comes back rounded.",
         expect="float64 model",
         patch=(Def("broadcast_parameters", """
             def broadcast_parameters(comm, model, root=0):
                 import torch
                 tensors = list(model.state_dict().values())
                 floats = [t for t in tensors if t.is_floating_point()]
                 flat = torch.cat([t.reshape(-1) for t in floats]).float()
                 comm.Bcast(flat.numpy(), root=root)
                 offset = 0
                 for t in floats:
                     t.copy_(flat[offset:offset + t.numel()].view_as(t))
                     offset += t.numel()
                 for t in tensors:
                     if not t.is_floating_point():
                         comm.Bcast(t.numpy(), root=root)
             """),)),
    Flaw("broadcast", "skips_integer_buffers", clause="int-buffer", case="bcast-int-buffer",
         why="one flat float32 buffer of the floating-point tensors; the integer buffer "
             "num_batches_tracked is skipped (it did not fit the float buffer), so it keeps every "
             "rank's own count.",
         expect="in bn.num_batches_tracked",
         patch=(("    for tensor in model.state_dict().values():\n",
                 "    for tensor in model.state_dict().values():\n"
                 "        if not tensor.is_floating_point():\n"
                 "            continue\n"),)),
    Flaw("broadcast", "everything_as_float32", clause="int-buffer", case="bcast-int-buffer",
         why="every tensor, num_batches_tracked included, in one float32 buffer and copied back "
             "with copy_ (which casts): the counter comes back rounded to the nearest float32.",
         expect="in bn.num_batches_tracked",
         patch=(Def("broadcast_parameters", """
             def broadcast_parameters(comm, model, root=0):
                 import torch
                 tensors = list(model.state_dict().values())
                 flat = torch.cat([t.reshape(-1).float() for t in tensors])
                 comm.Bcast(flat.numpy(), root=root)
                 offset = 0
                 for t in tensors:
                     t.copy_(flat[offset:offset + t.numel()].view_as(t))
                     offset += t.numel()
             """),)),
    Flaw("broadcast", "rebinds", clause="in-place", case="bcast-in-place",
         why="receives root's state_dict and rebinds new tensors in the modules (parameters "
             "replaced, not updated).",
         expect="replaced the model's tensors instead of copying into them",
         patch=(Def("broadcast_parameters", """
             def broadcast_parameters(comm, model, root=0):
                 import torch
                 state = comm.bcast(model.state_dict(), root=root)
                 for name, module in model.named_modules():
                     for pname, _ in list(module.named_parameters(recurse=False)):
                         key = f"{name}.{pname}" if name else pname
                         setattr(module, pname, torch.nn.Parameter(
                             state[key].clone(), requires_grad=state[key].requires_grad))
                     for bname, _ in list(module.named_buffers(recurse=False)):
                         key = f"{name}.{bname}" if name else bname
                         setattr(module, bname, state[key].clone())
             """),)),
    # ------------------------------------------------------------------ convergence
    Flaw("convergence", "local_loss", clause="global", case="global-same",
         why="each rank decides on its own local loss (0 without samples), so ranks disagree "
             "about stopping.",
         expect="global_loss differs between ranks",
         patch=(Def("global_loss", """
             def global_loss(comm, loss_sum, count):
                 return loss_sum / count if count else 0.0
             """),)),
    Flaw("convergence", "mean_of_means", clause="global", case="global-value",
         why="averages the per-rank mean losses (a rank without samples counts as 0): wrong "
             "when the ranks hold different numbers of samples.",
         expect="expected 0.4",
         patch=(Def("global_loss", """
             def global_loss(comm, loss_sum, count):
                 return comm.allreduce(loss_sum / count if count else 0.0) / comm.Get_size()
             """),)),
    Flaw("convergence", "float32_buffer", clause="float64", case="global-value",
         why="the sums travel in a float32 array (like the gradients of the other exercises): "
             "right to seven digits, rounded beyond.",
         expect="computed in float64",
         patch=(("    totals = np.array([loss_sum, count], dtype=np.float64)\n",
                 "    totals = np.array([loss_sum, count], dtype=np.float32)\n"),)),
    Flaw("convergence", "weighted_means", clause="edges", case="global-empty-rank",
         why="the weighted mean of the ranks' means, sum(mean_r * n_r) / N: the right number, "
             "until a rank without samples divides by zero.",
         expect="ZeroDivisionError in check case 'global-empty-rank'",
         patch=(("    totals = np.array([loss_sum, count], dtype=np.float64)\n",
                 "    totals = np.array([loss_sum / count * count, count], dtype=np.float64)\n"),)),
    Flaw("convergence", "numpy_means", clause="edges", case="global-empty-rank",
         why="the weighted mean of the ranks' means in numpy, where 0 / 0 is not an error but "
             "NaN (with a warning): a rank without samples turns the global loss into NaN.",
         expect="Likely cause: a NaN or infinity, first in global_loss",
         patch=(("    totals = np.array([loss_sum, count], dtype=np.float64)\n",
                 "    mean = np.float64(loss_sum) / count\n"
                 "    totals = np.array([mean * count, count], dtype=np.float64)\n"),)),
    Flaw("convergence", "seed_bug", clause="rule", case="converged-rule",
         why="the seed's stop rule: compares with prev_loss even on the first epoch.",
         expect="converged(None, 1.0, 0.01) raised TypeError",
         patch=(("    if prev_loss is None:\n        return False\n", ""),)),
    Flaw("convergence", "not_prev_loss", clause="rule", case="converged-rule",
         why="tests `not prev_loss` for the first epoch, so a previous loss of 0.0 counts as no "
             "loss at all.",
         expect="converged(0.0, 0.0, 0.01) returned False, expected True (a previous loss of 0.0",
         patch=(("    if prev_loss is None:\n", "    if not prev_loss:\n"),)),
    Flaw("convergence", "relative_to_new_loss", clause="rule", case="converged-rule",
         why="measures the change relative to the new loss instead of the previous one.",
         expect="converged(1.0, 0.75, 0.25) returned False",
         patch=(("    return abs(prev_loss - loss) <= rel_tol * abs(prev_loss)\n",
                 "    return abs(prev_loss - loss) <= rel_tol * abs(loss)\n"),)),
    Flaw("convergence", "isclose", clause="rule", case="converged-rule",
         why="math.isclose(prev_loss, loss, rel_tol=rel_tol): relative to the larger of the two "
             "losses, so a loss that rose by just over the tolerance still counts as converged.",
         expect="converged(1.0, 1.25, 0.2) returned True, expected False",
         patch=(("    return abs(prev_loss - loss) <= rel_tol * abs(prev_loss)\n",
                 "    import math\n    return math.isclose(prev_loss, loss, rel_tol=rel_tol)\n"),)),
    Flaw("convergence", "negative_losses", clause="edges", case="converged-rule",
         why="rel_tol * prev_loss without abs(): never converges once the loss is negative.",
         expect="converged(-1.0, -0.995, 0.01) returned False, expected True",
         patch=(("    return abs(prev_loss - loss) <= rel_tol * abs(prev_loss)\n",
                 "    return abs(prev_loss - loss) <= rel_tol * prev_loss\n"),)),
    Flaw("convergence", "returns_none", clause="bool", case="converged-bool",
         why="a bare `return` on the first epoch: falsy, but None, not False.",
         expect="returned a NoneType",
         patch=(("    if prev_loss is None:\n        return False\n",
                 "    if prev_loss is None:\n        return\n"),)),
    Flaw("convergence", "numpy_bool", clause="bool", case="converged-bool",
         why="the rule computed with numpy: np.abs gives numpy floats, and their comparison a "
             "numpy.bool, not the bool the docstring promises.",
         expect="returned a numpy.bool",
         patch=(("    return abs(prev_loss - loss) <= rel_tol * abs(prev_loss)\n",
                 "    return np.abs(prev_loss - loss) <= rel_tol * np.abs(prev_loss)\n"),)),
    # ------------------------------------------------------------------ allreduce_sgd
    Flaw("allreduce_sgd", "sum_not_average", clause="average", case="sgd-values",
         why="sums the gradients with one Allreduce but forgets to divide by the number of ranks.",
         expect="summed instead of averaged? Divide",
         patch=(("    flat /= comm.Get_size()\n", ""),)),
    Flaw("allreduce_sgd", "divided_twice", clause="average", case="sgd-values",
         why="scales each rank's gradients by 1/size before the Allreduce (to average as it "
             "sums) and divides the sum by size again.",
         expect="divided by the world size twice",
         patch=(("    comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)\n",
                 "    flat /= comm.Get_size()\n"
                 "    comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)\n"),)),
    Flaw("allreduce_sgd", "no_copy_back", clause="average", case="sgd-values",
         why="averages a flat buffer but never copies it back, as if torch.cat returned views of "
             "the gradients (it returns a new tensor): every rank steps with its own gradient.",
         expect="must equal single-process SGD",
         patch=(("    for p in params:\n"
                 "        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))\n"
                 "        offset += p.numel()\n", ""),)),
    Flaw("allreduce_sgd", "rank0_only", clause="average", case="sgd-values",
         why="only rank 0 takes part in the Allreduce: the other ranks never call it (deadlock).",
         expect="hung: ranks issued different collectives?", timeout=10,   # (MPICH spins)
         patch=(("    params = [p for p in model.parameters() if p.grad is not None]\n",
                 "    if comm.Get_rank() != 0:\n        return\n"
                 "    params = [p for p in model.parameters() if p.grad is not None]\n"),)),
    Flaw("allreduce_sgd", "per_parameter", clause="average", case="sgd-one-allreduce",
         why="correct averages, but one Allreduce per parameter instead of one flat buffer.",
         expect="expected exactly one comm.Allreduce per step",
         patch=(Def("average_gradients", """
             def average_gradients(comm, model):
                 for p in model.parameters():
                     if p.grad is not None:
                         comm.Allreduce(MPI.IN_PLACE, p.grad.numpy(), op=MPI.SUM)
                         p.grad /= comm.Get_size()
             """),)),
    Flaw("allreduce_sgd", "pickle_allreduce", clause="average", case="sgd-one-allreduce",
         why="one lowercase (pickle) comm.allreduce of the flat tensor: the right average, but "
             "every step pickles the whole gradient instead of one buffer Allreduce.",
         expect="made these calls per step: {'allreduce': 1.0}",
         patch=(("    comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)\n"
                 "    flat /= comm.Get_size()\n",
                 "    flat = comm.allreduce(flat, op=MPI.SUM) / comm.Get_size()\n"),)),
    Flaw("allreduce_sgd", "zero_fills_none", clause="no-grad", case="sgd-no-grad",
         why="gives every parameter without a gradient a zero one, so that all ranks' flat "
             "buffers surely line up: the frozen and unused parameters now have gradients, and "
             "weight decay moves them.",
         expect="after average_gradients the parameters without a gradient were []",
         patch=(("    params = [p for p in model.parameters() if p.grad is not None]\n",
                 "    for p in model.parameters():\n"
                 "        if p.grad is None:\n"
                 "            p.grad = torch.zeros_like(p)\n"
                 "    params = list(model.parameters())\n"),)),
    Flaw("allreduce_sgd", "params_found_once", clause="varying", case="sgd-varying",
         why="finds the parameters that have a gradient at the first call and keeps that list "
             "on the model (\"the model does not change\"): a parameter frozen in the first "
             "step and unfrozen later is never averaged.",
         expect="the parameters with a gradient in this step hold",
         patch=(("    params = [p for p in model.parameters() if p.grad is not None]\n",
                 "    if not hasattr(model, \"_with_grad\"):     # found once: the same every step\n"
                 "        model._with_grad = [p for p in model.parameters() if p.grad is not None]\n"
                 "    params = model._with_grad\n"),)),
    Flaw("allreduce_sgd", "mpi_float", clause="dtype", case="sgd-float64",
         why="names the datatype as the mpi4py tutorial does, [buffer, MPI.FLOAT]: for float64 "
             "gradients MPI adds pairs of half-doubles.",
         expect="float64 parameters after 4 SGD steps",
         patch=(("    comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)\n",
                 "    comm.Allreduce(MPI.IN_PLACE, [flat.numpy(), MPI.FLOAT], op=MPI.SUM)\n"),)),
    Flaw("allreduce_sgd", "float32_buffer", clause="dtype", case="sgd-float64",
         why="a float32 flat buffer, filled with copy_ and copied back: float64 gradients are "
             "rounded on the way.",
         expect="float64 parameters after 4 SGD steps",
         patch=(("    flat = torch.cat([p.grad.reshape(-1) for p in params])\n",
                 "    flat = torch.cat([p.grad.reshape(-1) for p in params]).float()\n"),)),
    Flaw("allreduce_sgd", "view_not_reshape", clause="transposed", case="sgd-values",
         why="flattens each gradient with view(-1), which fails on a transposed parameter.",
         expect="view size is not compatible",
         patch=(("    flat = torch.cat([p.grad.reshape(-1) for p in params])\n",
                 "    flat = torch.cat([p.grad.view(-1) for p in params])\n"),)),
    # ------------------------------------------------------------------ model_averaging
    Flaw("model_averaging", "root_only", clause="mean", case="average-values",
         why="averages on the root but never sends the average back to the other ranks.",
         expect="rank 1 differs by",
         patch=(("    mean = comm.bcast(mean, root=root)\n",
                 "    if comm.Get_rank() != root:\n        return\n"),)),
    Flaw("model_averaging", "wrong_divisor", clause="mean", case="average-values",
         why="sums every rank's parameters but divides by (size - 1).",
         expect="must hold the mean of all 3 ranks' parameters",
         patch=(("        mean = [np.asarray(np.mean(arrays, axis=0)) for arrays in zip(*everyone)]\n",
                 "        mean = [np.asarray(np.sum(arrays, axis=0) / (len(arrays) - 1))\n"
                 "                for arrays in zip(*everyone)]\n"),)),
    Flaw("model_averaging", "generator_reused", clause="mean", case="average-values",
         why="model.parameters() is a generator, consumed by the gather; the loop that copies "
             "the average back iterates over the exhausted generator and copies nothing.",
         expect="must hold the mean of all 3 ranks' parameters",
         patch=(Def("average_weights", """
             def average_weights(comm, model, root=0):
                 params = model.parameters()
                 everyone = comm.gather([p.detach().numpy().copy() for p in params], root=root)
                 mean = None
                 if comm.Get_rank() == root:
                     mean = [np.mean(arrays, axis=0) for arrays in zip(*everyone)]
                 mean = comm.bcast(mean, root=root)
                 with torch.no_grad():
                     for p, value in zip(params, mean):
                         p.copy_(torch.from_numpy(value))
             """),)),
    Flaw("model_averaging", "gather_on_zero", clause="mean", case="average-root",
         why="gathers on rank 0 whatever the root, then broadcasts from root, which has nothing.",
         expect="average-root",
         patch=(("    everyone = comm.gather(mine, root=root)\n",
                 "    everyone = comm.gather(mine, root=0)\n"),
                ("    if comm.Get_rank() == root:       #", "    if comm.Get_rank() == 0:       #"))),
    Flaw("model_averaging", "trainable_only", clause="every-parameter", case="average-values",
         why="averages the parameters that require a gradient only (the ones training changes), "
             "so a frozen parameter keeps every rank's own value.",
         expect="in frozen",
         patch=(Def("average_weights", """
             def average_weights(comm, model, root=0):
                 params = [p for p in model.parameters() if p.requires_grad]
                 everyone = comm.gather([p.detach().numpy().copy() for p in params], root=root)
                 mean = None
                 if comm.Get_rank() == root:
                     mean = [np.asarray(np.mean(arrays, axis=0)) for arrays in zip(*everyone)]
                 mean = comm.bcast(mean, root=root)
                 with torch.no_grad():
                     for p, value in zip(params, mean):
                         p.copy_(torch.from_numpy(value))
             """),)),
    Flaw("model_averaging", "float32_mean", clause="every-parameter", case="average-float64",
         why="averages in a float32 array, as for the gradients of section 5: a float64 model "
             "comes back rounded.",
         expect="a float64 model",
         patch=(("        mean = [np.asarray(np.mean(arrays, axis=0)) for arrays in zip(*everyone)]\n",
                 "        mean = [np.asarray(np.mean(arrays, axis=0, dtype=np.float32))\n"
                 "                for arrays in zip(*everyone)]\n"),)),
    Flaw("model_averaging", "stack_mean_buffers", clause="buffers", case="average-values",
         why="torch.stack(...).mean(0) over every entry of the state_dict: fails on BatchNorm's "
             "integer counter.",
         expect="could not infer output dtype",
         patch=(Def("average_weights", """
             def average_weights(comm, model, root=0):
                 states = comm.gather({k: v.clone() for k, v in model.state_dict().items()},
                                      root=root)
                 mean = None
                 if comm.Get_rank() == root:
                     mean = {k: torch.stack([s[k] for s in states]).mean(0) for k in states[0]}
                 model.load_state_dict(comm.bcast(mean, root=root))
             """),)),
    Flaw("model_averaging", "rebinds", clause="in-place", case="average-in-place",
         why="every rank gets the average, but it is assigned with `p.data = ...`, which gives "
             "the parameters new tensors instead of writing into the model's own.",
         expect="average_weights replaced the model's tensors",
         patch=(Def("average_weights", """
             def average_weights(comm, model, root=0):
                 params = list(model.parameters())
                 everyone = comm.gather([p.detach().numpy() for p in params], root=root)
                 mean = None
                 if comm.Get_rank() == root:
                     mean = [np.asarray(np.mean(arrays, axis=0)) for arrays in zip(*everyone)]
                 mean = comm.bcast(mean, root=root)
                 for p, value in zip(params, mean):
                     p.data = torch.from_numpy(value)
             """),)),
]
