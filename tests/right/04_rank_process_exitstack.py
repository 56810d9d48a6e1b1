"""RIGHT (notebook 04, rank_process): ExitStack cleanup, keyword TCPStore, strided slices, dtype-grouped flat buffers.

rank_process registers destroy_process_group on a contextlib.ExitStack (runs on success and
on an exception) and calls the barrier only after train returned. train takes a strided
(interleaved) slice of the data (rank r gets examples r, r+W, r+2W, ... cut to
len(data) // W), compares counts with MAX/MIN all-reduces, broadcasts the whole state_dict
as one flat buffer per (dtype, device) and all-reduces the gradients as one flat buffer per
(dtype, device), divided by world_size; the EMA is updated on `step % ema_every == 0`.

Written from the release notebook alone; the checker must accept it.
"""
import contextlib
import datetime
import time

import torch
import torch.distributed as dist

from exercise_utils.resnet_cifar_data_parallel import runner
from exercise_utils.resnet_cifar_data_parallel import tricks as T
from exercise_utils.models import ResNetBagOfTricks


def rank_process(rank, world_size, config):
    """Run one rank: connect to the other ranks, train, disconnect."""
    timeout = datetime.timedelta(seconds=config.timeout_s)
    store = dist.TCPStore(host_name=config.master_addr, port=config.master_port,
                          world_size=world_size, is_master=(rank == 0), timeout=timeout)
    backend, device = runner.choose_backend(world_size, rank)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size,
                            timeout=timeout)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(dist.destroy_process_group)
        result = train(rank, world_size, config, device)
        dist.barrier()
    return result


def _grouped(tensors):
    """Group tensors by (dtype, device), keeping their order inside each group."""
    groups = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    return groups.values()


@torch.no_grad()
def _flat_collective(tensors, op):
    """Pack tensors into one flat buffer per (dtype, device), run op on it, unpack in place."""
    for group in _grouped(tensors):
        wire_dtype = torch.uint8 if group[0].dtype == torch.bool else group[0].dtype
        flat = torch.cat([t.reshape(-1).to(wire_dtype) for t in group])
        op(flat)
        offset = 0
        for t in group:
            n = t.numel()
            t.copy_(flat[offset:offset + n].reshape(t.shape).to(t.dtype))
            offset += n


def train(rank, world_size, config, device):
    """Train the bag-of-tricks ResNet data-parallel; rank 0 (the leader) validates and logs."""
    leader = rank == 0
    train_set = runner.load_data(config, "train", verbose=leader)
    batch_size = config.batch_size

    # TODO 1: interleaved slice, rank r takes every world_size-th example from r on.
    minibatch_size = batch_size // world_size
    per_rank = len(train_set.x) // world_size
    x_local = train_set.x[rank::world_size][:per_rank]
    y_local = train_set.y[rank::world_size][:per_rank]
    mine = torch.tensor([len(x_local), T.num_minibatches(len(x_local), minibatch_size)],
                        dtype=torch.int64, device=device)
    hi, lo = mine.clone(), mine.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    assert torch.equal(hi, lo), (f"rank {rank}: examples/minibatches differ across ranks "
                                 f"(max {hi.tolist()}, min {lo.tolist()})")
    print(f"rank {rank}: {len(x_local)} examples, minibatch {minibatch_size}, "
          f"{int(mine[1])} minibatches per epoch", flush=True)
    steps_per_epoch = T.num_minibatches(len(x_local), minibatch_size)

    torch.manual_seed(config.seed + rank)
    whitening = T.patch_whitening(train_set.x[:config.whitening_examples])
    model = ResNetBagOfTricks(whitening, width=config.width, ghost_size=config.ghost_size)
    model = model.to(device)

    # TODO 2: one flat broadcast per dtype of the whole state_dict (frozen weights and
    # BatchNorm statistics included).
    _flat_collective(list(model.state_dict(keep_vars=False).values()),
                     lambda flat: dist.broadcast(flat, src=0))

    opt, schedule = T.make_optimizer(model, minibatch_size, config.epochs * steps_per_epoch,
                                     lr=config.lr, weight_decay=config.weight_decay)

    # TODO 3
    ema = T.EMA(model, momentum=config.ema_momentum) if leader else None
    test_set = runner.load_data(config, "test", verbose=False) if leader else None

    def average(flat):
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= world_size

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

            # TODO 4: flat all-reduce per dtype, then the mean over ranks.
            _flat_collective([p.grad for p in model.parameters() if p.grad is not None],
                             average)
            opt.step()
            schedule.step()
            step += 1
            loss_sum, seen = loss_sum + loss.item(), seen + len(yb)

            # TODO 5
            if ema is not None and step % config.ema_every == 0:
                ema.update(model)
        runner.synchronize(device)
        seconds = time.perf_counter() - start

        # TODO 6
        if leader:
            accuracy = T.evaluate(ema.model, test_set.x, test_set.y)
            history.append(runner.epoch_record(epoch, seconds, loss_sum / max(seen, 1),
                                               accuracy))
    return runner.summary(rank, world_size, config, device, len(x_local), minibatch_size,
                          steps_per_epoch, history)


if __name__ == "__main__":
    runner.main(rank_process)
