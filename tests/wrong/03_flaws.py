"""Known-wrong files of notebook 03, as patches of the solution (see tests/flaws.py)."""
from flaws import Def, Flaw  # noqa: F401

FLAWS = [
    Flaw('average_gradients', 'assumes_equal_counts', clause='return-rank-s', case='?',
         why=("weights each gradient by its rank's n_r but takes N = n_r * world_size from the local "
              'count instead of all-reducing it, as if every rank held as many samples as this one.'),
         patch=(
             ("""    total = flat[-1]
""",
              """    total = num_samples * dist.get_world_size(group)
"""),
         )),
    Flaw('average_gradients', 'first_only', clause='return-rank-s', case='?',
         why=('the weighting is right, but a misplaced return leaves the loop after the first '
              'parameter, so the other gradients stay local (and the replicas drift apart).'),
         patch=(
             ("""    params = [p for p in model.parameters() if p.grad is not None]
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
""",
              """    total = torch.tensor([float(num_samples)])
    dist.all_reduce(total, group=group)
    for p in model.parameters():
        if p.grad is not None:
            p.grad *= num_samples / total.item()
            dist.all_reduce(p.grad, group=group)
            return
"""),
         )),
    Flaw('average_gradients', 'ignores_group', clause='average-over-ranks', case='?',
         why=('the weighted average is right on the default group, but the all_reduce ignores the '
              '`group` argument: with a process group it averages over every rank instead of the '
              "group's."),
         patch=(
             ("""    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
""",
              """    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
"""),
         )),
    Flaw('average_gradients', 'plain_mean', clause='return-rank-s', case='?',
         why=('the plain average sum_r g_r / world_size, ignoring that ranks hold different numbers of '
              'samples (right only for equal partitions).'),
         patch=(
             ("""    params = [p for p in model.parameters() if p.grad is not None]
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
""",
              """    world_size = dist.get_world_size(group)
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)
            p.grad /= world_size
"""),
         )),
    Flaw('average_gradients', 'world_size_divisor', clause='return-rank-s', case='?',
         why=("weights each rank's gradient by its sample count n_r, but divides the sum by the number "
              'of ranks instead of by the total number of samples N.'),
         patch=(
             ("""    params = [p for p in model.parameters() if p.grad is not None]
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
""",
              """    world_size = dist.get_world_size(group)
    for p in model.parameters():
        if p.grad is not None:
            p.grad *= num_samples
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)
            p.grad /= world_size
"""),
         )),
    Flaw('average_gradients', 'zero_fills_none', clause='parameters-whose-grad', case='?',
         why=("parameters without a gradient get a zero gradient (so that every rank's flat buffer has "
              'the same layout), which gives frozen parameters a gradient they must not have.'),
         patch=(
             ("""    params = [p for p in model.parameters() if p.grad is not None]
""",
              """    params = list(model.parameters())
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
"""),
         )),
    Flaw('partition', 'drop_remainder', clause='samples-left-over', case='?',
         why='part sizes are int(f * n), as in the seed; the samples left over are silently dropped.',
         patch=(
             ("""    if any(f < 0 for f in fractions):
        raise ValueError(f"fractions must be non-negative, got {fractions}")
    total = sum(fractions)
    if total > 1 + 1e-9:
        raise ValueError(f"fractions sum to {total} > 1: {fractions}")
    exact = [f * n for f in fractions]
    sizes = [math.floor(e) for e in exact]
    if abs(total - 1) <= 1e-9:
        left = n - sum(sizes)
        order = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - sizes[i]), i))
        for i in order[:left]:
            sizes[i] += 1
    return sizes
""",
              """    if any(f < 0 for f in fractions) or sum(fractions) > 1 + 1e-9:
        raise ValueError(f"bad fractions {fractions}")
    return [int(f * n) for f in fractions]
"""),
         )),
    Flaw('partition', 'global_rng', clause='shuffle-uses-own', case='?',
         why=('same partition on every rank, but it reseeds the global random module (random.seed), '
              'which changes the random state of the rest of the training program.'),
         patch=(
             ("""        random.Random(seed).shuffle(indices)
""",
              """        random.seed(seed)
        random.shuffle(indices)
"""),
         )),
    Flaw('partition', 'label_groups_last_larger', clause='sorted-distinct-labels', case='?',
         why=('len(distinct) // num_partitions labels per group, the last group taking the labels left '
              'over: with 10 labels and 3 parts the groups are 0-2, 3-5, 6-9 instead of 0-3, 4-6, 7-9.'),
         patch=(
             ("""    base, extra = divmod(len(distinct), num_partitions)
    group, start = {}, 0
""",
              """    per = len(distinct) // num_partitions
    group = {}
"""),
             ("""        stop = start + base + (r < extra)
        group.update({label: r for label in distinct[start:stop]})
        start = stop
""",
              """        stop = len(distinct) if r == num_partitions - 1 else (r + 1) * per   # last: the rest
        group.update({label: r for label in distinct[r * per:stop]})
"""),
         )),
    Flaw('partition', 'negative_fraction', clause='valueerror-fraction-negative', case='?',
         why=('only a sum above 1 is refused; a negative fraction passes as long as the sum is not '
              'above 1 ([-0.5, 0.5, 1.0] sums to 1.0) and gives a part of negative size.'),
         patch=(
             ("""    if any(f < 0 for f in fractions):
        raise ValueError(f"fractions must be non-negative, got {fractions}")
""",
              ''),
         )),
    Flaw('partition', 'not_shuffled', clause='part-i-holds', case='?',
         why=('no shuffle: the parts are consecutive index ranges (label-sorted data would give each '
              'rank only some classes).'),
         patch=(
             ("""        random.Random(seed).shuffle(indices)
""",
              ''),
         )),
    Flaw('partition', 'sum_exactly_one', clause='sum-within-1e', case='?',
         why=('the samples left over are given out only when the fractions sum to exactly 1.0, so '
              'fractions like [0.1] * 10 (whose float sum is 0.9999999999999999) lose them: 7 samples '
              'in 10 parts of 0.1 give ten empty parts.'),
         patch=(
             ("""    if abs(total - 1) <= 1e-9:
""",
              """    if total == 1:
"""),
         )),
    Flaw('ring_allreduce', 'blocking_send', clause='gloo-send-starts', case='?',
         why=('every rank first calls the blocking dist.send, then dist.recv. With gloo a send waits '
              'until the peer posts its receive, so all ranks wait for each other forever.'),
         timeout=15,
         patch=(
             ("""    if size == 1:
        return tensor
""",
              ''),
             ("""    if group is not None:
        right, left = dist.get_global_rank(group, right), dist.get_global_rank(group, left)
    chunks = torch.tensor_split(tensor.view(-1), size)     # views: writes land in tensor
    incoming = torch.empty_like(chunks[0])                 # chunk 0 is the longest

    def exchange(send_chunk, recv_into):
        incoming = dist.irecv(recv_into, left, group)      # post the receive first
        outgoing = dist.isend(send_chunk, right, group)    # then the send; neither blocks
        incoming.wait()
        outgoing.wait()

    for step in range(size - 1):                           # reduce-scatter
""",
              """    chunks = torch.tensor_split(tensor.view(-1), size)
    incoming = torch.empty_like(chunks[0])
    for step in range(size - 1):
"""),
             ("""        exchange(chunks[(rank - step) % size], buffer)
""",
              """        dist.send(chunks[(rank - step) % size], right)
        dist.recv(buffer, left)
"""),
             ("""    for step in range(size - 1):                           # all-gather
        exchange(chunks[(rank + 1 - step) % size], chunks[(rank - step) % size])
""",
              """    for step in range(size - 1):
        dist.send(chunks[(rank + 1 - step) % size], right)
        dist.recv(chunks[(rank - step) % size], left)
"""),
         )),
    Flaw('ring_allreduce', 'chunk_all_reduce', clause='only-dist-send', case='?',
         why=('splits the tensor into chunks but reduces each chunk with dist.all_reduce instead of '
              'passing it around the ring with send/recv.'),
         patch=(
             ("""    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if size == 1:
        return tensor
    right, left = (rank + 1) % size, (rank - 1) % size
    if group is not None:
        right, left = dist.get_global_rank(group, right), dist.get_global_rank(group, left)
    chunks = torch.tensor_split(tensor.view(-1), size)     # views: writes land in tensor
    incoming = torch.empty_like(chunks[0])                 # chunk 0 is the longest

    def exchange(send_chunk, recv_into):
        incoming = dist.irecv(recv_into, left, group)      # post the receive first
        outgoing = dist.isend(send_chunk, right, group)    # then the send; neither blocks
        incoming.wait()
        outgoing.wait()

    for step in range(size - 1):                           # reduce-scatter
        mine = chunks[(rank - step - 1) % size]
        buffer = incoming[:mine.numel()]
        exchange(chunks[(rank - step) % size], buffer)
        mine.add_(buffer)
    for step in range(size - 1):                           # all-gather
        exchange(chunks[(rank + 1 - step) % size], chunks[(rank - step) % size])
""",
              """    size = dist.get_world_size(group)
    for chunk in torch.tensor_split(tensor.view(-1), size):
        dist.all_reduce(chunk, group=group)
"""),
         )),
    Flaw('ring_allreduce', 'floor_chunks', clause='tensor-itself-holding', case='?',
         why=('chunks of numel // world_size elements, so when the length does not divide by the world '
              'size the last numel % world_size elements are never reduced.'),
         patch=(
             ("""    if size == 1:
        return tensor
""",
              ''),
             ("""    if group is not None:
        right, left = dist.get_global_rank(group, right), dist.get_global_rank(group, left)
    chunks = torch.tensor_split(tensor.view(-1), size)     # views: writes land in tensor
    incoming = torch.empty_like(chunks[0])                 # chunk 0 is the longest

    def exchange(send_chunk, recv_into):
        incoming = dist.irecv(recv_into, left, group)      # post the receive first
        outgoing = dist.isend(send_chunk, right, group)    # then the send; neither blocks
        incoming.wait()
        outgoing.wait()

    for step in range(size - 1):                           # reduce-scatter
""",
              """    flat = tensor.view(-1)
    n = flat.numel() // size
    chunks = [flat[i * n:(i + 1) * n] for i in range(size)]
    buffer = torch.empty_like(chunks[0])
    for step in range(size - 1):
"""),
             ("""        buffer = incoming[:mine.numel()]
        exchange(chunks[(rank - step) % size], buffer)
""",
              """        req = dist.isend(chunks[(rank - step) % size], right)
        dist.recv(buffer, left)
        req.wait()
"""),
             ("""    for step in range(size - 1):                           # all-gather
        exchange(chunks[(rank + 1 - step) % size], chunks[(rank - step) % size])
""",
              """    for step in range(size - 1):
        req = dist.isend(chunks[(rank + 1 - step) % size], right)
        dist.recv(chunks[(rank - step) % size], left)
        req.wait()
"""),
         )),
    Flaw('ring_allreduce', 'group_ranks_as_dst', clause='send-recv-take', case='?',
         why=("ring positions and length come from the group, but the neighbours' group ranks are "
              'handed to isend/recv as they are, while send/recv take global ranks: inside a group of '
              'ranks [1, 2, 3] group rank 0 is global rank 1, so messages go to the wrong processes (or'
              ' to none).'),
         patch=(
             ("""    if group is not None:
        right, left = dist.get_global_rank(group, right), dist.get_global_rank(group, left)
""",
              ''),
             ("""        incoming = dist.irecv(recv_into, left, group)      # post the receive first
        outgoing = dist.isend(send_chunk, right, group)    # then the send; neither blocks
        incoming.wait()
        outgoing.wait()
""",
              """        request = dist.isend(send_chunk, right, group)     # post the send, do not block
        dist.recv(recv_into, left, group)
        request.wait()
"""),
         )),
    Flaw('ring_allreduce', 'ignores_group', clause='sum-over-ranks', case='?',
         why=('a correct ring on the default group, but the `group` argument is ignored: rank and size '
              'come from dist.get_rank() / dist.get_world_size() and the messages go through the '
              'default group, so with a process group the ring runs over all ranks and sums every '
              "rank's tensor."),
         patch=(
             ("""    rank, size = dist.get_rank(group), dist.get_world_size(group)
""",
              """    rank, size = dist.get_rank(), dist.get_world_size()
"""),
             ("""    if group is not None:
        right, left = dist.get_global_rank(group, right), dist.get_global_rank(group, left)
""",
              ''),
             ("""        incoming = dist.irecv(recv_into, left, group)      # post the receive first
        outgoing = dist.isend(send_chunk, right, group)    # then the send; neither blocks
        incoming.wait()
        outgoing.wait()
""",
              """        request = dist.isend(send_chunk, right)            # post the send, do not block
        dist.recv(recv_into, left)
        request.wait()
"""),
         )),
    Flaw('ring_allreduce', 'swapped_neighbours', clause='rank-sends-only', case='?',
         why=('left and right neighbours swapped: every rank sends to (rank - 1) % world_size and '
              'receives from (rank + 1) % world_size while it keeps the chunk schedule of a ring that '
              'turns the other way, so from 3 ranks on the chunks it adds are not the ones it expects. '
              '(With 2 ranks both neighbours are the same rank, so the sums there are right.)'),
         patch=(
             ("""    right, left = (rank + 1) % size, (rank - 1) % size
""",
              """    left, right = (rank + 1) % size, (rank - 1) % size
"""),
             ("""        incoming = dist.irecv(recv_into, left, group)      # post the receive first
        outgoing = dist.isend(send_chunk, right, group)    # then the send; neither blocks
        incoming.wait()
        outgoing.wait()
""",
              """        request = dist.isend(send_chunk, right, group)     # post the send, do not block
        dist.recv(recv_into, left, group)
        request.wait()
"""),
         )),
    Flaw('ring_allreduce', 'whole_tensor', clause='rank-sends-2', case='?',
         why=('the ring of the official tutorial ("Writing Distributed Applications with PyTorch"): the'
              ' whole tensor travels around the ring world_size - 1 times, so each rank sends '
              '(world_size - 1) * numel elements instead of about 2 * numel. The sums are right.'),
         patch=(
             ("""    if size == 1:
        return tensor
    right, left = (rank + 1) % size, (rank - 1) % size
    if group is not None:
        right, left = dist.get_global_rank(group, right), dist.get_global_rank(group, left)
    chunks = torch.tensor_split(tensor.view(-1), size)     # views: writes land in tensor
    incoming = torch.empty_like(chunks[0])                 # chunk 0 is the longest

    def exchange(send_chunk, recv_into):
        incoming = dist.irecv(recv_into, left, group)      # post the receive first
        outgoing = dist.isend(send_chunk, right, group)    # then the send; neither blocks
        incoming.wait()
        outgoing.wait()

    for step in range(size - 1):                           # reduce-scatter
        mine = chunks[(rank - step - 1) % size]
        buffer = incoming[:mine.numel()]
        exchange(chunks[(rank - step) % size], buffer)
        mine.add_(buffer)
    for step in range(size - 1):                           # all-gather
        exchange(chunks[(rank + 1 - step) % size], chunks[(rank - step) % size])
""",
              """    left, right = (rank - 1 + size) % size, (rank + 1) % size
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
"""),
         )),
    Flaw('sync_batchnorm', 'biased_running_var', clause='running-mean-running', case='?',
         why=('the forward is right, but the running variance is updated with the biased batch variance'
              ' (divided by N) where nn.BatchNorm uses the unbiased one (divided by N - 1).'),
         patch=(
             ("""                unbiased = var.detach() * total / (total - 1)
""",
              """                unbiased = var.detach()
"""),
         )),
    Flaw('sync_batchnorm', 'ignores_group', clause='statistics-span-batches', case='?',
         why=('right on the default group, but the all_reduce ignores self.group (which '
              'convert_batchnorm hands to every layer): with a process group the statistics span every '
              "rank's batch instead of the group's."),
         patch=(
             ("""            group = dist.group.WORLD if self.group is None else self.group
            stats = dist_nn.all_reduce(stats, group=group)
""",
              """            stats = dist_nn.all_reduce(stats)
"""),
         )),
    Flaw('sync_batchnorm', 'local_stats', clause='mean-biased-variance', case='?',
         why=('normalises with the statistics of the local batch only (what plain nn.BatchNorm does on '
              'each rank): no communication at all.'),
         patch=(
             ("""        channels = x.size(1)
        dims = [0] + list(range(2, x.dim()))
        count = x.new_tensor([x.numel() // channels])
        stats = torch.cat([x.sum(dims), (x * x).sum(dims), count])
        if dist.is_available() and dist.is_initialized():
            group = dist.group.WORLD if self.group is None else self.group
            stats = dist_nn.all_reduce(stats, group=group)
        total = stats[-1]
        mean = stats[:channels] / total
        var = stats[channels:2 * channels] / total - mean * mean      # biased
        if self.training and self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                     else self.momentum)
                self.running_mean.mul_(1 - m).add_(mean.detach(), alpha=m)
                unbiased = var.detach() * total / (total - 1)
                self.running_var.mul_(1 - m).add_(unbiased, alpha=m)
        shape = [1, channels] + [1] * (x.dim() - 2)
        y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y
""",
              """        # Plain BatchNorm on this rank's batch: updates the running statistics too.
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            True, 0.1 if self.momentum is None else self.momentum, self.eps)
"""),
         )),
    Flaw('sync_batchnorm', 'mean_of_means', clause='mean-biased-variance', case='?',
         why=('every rank computes its local mean and biased variance, and the ranks average them (one '
              'all_reduce, divided by the world size): right only when every rank holds as many '
              "samples, and the average of the variances misses the spread between the ranks' means."),
         patch=(
             ("""        stats = torch.cat([x.sum(dims), (x * x).sum(dims), count])
""",
              """        stats = torch.cat([x.mean(dims), x.var(dims, unbiased=False)])
        ranks = 1
"""),
             ("""        total = stats[-1]
        mean = stats[:channels] / total
        var = stats[channels:2 * channels] / total - mean * mean      # biased
""",
              """            count = dist.get_world_size(group) * count       # for the running variance
            ranks = dist.get_world_size(group)
        total = count[0]
        mean = stats[:channels] / ranks
        var = stats[channels:] / ranks                                # biased
"""),
         )),
    Flaw('sync_batchnorm', 'momentum_none_as_default', clause='momentum-none-cumulative', case='?',
         why=('momentum=None is replaced by the default 0.1, where nn.BatchNorm then keeps a cumulative'
              ' average (factor 1 / num_batches_tracked): the running statistics move too slowly.'),
         patch=(
             ("""                m = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                     else self.momentum)
""",
              """                m = 0.1 if self.momentum is None else self.momentum
"""),
         )),
    Flaw('sync_batchnorm', 'plain_all_reduce', clause='from-differentiable-torch', case='?',
         why=('the in-place dist.all_reduce instead of the differentiable one: the forward is right, '
              'but autograd does not see the collective (it treats the global sums as the local ones), '
              "so the other ranks' loss terms never reach this rank's input gradients."),
         patch=(
             ("""            stats = dist_nn.all_reduce(stats, group=group)
""",
              """            dist.all_reduce(stats, group=group)    # in place
"""),
         )),
]

