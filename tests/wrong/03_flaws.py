"""Known-wrong files of notebook 03, as patches of the solution (see tests/flaws.py): one flaw
each, the way a student would make it, naming the clause of the contract it breaks
(exercise_utils/torch_distributed_collectives/requirements.py) and the check case that must
reject it."""
from flaws import Def, Flaw

RING_SPLIT = "    chunks = torch.tensor_split(tensor.view(-1), size)     # views: writes land in tensor\n"
RING_END = ("        exchange(chunks[(rank + 1 - step) % size], chunks[(rank - step) % size])\n"
            "    return tensor")
EXCHANGE = """        incoming = dist.irecv(recv_into, left, group)      # post the receive first
        outgoing = dist.isend(send_chunk, right, group)    # then the send; neither blocks
        incoming.wait()
        outgoing.wait()
"""
TRANSLATE = ("        right, left = dist.get_global_rank(group, right), "
             "dist.get_global_rank(group, left)\n")
SHUFFLE = "        random.Random(seed).shuffle(indices)\n"
AVG_PARAMS = "    params = [p for p in model.parameters() if p.grad is not None]\n"
AVG_FLAT = ("    flat = torch.cat([p.grad.reshape(-1) * num_samples for p in params] + "
            "[count])\n")
AVG_BODY = """    params = [p for p in model.parameters() if p.grad is not None]
    # One all_reduce carries every n_r * g_r and, in its last element, n_r.
    like = params[0].grad if params else torch.zeros(0)
    count = like.new_tensor([float(num_samples)])
    flat = torch.cat([p.grad.reshape(-1) * num_samples for p in params] + [count])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    total = flat[-1]
    offset = 0
    for p in params:
        p.grad.copy_((flat[offset:offset + p.numel()] / total).view_as(p.grad))
        offset += p.numel()
"""
BN_STATS = "        stats = torch.cat([x.sum(dims), (x * x).sum(dims), count])\n"
BN_REDUCE = "            stats = dist_nn.all_reduce(stats, group=group)\n"
BN_MOMENTUM = """                m = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                     else self.momentum)
"""

FLAWS = [
    # ------------------------------------------------------------------ ring_allreduce
    Flaw("ring_allreduce", "allgather_adds", clause="returns", case="ring-sum",
         why="the all-gather is written like the reduce-scatter: each complete chunk that "
             "arrives is added to the rank's own copy instead of replacing it, so the sums "
             "count some ranks twice.",
         expect="ring_all_reduce on a tensor of shape (60,), dtype float32, with 3 ranks is wrong",
         patch=(("""    for step in range(size - 1):                           # all-gather
        exchange(chunks[(rank + 1 - step) % size], chunks[(rank - step) % size])
""", """    for step in range(size - 1):                           # all-gather, as above
        mine = chunks[(rank - step) % size]
        buffer = incoming[:mine.numel()]
        exchange(chunks[(rank + 1 - step) % size], buffer)
        mine.add_(buffer)
"""),)),
    Flaw("ring_allreduce", "returns_new", clause="in-place", case="ring-in-place",
         why="works on copies of the chunks and returns them concatenated: the right sums, but "
             "in a new tensor, while the caller's tensor keeps its own values.",
         expect="returned Tensor and the input tensor does not hold the sum",
         patch=((RING_SPLIT, "    chunks = [c.clone() for c in torch.tensor_split(tensor.view(-1), size)]\n"),
                (RING_END, "        exchange(chunks[(rank + 1 - step) % size], chunks[(rank - step) % size])\n"
                           "    return torch.cat(chunks).view_as(tensor)"))),
    Flaw("ring_allreduce", "floor_chunks", clause="chunks", case="ring-uneven",
         why="chunks of numel // world_size elements, so when the length does not divide by the "
             "world size the last numel % world_size elements are never reduced.",
         expect="Only the last numel % world_size = 2 elements are wrong",
         patch=((RING_SPLIT + "    incoming = torch.empty_like(chunks[0])                 # chunk 0 is the longest\n",
                 """    flat = tensor.view(-1)
    n = flat.numel() // size                               # elements per chunk
    chunks = [flat[i * n:(i + 1) * n] for i in range(size)]
    incoming = torch.empty_like(chunks[0])
"""),)),
    Flaw("ring_allreduce", "split_rows", clause="any-tensor", case="ring-shape",
         why="splits the tensor along its first dimension instead of its flattened view: the "
             "same on 1-D tensors, but a (5, 7) tensor on 3 ranks travels in chunks of 2, 2 and "
             "1 rows, 14 elements where the ring sends at most 12.",
         expect="sent a message of 14 elements for a tensor of 35 elements",
         patch=((RING_SPLIT, "    chunks = torch.tensor_split(tensor, size)              # along the rows\n"),
                ("        buffer = incoming[:mine.numel()]\n", "        buffer = incoming[:len(mine)]\n"))),
    Flaw("ring_allreduce", "work_in_float32", clause="any-tensor", case="ring-float64",
         why="runs the ring on a float32 copy of the tensor (\"gradients are float32\") and copies "
             "the result back: exact for float32 tensors, but a float64 tensor comes back "
             "rounded.",
         expect="dtype float64, with 3 ranks is wrong",
         patch=((RING_SPLIT, "    flat = tensor.view(-1).float()                         # add in float32\n"
                             "    chunks = torch.tensor_split(flat, size)\n"),
                (RING_END, "        exchange(chunks[(rank + 1 - step) % size], chunks[(rank - step) % size])\n"
                           "    tensor.view(-1).copy_(flat)\n    return tensor"))),
    Flaw("ring_allreduce", "float64_buffer", clause="integers", case="ring-integer",
         why="adds in a float64 copy, which the student thought holds every number exactly: it "
             "does for floats and small integers, but int64 values beyond 2**53 come back "
             "rounded.",
         expect="a float buffer rounds them",
         patch=((RING_SPLIT, "    flat = tensor.view(-1).double()                        # add in float64\n"
                             "    chunks = torch.tensor_split(flat, size)\n"),
                (RING_END, "        exchange(chunks[(rank + 1 - step) % size], chunks[(rank - step) % size])\n"
                           "    tensor.view(-1).copy_(flat)\n    return tensor"))),
    Flaw("ring_allreduce", "torch_chunk", clause="small", case="ring-small",
         why="cuts the tensor with torch.chunk, which returns fewer than world_size chunks when "
             "the tensor has fewer elements than there are ranks (one element on 2 ranks: one "
             "chunk), so indexing chunk (rank - step - 1) % world_size fails.",
         expect="in check case 'ring-small'",
         patch=((RING_SPLIT, "    chunks = torch.chunk(tensor.view(-1), size)            # views: writes land in tensor\n"),)),
    Flaw("ring_allreduce", "chunk_all_reduce", clause="p2p-only", case="ring-p2p-only",
         why="splits the tensor into chunks but reduces each chunk with dist.all_reduce instead "
             "of passing it around the ring with send/recv.",
         expect="called dist.all_reduce inside ring_all_reduce",
         patch=(Def("ring_all_reduce", """
             def ring_all_reduce(tensor, group=None):
                 size = dist.get_world_size(group)
                 for chunk in torch.tensor_split(tensor.view(-1), size):
                     dist.all_reduce(chunk, group=group)
                 return tensor
             """),)),
    Flaw("ring_allreduce", "whole_tensor", clause="messages", case="ring-messages",
         why="the ring of the official tutorial (\"Writing Distributed Applications with "
             "PyTorch\"): the whole tensor travels around the ring world_size - 1 times, so each "
             "rank sends (world_size - 1) * numel elements instead of about 2 * numel. The sums "
             "are right.",
         expect="sent a message of 60 elements for a tensor of 60 elements",
         patch=(Def("ring_all_reduce", """
             def ring_all_reduce(tensor, group=None):
                 rank, size = dist.get_rank(), dist.get_world_size()
                 left, right = (rank - 1 + size) % size, (rank + 1) % size
                 send_buff, recv_buff, accum = tensor.clone(), tensor.clone(), tensor.clone()
                 for i in range(size - 1):
                     if i % 2 == 0:
                         send_req = dist.isend(send_buff, right)
                         dist.recv(recv_buff, left)
                         accum[:] += recv_buff[:]
                     else:
                         send_req = dist.isend(recv_buff, right)
                         dist.recv(send_buff, left)
                         accum[:] += send_buff[:]
                     send_req.wait()
                 tensor[:] = accum[:]
                 return tensor
             """),)),
    Flaw("ring_allreduce", "swapped_neighbours", clause="neighbours", case="ring-neighbours",
         why="left and right neighbours swapped: every rank sends to (rank - 1) % world_size and "
             "receives from (rank + 1) % world_size while it keeps the chunk schedule of a ring "
             "that turns the other way, so from 3 ranks on the chunks it adds are not the ones it "
             "expects. (With 2 ranks both neighbours are the same rank, so the sums there are "
             "right.)",
         expect="in check case 'ring-neighbours'",
         patch=(("    right, left = (rank + 1) % size, (rank - 1) % size\n",
                 "    left, right = (rank + 1) % size, (rank - 1) % size\n"),)),
    Flaw("ring_allreduce", "blocking_send", clause="deadlock", case="ring-deadlock",
         why="every rank first calls the blocking dist.send, then dist.recv. With gloo a send "
             "waits until the peer posts its receive, so all ranks wait for each other forever.",
         expect="With gloo, a send starts only once the peer has posted the matching receive",
         timeout=15,
         patch=((EXCHANGE, """        dist.send(send_chunk, right, group)               # send, then receive
        dist.recv(recv_into, left, group)
"""),)),
    Flaw("ring_allreduce", "ignores_group", clause="group", case="ring-group",
         why="a correct ring on the default group, but the `group` argument is ignored: rank and "
             "size come from dist.get_rank() / dist.get_world_size() and the messages go through "
             "the default group, so with a process group the ring runs over all ranks and sums "
             "every rank's tensor.",
         expect="in check case 'ring-group'",
         patch=(("    rank, size = dist.get_rank(group), dist.get_world_size(group)\n",
                 "    rank, size = dist.get_rank(), dist.get_world_size()\n"),
                ("    if group is not None:\n" + TRANSLATE, ""),
                (EXCHANGE, """        incoming = dist.irecv(recv_into, left)             # post the receive first
        outgoing = dist.isend(send_chunk, right)
        incoming.wait()
        outgoing.wait()
"""))),
    Flaw("ring_allreduce", "group_ranks_as_dst", clause="global-ranks", case="ring-group",
         why="ring positions and length come from the group, but the neighbours' group ranks "
             "are handed to isend/irecv as they are, while send/recv take global ranks: inside "
             "the group of ranks [0, 2, 3] group rank 1 is global rank 2, so rank 0 sends to rank "
             "1, which is not in its group.",
         expect="raised WrongPeer in check case 'ring-group'",
         patch=(("    if group is not None:\n" + TRANSLATE, ""),)),
    Flaw("ring_allreduce", "offset_global_rank", clause="any-group", case="ring-group",
         why="translates group ranks to global ranks by adding the global rank of the group's "
             "first member, as if a group's ranks were consecutive: right for ranks [1, 2, 3], "
             "wrong for ranks [0, 2, 3].",
         expect="raised WrongPeer in check case 'ring-group'",
         patch=((TRANSLATE, "        first = dist.get_global_rank(group, 0)             # the group's ranks follow it\n"
                            "        right, left = first + right, first + left\n"),)),
    # ------------------------------------------------------------------ partition
    Flaw("partition", "n_zero_empty", clause="n", case="sizes-sum-one",
         why="returns an empty list for an empty dataset (\"nothing to split\"), where there are "
             "still len(fractions) parts, all empty.",
         expect="partition_sizes(0, [0.5, 0.5]) returned []; expected [0, 0]",
         patch=(("    fractions = [float(f) for f in fractions]\n",
                 "    if n == 0:\n        return []                                          # nothing to split\n"
                 "    fractions = [float(f) for f in fractions]\n"),)),
    Flaw("partition", "zero_fraction_refused", clause="fractions", case="sizes-sum-one",
         why="refuses fractions that are not positive, so a part of fraction 0 (allowed: the "
             "fractions are non-negative) raises ValueError.",
         expect="partition_sizes(13, [0, 1]) raised ValueError",
         patch=(("    if any(f < 0 for f in fractions):\n", "    if any(f <= 0 for f in fractions):\n"),)),
    Flaw("partition", "drop_remainder", clause="every-sample", case="sizes-sum-one",
         why="part sizes are int(f * n), as in the seed; the samples left over are silently "
             "dropped.",
         expect="partition_sizes(11, [0.5, 0.5]) returned [5, 5]; expected [6, 5]",
         patch=(Def("partition_sizes", """
             def partition_sizes(n, fractions):
                 if any(f < 0 for f in fractions) or sum(fractions) > 1 + 1e-9:
                     raise ValueError(f"bad fractions {fractions}")
                 return [int(f * n) for f in fractions]
             """),)),
    Flaw("partition", "ties_to_higher_index", clause="left-over", case="sizes-sum-one",
         why="hands the samples left over to the largest fractional parts, but breaks ties "
             "towards the higher index (a descending sort of (remainder, index) pairs).",
         expect="partition_sizes(11, [0.5, 0.5]) returned [5, 6]",
         patch=(("key=lambda i: (-(exact[i] - sizes[i]), i))", "key=lambda i: (-(exact[i] - sizes[i]), -i))"),)),
    Flaw("partition", "largest_fraction_first", clause="left-over", case="sizes-sum-one",
         why="hands the samples left over to the parts with the largest fractions instead of the "
             "largest fractional parts f * n - floor(f * n).",
         expect="partition_sizes(9, [0.1, 0.6, 0.3]) returned [0, 6, 3]",
         patch=(("key=lambda i: (-(exact[i] - sizes[i]), i))", "key=lambda i: (-fractions[i], i))"),)),
    Flaw("partition", "rounds", clause="floor", case="sizes-sum-one",
         why="rounds f * n to the nearest integer instead of flooring it, then hands out "
             "n - sum(sizes) samples, a negative number when the rounding went up.",
         expect="partition_sizes(11, [0.5, 0.5]) returned",
         patch=(("    sizes = [math.floor(e) for e in exact]\n", "    sizes = [round(e) for e in exact]\n"),)),
    Flaw("partition", "float_sizes", clause="floor", case="sizes-int",
         why="the same rule in numpy, returned with tolist(): np.floor keeps the float dtype, so "
             "the sizes have the right values but are floats (5.0), not the list[int] the "
             "docstring returns.",
         expect="of ['float'] values",
         patch=(Def("partition_sizes", """
             def partition_sizes(n, fractions):
                 import numpy as np
                 fractions = np.asarray(fractions, dtype=float)
                 if (fractions < 0).any() or fractions.sum() > 1 + 1e-9:
                     raise ValueError(f"bad fractions {fractions}")
                 exact = fractions * n
                 sizes = np.floor(exact)
                 if abs(fractions.sum() - 1) <= 1e-9:
                     order = np.lexsort((np.arange(len(sizes)), -(exact - sizes)))
                     sizes[order[:int(n - sizes.sum())]] += 1
                 return sizes.tolist()
             """),)),
    Flaw("partition", "always_distribute", clause="rest-left-out", case="sizes-below-one",
         why="hands out the samples left over whenever the fractions are valid, so fractions "
             "that sum to less than 1 still use every sample.",
         expect="partition_sizes(10, [0.25, 0.25]) returned",
         patch=(("    if abs(total - 1) <= 1e-9:\n",
                 "    if total <= 1 + 1e-9:                                  # use every sample\n"),)),
    Flaw("partition", "sum_exactly_one", clause="near-one", case="sizes-near-one",
         why="the samples left over are given out only when the fractions sum to exactly 1.0, "
             "so fractions like [0.1] * 10 (whose float sum is 0.9999999999999999) lose them: 7 "
             "samples in 10 parts of 0.1 give ten empty parts.",
         expect="partition_sizes(7, [0.1, 0.1",
         patch=(("    if abs(total - 1) <= 1e-9:\n", "    if total == 1:\n"),)),
    Flaw("partition", "isclose_default", clause="near-one", case="sizes-near-one",
         why="tests \"sums to 1\" with math.isclose at a relative tolerance of 1e-6, wider than "
             "the docstring's 1e-9: fractions 2e-9 short of 1 get the samples left over.",
         expect="partition_sizes(10, [0.5, 0.499999998]) returned [5, 5]; expected [5, 4]",
         patch=(("    if abs(total - 1) <= 1e-9:\n", "    if math.isclose(total, 1, rel_tol=1e-6):\n"),)),
    Flaw("partition", "negative_fraction", clause="raises", case="sizes-raises",
         why="only a sum above 1 is refused; a negative fraction passes as long as the sum is "
             "not above 1 ([-0.5, 0.5, 1.0] sums to 1.0) and gives a part of negative size.",
         expect="partition_sizes(10, [-0.5, 0.5, 1]) returned",
         patch=(("    if any(f < 0 for f in fractions):\n"
                 "        raise ValueError(f\"fractions must be non-negative, got {fractions}\")\n",
                 ""),)),
    Flaw("partition", "assert_not_valueerror", clause="raises", case="sizes-raises",
         why="checks the sum with an assert, which raises AssertionError (and nothing at all "
             "under python -O), not the documented ValueError.",
         expect="raised AssertionError; it must raise ValueError",
         patch=(("    if total > 1 + 1e-9:\n        raise ValueError(f\"fractions sum to {total} > 1: {fractions}\")\n",
                 "    assert total <= 1 + 1e-9, f\"fractions sum to {total} > 1\"\n"),)),
    Flaw("partition", "loose_upper_bound", clause="raises", case="sizes-raises",
         why="allows a rounding slack of 1e-6 above 1 before refusing the fractions, so a sum of "
             "1 + 2e-9 (more than 1 + 1e-9) is accepted.",
         expect="partition_sizes(10, [0.5, 0.500000002]) returned",
         patch=(("    if total > 1 + 1e-9:\n", "    if total > 1 + 1e-6:                                   # rounding slack\n"),)),
    Flaw("partition", "data_is_a_tensor", clause="data", case="parts-sizes",
         why="takes the number of samples from data.size(0), as for a tensor: a dataset that "
             "only has len() fails.",
         expect="raised AttributeError",
         patch=(("        indices = list(range(len(data)))\n",
                 "        indices = list(range(data.size(0)))                # the number of samples\n"),)),
    Flaw("partition", "own_rounding", clause="sizes", case="parts-sizes",
         why="DataPartitioner computes its part sizes as int(f * len(data)) itself instead of "
             "calling partition_sizes, so it drops the samples left over again.",
         expect="made parts of sizes [42, 18]; expected partition_sizes(61, [0.7, 0.3]) = [43, 18]",
         patch=(("        for size in partition_sizes(len(data), sizes):\n",
                 "        for size in [int(f * len(data)) for f in sizes]:\n"),)),
    Flaw("partition", "independent_samples", clause="disjoint", case="parts-disjoint",
         why="draws each part as its own random sample of the indices, so parts overlap (and "
             "some indices are in none).",
         expect="the parts must hold distinct indices",
         patch=(("""        indices = list(range(len(data)))
        random.Random(seed).shuffle(indices)
        self.partitions, start = [], 0
        for size in partition_sizes(len(data), sizes):
            self.partitions.append(indices[start:start + size])
            start += size
""", """        rng = random.Random(seed)
        self.partitions = [rng.sample(range(len(data)), size)
                           for size in partition_sizes(len(data), sizes)]
"""),)),
    Flaw("partition", "use_returns_indices", clause="use", case="parts-use",
         why="use(i) returns the indices of part i instead of a Partition of the data.",
         expect="use(i)[j] must be data[partitions[i][j]]",
         patch=(("        return Partition(self.data, self.partitions[i])\n",
                 "        return self.partitions[i]\n"),)),
    Flaw("partition", "not_shuffled", clause="next-indices", case="parts-shuffled",
         why="no shuffle: the parts are consecutive index ranges (label-sorted data would give "
             "each rank only some classes).",
         expect="is not shuffled",
         patch=((SHUFFLE, ""),)),
    Flaw("partition", "unseeded_shuffle", clause="private", case="parts-same-on-ranks",
         why="shuffles with the global random.shuffle and never uses the seed: each rank's "
             "partition depends on its own global random state.",
         expect="process 0 and process 1 computed different partitions",
         patch=((SHUFFLE, "        random.shuffle(indices)\n"),)),
    Flaw("partition", "global_rng", clause="own-generator", case="parts-rng-kept",
         why="same partition on every rank, but it reseeds the global random module "
             "(random.seed), which changes the random state of the rest of the training program.",
         expect="changed the global random state",
         patch=((SHUFFLE, "        random.seed(seed)\n        random.shuffle(indices)\n"),)),
    Flaw("partition", "torch_manual_seed", clause="own-generator", case="parts-rng-kept",
         why="shuffles with torch.randperm after torch.manual_seed(seed): the same partition on "
             "every rank, but torch's global generator is reseeded for the whole program.",
         expect="changed the global random state",
         patch=((SHUFFLE, "        torch.manual_seed(seed)\n"
                          "        indices = torch.randperm(len(data)).tolist()\n"),)),
    Flaw("partition", "ignores_seed", clause="seed", case="parts-seed",
         why="shuffles with the tutorial's fixed seed 1234 whatever seed is given.",
         expect="seeds 1234 and 99 gave the same partitions",
         patch=((SHUFFLE, "        random.Random(1234).shuffle(indices)               # the tutorial's seed\n"),)),
    Flaw("partition", "label_groups_last_larger", clause="groups", case="labels-groups",
         why="len(distinct) // num_partitions labels per group, the last group taking the labels "
             "left over: with 10 labels and 3 parts the groups are 0-2, 3-5, 6-9 instead of 0-3, "
             "4-6, 7-9.",
         expect="contiguous groups as equal as possible",
         patch=(("    base, extra = divmod(len(distinct), num_partitions)\n    group, start = {}, 0\n",
                 "    per = len(distinct) // num_partitions\n    group = {}\n"),
                ("        stop = start + base + (r < extra)\n"
                 "        group.update({label: r for label in distinct[start:stop]})\n"
                 "        start = stop\n",
                 "        stop = len(distinct) if r == num_partitions - 1 else (r + 1) * per   # last: the rest\n"
                 "        group.update({label: r for label in distinct[r * per:stop]})\n"))),
    Flaw("partition", "drops_empty_parts", clause="num-partitions", case="labels-groups",
         why="leaves out the parts whose group of labels is empty, so with more parts than "
             "distinct labels it returns fewer than num_partitions parts.",
         expect="label_partitions(labels, 3) with labels [4, 8, 4, 8]",
         patch=(("        parts[group[label]].append(i)\n    return parts\n",
                 "        parts[group[label]].append(i)\n"
                 "    return [part for part in parts if part]                # no empty parts\n"),)),
    Flaw("partition", "tensor_elements", clause="labels", case="labels-tensor",
         why="takes list(labels): for a tensor its elements are 0-d tensors, which hash by "
             "identity, so set() sees every sample's label as a new distinct label.",
         expect="labels may be a tensor",
         patch=(("    labels = [int(v) for v in (labels.tolist() if torch.is_tensor(labels) else labels)]\n",
                 "    labels = list(labels)                                  # a list, or a tensor's elements\n"),)),
    Flaw("partition", "indices_by_label", clause="increasing", case="labels-order",
         why="collects the indices label by label, so a part holds first all samples of its "
             "first label, then those of the next: the right indices, not in increasing order.",
         expect="in increasing order",
         patch=(("    for i, label in enumerate(labels):\n        parts[group[label]].append(i)\n",
                 "    for label in distinct:\n"
                 "        parts[group[label]] += [i for i, v in enumerate(labels) if v == label]\n"),)),
    Flaw("partition", "label_parts_numpy", clause="lists", case="labels-type",
         why="finds each part's samples with numpy.flatnonzero and list()s them: the right "
             "indices in the right order, but numpy integers, not the ints of list[list[int]].",
         expect="holding ['int64']",
         patch=(("    for i, label in enumerate(labels):\n        parts[group[label]].append(i)\n",
                 "    import numpy as np\n"
                 "    owner = np.array([group[v] for v in labels], dtype=np.int64)\n"
                 "    parts = [list(np.flatnonzero(owner == r)) for r in range(num_partitions)]\n"),)),
    Flaw("partition", "sizes_numpy_floor", clause="floor", case="sizes-int",
         why="floors all the sizes at once with numpy (np.floor(...).astype(np.int64)) and "
             "returns list() of that: the right sizes, as numpy integers, not list[int].",
         expect="['int64'] values",
         patch=(("    sizes = [math.floor(e) for e in exact]\n",
                 "    import numpy as np\n"
                 "    sizes = list(np.floor(np.array(exact, dtype=float)).astype(np.int64))\n"),)),
    # ------------------------------------------------------------------ average_gradients
    Flaw("average_gradients", "plain_mean", clause="weighted", case="avg-values",
         why="the plain average sum_r g_r / world_size, ignoring that ranks hold different "
             "numbers of samples (right only for equal partitions).",
         expect="Your gradients are the plain average",
         patch=((AVG_BODY, """    world_size = dist.get_world_size(group)
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)
            p.grad /= world_size
"""),)),
    Flaw("average_gradients", "world_size_divisor", clause="returns", case="avg-values",
         why="weights each rank's gradient by its sample count n_r, but divides the sum by the "
             "number of ranks instead of by the total number of samples N.",
         expect="divided by world_size instead of by N",
         patch=((AVG_BODY, """    world_size = dist.get_world_size(group)
    for p in model.parameters():
        if p.grad is not None:
            p.grad *= num_samples
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)
            p.grad /= world_size
"""),)),
    Flaw("average_gradients", "first_only", clause="returns", case="avg-values",
         why="the weighting is right, but a misplaced return leaves the loop after the first "
             "parameter, so the other gradients stay local (and the replicas drift apart).",
         expect="every parameter's gradient must be reduced",
         patch=((AVG_BODY, """    total = torch.tensor([float(num_samples)])
    dist.all_reduce(total, group=group)
    for p in model.parameters():
        if p.grad is not None:
            p.grad *= num_samples / total.item()
            dist.all_reduce(p.grad, group=group)
            return
"""),)),
    Flaw("average_gradients", "assumes_equal_counts", clause="may-differ", case="avg-values",
         why="weights each gradient by its rank's n_r but takes N = n_r * world_size from the "
             "local count instead of all-reducing it, as if every rank held as many samples as "
             "this one.",
         expect="every gradient differs by the same factor",
         patch=(("    total = flat[-1]\n", "    total = num_samples * dist.get_world_size(group)\n"),)),
    Flaw("average_gradients", "zero_fills_none", clause="skipped", case="avg-no-grad",
         why="parameters without a gradient get a zero gradient (so that every rank's flat "
             "buffer has the same layout), which gives frozen parameters a gradient they must "
             "not have.",
         expect="leave their .grad None",
         patch=((AVG_PARAMS, """    params = list(model.parameters())
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
"""),)),
    Flaw("average_gradients", "zero_fills_trainable", clause="skipped", case="avg-no-grad",
         why="gives every trainable parameter without a gradient a zero one (what a Join shadow "
             "step does): frozen ones stay None, but a layer the forward did not use now has a "
             "gradient, which weight decay or momentum would act on.",
         expect="'unused.bias', 'unused.weight'",
         patch=((AVG_PARAMS, """    for p in model.parameters():                           # the same layout everywhere
        if p.grad is None and p.requires_grad:
            p.grad = torch.zeros_like(p)
""" + AVG_PARAMS),)),
    Flaw("average_gradients", "view_flat", clause="any-model", case="avg-model",
         why="flattens each gradient with view(-1), which fails on a parameter stored "
             "transposed (its gradient is not contiguous).",
         expect="in check case 'avg-model'",
         patch=((AVG_FLAT, AVG_FLAT.replace("p.grad.reshape(-1)", "p.grad.view(-1)")),)),
    Flaw("average_gradients", "requires_grad_filter", clause="any-model", case="avg-model",
         why="takes the parameters that require a gradient instead of those that have one, so "
             "a layer the forward did not use (grad None) crashes the flattening.",
         expect="in check case 'avg-model'",
         patch=((AVG_PARAMS, "    params = [p for p in model.parameters() if p.requires_grad]\n"),)),
    Flaw("average_gradients", "params_found_once", clause="varying", case="avg-varying",
         why="finds the parameters that have a gradient at the first call and keeps that list "
             "on the model for the later calls (\"the model does not change\"): a layer the "
             "first step skipped, or one frozen then, is never averaged afterwards.",
         expect="must be sum_r (n_r / N) * g_r. Which parameters have a gradient may change",
         patch=((AVG_PARAMS, """    if not hasattr(model, "_with_grad"):           # found once: the model does not change
        model._with_grad = [p for p in model.parameters() if p.grad is not None]
    params = model._with_grad
"""),)),
    Flaw("average_gradients", "float32_buffer", clause="any-model", case="avg-float64",
         why="reduces the gradients in a float32 buffer (\"gradients are float32\") and copies "
             "them back: exact on a float32 model, rounded on a float64 one.",
         expect="a float64 EdgeNet",
         patch=((AVG_FLAT, AVG_FLAT.replace("[count])", "[count]).float()")),)),
    Flaw("average_gradients", "zero_samples_return", clause="zero-samples", case="avg-empty-rank",
         why="a rank without samples returns at once (\"it has nothing to contribute\"), so the "
             "others' all_reduce is matched by its next step's, or never.",
         expect="average_gradients, case avg-empty-rank: hung", timeout=20,
         patch=((AVG_PARAMS, "    if num_samples == 0:\n"
                             "        return                                             # nothing to contribute\n"
                 + AVG_PARAMS),)),
    Flaw("average_gradients", "ignores_group", clause="group", case="avg-group",
         why="the weighted average is right on the default group, but the all_reduce ignores "
             "the `group` argument: with a process group it averages over every rank instead of "
             "the group's.",
         expect="averaged over all 3 ranks",
         patch=(("    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)\n",
                 "    dist.all_reduce(flat, op=dist.ReduceOp.SUM)\n"),)),
    # ------------------------------------------------------------------ sync_batchnorm
    Flaw("sync_batchnorm", "local_stats", clause="global-stats", case="bn-output",
         why="normalises with the statistics of the local batch only (what plain nn.BatchNorm "
             "does on each rank): no communication at all.",
         expect="plain BatchNorm on the local batch",
         patch=(Def("DistributedBatchNorm.forward", """
             def forward(self, x):
                 self._check_input_dim(x)
                 if not self.training and self.track_running_stats:
                     return F.batch_norm(x, self.running_mean, self.running_var, self.weight,
                                         self.bias, False, 0.0, self.eps)
                 # Plain BatchNorm on this rank's batch: updates the running statistics too.
                 return F.batch_norm(x, self.running_mean, self.running_var, self.weight,
                                     self.bias, True, 0.1 if self.momentum is None else
                                     self.momentum, self.eps)
             """),)),
    Flaw("sync_batchnorm", "mean_of_means", clause="global-stats", case="bn-output",
         why="every rank computes its local mean and biased variance, and the ranks average "
             "them (one all_reduce, divided by the world size): right only when every rank holds "
             "as many samples, and the average of the variances misses the spread between the "
             "ranks' means.",
         expect="unweighted average of the ranks' means and variances",
         patch=((BN_STATS, """        stats = torch.cat([x.mean(dims), x.var(dims, unbiased=False)])
        ranks = 1
"""),
                ("""        total = stats[-1]
        mean = stats[:channels] / total
        var = stats[channels:2 * channels] / total - mean * mean      # biased
""", """            count = dist.get_world_size(group) * count       # for the running variance
            ranks = dist.get_world_size(group)
        total = count[0]
        mean = stats[:channels] / ranks
        var = stats[channels:] / ranks                                # biased
"""))),
    Flaw("sync_batchnorm", "count_without_positions", clause="global-stats", case="bn-spatial",
         why="counts samples times positions only for images (N, C, H, W); for an (N, C, L) "
             "input the count is N while the sums run over the L positions too, so the mean is "
             "L times too large.",
         expect="(N, C, L)",
         patch=(("        count = x.new_tensor([x.numel() // channels])\n", """        if x.dim() == 4:                                   # images: samples x positions
            count = x.new_tensor([x.size(0) * x.size(2) * x.size(3)])
        else:
            count = x.new_tensor([x.size(0)])
"""),)),
    Flaw("sync_batchnorm", "dims_2d_or_4d", clause="inputs", case="bn-spatial",
         why="sums over dims (0, 2, 3) for images and over dim 0 otherwise, as if BatchNorm1d "
             "only took (N, C): an (N, C, L) input leaves an (C, L) sum that does not fit.",
         expect="in check case 'bn-spatial'",
         patch=(("        dims = [0] + list(range(2, x.dim()))\n",
                 "        dims = [0, 2, 3] if x.dim() == 4 else [0]           # (N, C, H, W) or (N, C)\n"),)),
    Flaw("sync_batchnorm", "momentum_none_as_default", clause="momentum-none", case="bn-momentum",
         why="momentum=None is replaced by the default 0.1, where nn.BatchNorm then keeps a "
             "cumulative average (factor 1 / num_batches_tracked): the running statistics move "
             "too slowly.",
         expect="momentum=None",
         patch=((BN_MOMENTUM, "                m = 0.1 if self.momentum is None else self.momentum\n"),)),
    Flaw("sync_batchnorm", "momentum_ignored", clause="as-batchnorm", case="bn-momentum",
         why="uses nn.BatchNorm's default momentum 0.1 whatever momentum the layer was given "
             "(None is handled): a layer built with momentum=0.3 moves its statistics too "
             "slowly.",
         expect="momentum=0.3",
         patch=((BN_MOMENTUM, """                m = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                     else 0.1)
"""),)),
    Flaw("sync_batchnorm", "weight_without_affine", clause="as-batchnorm", case="bn-no-stats",
         why="always scales and shifts by weight and bias, which do not exist (None) in a layer "
             "built with affine=False.",
         expect="in check case 'bn-no-stats'",
         patch=(("""        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
""", """        y = y * self.weight.view(shape) + self.bias.view(shape)
"""),)),
    Flaw("sync_batchnorm", "eval_local_without_stats", clause="no-stats", case="bn-no-stats",
         why="communicates only while training: a layer without running statistics "
             "(track_running_stats=False) in eval mode normalises with its local batch, where it "
             "must use the global batch's statistics as in training.",
         expect="eval-mode output",
         patch=(("        if dist.is_available() and dist.is_initialized():\n",
                 "        if self.training and dist.is_initialized():        # communicate while training\n"),)),
    Flaw("sync_batchnorm", "plain_all_reduce", clause="differentiable", case="bn-backward",
         why="the in-place dist.all_reduce instead of the differentiable one: the forward is "
             "right, but autograd does not see the collective (it treats the global sums as the "
             "local ones), so the other ranks' loss terms never reach this rank's input "
             "gradients.",
         expect="the all_reduce must be differentiable",
         patch=((BN_REDUCE, "            dist.all_reduce(stats, group=group)    # in place\n"),)),
    Flaw("sync_batchnorm", "detached_stats", clause="differentiable", case="bn-backward",
         why="all-reduces a detached copy of the statistics (\"statistics are not trained\"): "
             "the forward is right, but the gradient no longer flows through the mean and "
             "variance.",
         expect="input.grad",
         patch=((BN_REDUCE, "            stats = dist_nn.all_reduce(stats.detach(), group=group)\n"),)),
    Flaw("sync_batchnorm", "eps_outside_sqrt", clause="output", case="bn-eps",
         why="divides by sqrt(var) + eps instead of sqrt(var + eps): the same wherever the "
             "variance is large, far off for a channel whose variance is about eps.",
         expect="channel 0 nearly constant",
         patch=(("        y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)\n",
                 "        y = (x - mean.view(shape)) / (var.view(shape).sqrt() + self.eps)\n"),)),
    Flaw("sync_batchnorm", "empty_batch_nan", clause="local-sizes", case="bn-empty-rank",
         why="each rank first takes its local mean and mean of squares, then the all_reduce "
             "weights them by the local count: exact, except that an empty batch's mean is NaN "
             "(0 * NaN is NaN), which spreads to every rank.",
         expect="local batch sizes [3, 0, 4]",
         patch=((BN_STATS, """        local_mean, local_sq = x.mean(dims), (x * x).mean(dims)   # this rank's statistics
        stats = torch.cat([local_mean * count, local_sq * count, count])
"""),)),
    Flaw("sync_batchnorm", "float32_stats", clause="dtype", case="bn-float64",
         why="computes the statistics in float32 (\"BatchNorm runs in float32\"): exact for "
             "float32 inputs, but a float64 layer normalises with rounded statistics.",
         expect="float64 inputs",
         patch=((BN_STATS, "        stats = torch.cat([x.sum(dims), (x * x).sum(dims), count]).float()\n"),)),
    Flaw("sync_batchnorm", "biased_running_var", clause="running", case="bn-running",
         why="the forward is right, but the running variance is updated with the biased batch "
             "variance (divided by N) where nn.BatchNorm uses the unbiased one (divided by "
             "N - 1).",
         expect="running_var",
         patch=(("                unbiased = var.detach() * total / (total - 1)\n",
                 "                unbiased = var.detach()\n"),)),
    Flaw("sync_batchnorm", "no_eval_branch", clause="eval", case="bn-eval",
         why="the given eval-mode lines were dropped when the forward was rewritten: in eval "
             "mode the layer normalises with the statistics of the batch it is given, not with "
             "the running ones.",
         expect="eval-mode output",
         patch=(("""        if not self.training and self.track_running_stats:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight,
                                self.bias, False, 0.0, self.eps)
""", ""),)),
    Flaw("sync_batchnorm", "ignores_group", clause="group", case="bn-group",
         why="right on the default group, but the all_reduce ignores self.group (which "
             "convert_batchnorm hands to every layer): with a process group the statistics span "
             "every rank's batch instead of the group's.",
         expect="normalised with the statistics of all 3 ranks",
         patch=(("            group = dist.group.WORLD if self.group is None else self.group\n"
                 + BN_REDUCE, "            stats = dist_nn.all_reduce(stats)\n"),)),
]
