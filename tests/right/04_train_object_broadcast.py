"""RIGHT (notebook 04, train): shared-seed permutation slices, state_dict sent with broadcast_object_list, async per-tensor all-reduces.

rank_process passes TCPStore its arguments positionally and nests the barrier in a
try/finally whose finally destroys the group (the barrier only after a successful train).
train slices a permutation drawn from a generator seeded alike on every rank (rank r takes
block r of it, len(data) // W examples), compares the counts with all_gather_object,
makes every rank start from rank 0's model by pickling rank 0's CPU state_dict with
broadcast_object_list and load_state_dict (copies in place), launches one async all_reduce
per gradient, waits for all, and divides them with torch._foreach_div_; the leader's EMA
update uses a countdown instead of a modulo.

Written from the release notebook alone; the checker must accept it.
"""
import datetime
import time

import torch
import torch.distributed as dist

from exercise_utils.resnet_cifar_data_parallel import runner
from exercise_utils.resnet_cifar_data_parallel import tricks as T
from exercise_utils.models import ResNetBagOfTricks


def rank_process(rank, world_size, config):
    """Run one rank: connect to the other ranks, train, disconnect."""
    limit = datetime.timedelta(seconds=float(config.timeout_s))
    store = dist.TCPStore(config.master_addr, config.master_port, world_size, rank == 0, limit)
    backend, device = runner.choose_backend(world_size, rank)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=limit)
    finished = False
    try:
        out = train(rank, world_size, config, device)
        finished = True
    finally:
        try:
            if finished:
                dist.barrier()
        finally:
            dist.destroy_process_group()
    return out


def train(rank, world_size, config, device):
    """Train the bag-of-tricks ResNet data-parallel; rank 0 (the leader) validates and logs."""
    leader = rank == 0
    train_set = runner.load_data(config, "train", verbose=leader)
    batch_size = config.batch_size

    # TODO 1: the same permutation on every rank (same seed), block `rank` of it.
    minibatch_size = batch_size // world_size
    share = len(train_set.y) // world_size
    order = torch.randperm(len(train_set.y), generator=torch.Generator().manual_seed(config.seed))
    picked = order[rank * share:(rank + 1) * share]
    x_local, y_local = train_set.x.index_select(0, picked), train_set.y.index_select(0, picked)
    counts = [None] * world_size
    dist.all_gather_object(counts, (len(x_local), len(x_local) // minibatch_size))
    assert len(set(counts)) == 1, f"examples / minibatches per rank differ: {counts}"
    print(f"rank {rank}: {counts[rank][0]} examples, {counts[rank][1]} minibatches of "
          f"{minibatch_size} per epoch", flush=True)
    steps_per_epoch = T.num_minibatches(len(x_local), minibatch_size)

    torch.manual_seed(config.seed + rank)
    whitening = T.patch_whitening(train_set.x[:config.whitening_examples])
    model = ResNetBagOfTricks(whitening, width=config.width, ghost_size=config.ghost_size)
    model = model.to(device)

    # TODO 2: rank 0's state_dict as one pickled object, loaded in place everywhere.
    box = [{k: v.detach().cpu() for k, v in model.state_dict().items()} if leader else None]
    dist.broadcast_object_list(box, src=0)
    model.load_state_dict(box[0])
    del box

    opt, schedule = T.make_optimizer(model, minibatch_size, config.epochs * steps_per_epoch,
                                     lr=config.lr, weight_decay=config.weight_decay)

    # TODO 3
    ema = None
    if leader:
        ema = T.EMA(model, config.ema_momentum)
        until_ema = config.ema_every
    test_set = runner.load_data(config, "test", verbose=False) if leader else None

    generator = torch.Generator().manual_seed(config.seed * 1000 + rank)
    history, step = [], 0
    for epoch in range(1, config.epochs + 1):
        runner.synchronize(device)
        start, loss_sum, seen = time.perf_counter(), 0.0, 0
        for xb, yb in T.minibatches(x_local, y_local, minibatch_size, generator,
                                    augment=config.augment):
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            with runner.autocast(device, config):
                loss = T.label_smoothing_loss(model(xb), yb, config.label_smoothing).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()

            # TODO 4: all the all-reduces in flight at once, then the mean over ranks.
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            pending = [dist.all_reduce(g, async_op=True) for g in grads]
            for work in pending:
                work.wait()
            if grads:
                torch._foreach_div_(grads, world_size)
            opt.step()
            schedule.step()
            step += 1
            loss_sum, seen = loss_sum + loss.item(), seen + len(yb)

            # TODO 5: countdown to the next EMA update.
            if ema is not None:
                until_ema -= 1
                if until_ema == 0:
                    ema.update(model)
                    until_ema = config.ema_every
        runner.synchronize(device)
        seconds = time.perf_counter() - start

        # TODO 6
        if ema is not None:
            accuracy = T.evaluate(ema.model, test_set.x, test_set.y)
            history.append(runner.epoch_record(epoch, seconds,
                                               loss_sum / seen if seen else float("nan"),
                                               accuracy))
    return runner.summary(rank, world_size, config, device, len(x_local), minibatch_size,
                          steps_per_epoch, history)


if __name__ == "__main__":
    runner.main(rank_process)
