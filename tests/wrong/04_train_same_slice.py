"""WRONG (notebook 04, train_same_slice): every rank takes the same first slice of the training data (the slice ignores the rank), so the ranks train on duplicate examples and half the data is never used.

Based on the solution with this one flaw; the checker must reject it.

Violates: "Rank r trains on its own part of the data."
"""
import datetime
import time

import torch
import torch.distributed as dist

from exercise_utils.resnet_cifar_data_parallel import runner
from exercise_utils.resnet_cifar_data_parallel import tricks as T
from exercise_utils.models import ResNetBagOfTricks


def rank_process(rank, world_size, config):
    """Run one rank: connect to the other ranks, train, disconnect.

    1. Create the rendezvous store: a ``dist.TCPStore`` at ``config.master_addr``,
       ``config.master_port``, hosted by rank 0 (``is_master=True`` there only), for
       ``world_size`` ranks, with a timeout of ``config.timeout_s`` seconds.
    2. Initialise the default process group on that store with the same timeout: backend
       "nccl" when CUDA has at least ``world_size`` GPUs (rank r then trains on ``cuda:r``),
       otherwise "gloo" (on ``cuda:0`` if there is one GPU, shared by the ranks, else on CPU).
       ``runner.choose_backend(world_size, rank)`` returns that (backend, device) pair.
    3. Run ``train(rank, world_size, config, device)``; when it returns, ``dist.barrier()``,
       then always (also when train raised) ``dist.destroy_process_group()``.

    Returns:
        What ``train`` returned.
    """
    timeout = datetime.timedelta(seconds=config.timeout_s)
    store = dist.TCPStore(config.master_addr, config.master_port, world_size,
                          is_master=rank == 0, timeout=timeout)
    backend, device = runner.choose_backend(world_size, rank)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timeout)
    try:
        result = train(rank, world_size, config, device)
        dist.barrier()
        return result
    finally:
        dist.destroy_process_group()


def train(rank, world_size, config, device):
    """Train the bag-of-tricks ResNet data-parallel; rank 0 (the leader) validates and logs.

    The single-process trainer of the seed, with the parts marked TODO made data-parallel:
    each rank trains on its own slice of the training set, starts from the same model,
    all-reduces gradients after ``backward``, and only the leader keeps the EMA model,
    validates and logs.

    Returns:
        dict: on every rank the data sizes and minibatch counts; on the leader also one
        record per epoch (time, training loss, validation accuracy of the EMA model).
    """
    leader = rank == 0
    train_set = runner.load_data(config, "train", verbose=leader)
    batch_size = config.batch_size

    # TODO 1: minibatch_size (this rank's share of the batch) and this rank's slice of the
    # training data, x_local and y_local. Every rank must get the same number of examples,
    # so that all ranks run the same number of minibatches per epoch (a rank with one extra
    # minibatch waits forever in all_reduce). Tip: compare the counts across ranks (an
    # assert turns that hang into a clear error) and log each rank's data size and
    # minibatches per epoch.
    if batch_size % world_size:
        raise ValueError(f"batch size {batch_size} is not divisible by {world_size} ranks")
    minibatch_size = batch_size // world_size
    per_rank = len(train_set) // world_size            # the remainder is not used
    x_local = train_set.x[:per_rank]
    y_local = train_set.y[:per_rank]
    steps = T.num_minibatches(len(x_local), minibatch_size)
    counts = [None] * world_size
    dist.all_gather_object(counts, steps)
    assert len(set(counts)) == 1, f"minibatches per epoch differ between ranks: {counts}"
    print(f"rank {rank}: {len(x_local)} training examples, {steps} minibatches of "
          f"{minibatch_size} per epoch", flush=True)
    steps_per_epoch = T.num_minibatches(len(x_local), minibatch_size)

    # Every rank draws its own random numbers (as real jobs do, so that e.g. dropout masks
    # differ between ranks): the model built here starts different on every rank.
    torch.manual_seed(config.seed + rank)
    whitening = T.patch_whitening(train_set.x[:config.whitening_examples])
    model = ResNetBagOfTricks(whitening, width=config.width, ghost_size=config.ghost_size)
    model = model.to(device)

    # TODO 2: make every rank start from the same model: rank 0's parameters and buffers.
    for tensor in model.state_dict().values():
        dist.broadcast(tensor, src=0)

    # The optimizer divides the learning rate by the examples the summed loss covers on
    # this rank (its minibatch), as the single-process trainer did for its batch.
    opt, schedule = T.make_optimizer(model, minibatch_size, config.epochs * steps_per_epoch,
                                     lr=config.lr, weight_decay=config.weight_decay)

    # TODO 3: the EMA model (used for validation): on the leader only (ema = None elsewhere).
    ema = T.EMA(model, config.ema_momentum) if leader else None
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

            # TODO 4: all-reduce the gradients, scaled so that the update equals the
            # single-process update on the whole batch (the loss above is a SUM over this
            # rank's minibatch, and the optimizer was built for minibatch_size examples).
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= world_size
            opt.step()
            schedule.step()
            step += 1
            loss_sum, seen = loss_sum + loss.item(), seen + len(yb)

            # TODO 5: on the leader, update the EMA model after every config.ema_every-th step
            # (steps counted from 1: after steps ema_every, 2 * ema_every, ...).
            if ema is not None and step % config.ema_every == 0:
                ema.update(model)
        runner.synchronize(device)
        seconds = time.perf_counter() - start

        # TODO 6: on the leader only, validate the EMA model and log the epoch:
        # history.append(runner.epoch_record(epoch, seconds, loss_sum / seen, accuracy))
        if leader:
            accuracy = T.evaluate(ema.model, test_set.x, test_set.y)
            history.append(runner.epoch_record(epoch, seconds, loss_sum / seen, accuracy))
    return runner.summary(rank, world_size, config, device, len(x_local), minibatch_size,
                            steps_per_epoch, history)


if __name__ == "__main__":
    runner.main(rank_process)
