"""Known-wrong files of notebook 04, as patches of the solution (see tests/flaws.py)."""
from flaws import Def, Flaw  # noqa: F401

FLAWS = [
    Flaw('rank_process', 'env_port', clause='create-rendezvous-store', case='?',
         why=('takes the port from the MASTER_PORT '
              "environment variable when it is set (as torchrun's env:// does) instead of "
              "config.master_port: the launcher chose config.master_port, and any other job's "
              'MASTER_PORT in the environment sends the ranks elsewhere. Based on the solution with '
              'this one flaw; the checker must reject it.'),
         patch=(
             ("""import datetime
import time
""",
              """import datetime
import os
import time
"""),
             ("""    store = dist.TCPStore(config.master_addr, config.master_port, world_size,
""",
              """    port = int(os.environ.get("MASTER_PORT", config.master_port))
    store = dist.TCPStore(config.master_addr, port, world_size,
"""),
         )),
    Flaw('rank_process', 'no_barrier', clause='when-returns-dist', case='?',
         why=('destroys the process group as soon as '
              'train returns, without the barrier, so a rank can tear the group down while another is '
              'still in its last collective. Based on the solution with this one flaw; the checker must'
              ' reject it.'),
         patch=(
             ("""        result = train(rank, world_size, config, device)
        dist.barrier()
        return result
""",
              """        return train(rank, world_size, config, device)
"""),
         )),
    Flaw('rank_process', 'no_finally', clause='when-returns-dist', case='?',
         why=('destroy_process_group is only reached when'
              ' train succeeds; when train raises, the process group is left behind. Based on the '
              'solution with this one flaw; the checker must reject it.'),
         patch=(
             ("""    try:
        result = train(rank, world_size, config, device)
        dist.barrier()
        return result
    finally:
        dist.destroy_process_group()
""",
              """    result = train(rank, world_size, config, device)
    dist.barrier()
    dist.destroy_process_group()
    return result
"""),
         )),
    Flaw('rank_process', 'no_timeout', clause='timeout-config-timeout', case='?',
         why=('no timeout for the store nor for the '
              'process group: their defaults (5 minutes, 30 minutes for gloo) leave a rank whose peer '
              'never comes blocked that long. Based on the solution with this one flaw; the checker '
              'must reject it.'),
         patch=(
             ("""    timeout = datetime.timedelta(seconds=config.timeout_s)
""",
              ''),
             ("""                          is_master=rank == 0, timeout=timeout)
""",
              """                          is_master=rank == 0)
"""),
             ("""    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timeout)
""",
              """    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
"""),
         )),
    Flaw('train', 'ema_first_step', clause='leader-updates-ema', case='?',
         why=('the EMA is updated after steps 1, 1 + '
              'ema_every, ... (the step counted from 0), one step early each time. Based on the '
              'solution with this one flaw; the checker must reject it.'),
         patch=(
             ("""            if ema is not None and step % config.ema_every == 0:
""",
              """            if ema is not None and (step - 1) % config.ema_every == 0:
"""),
         )),
    Flaw('train', 'ema_on_every_rank', clause='ema-model-used', case='?',
         why=('every rank builds and updates its own EMA '
              'model (and validates), wasting memory and time on the non-leader ranks. Based on the '
              'solution with this one flaw; the checker must reject it.'),
         patch=(
             ("""    ema = T.EMA(model, config.ema_momentum) if leader else None
    test_set = runner.load_data(config, "test", verbose=False) if leader else None
""",
              """    ema = T.EMA(model, config.ema_momentum)
    test_set = runner.load_data(config, "test", verbose=False)
"""),
             ("""        if leader:
""",
              """        if ema is not None:
"""),
         )),
    Flaw('train', 'no_broadcast', clause='make-rank-start', case='?',
         why=('TODO 2 left empty: the given code seeds every '
              'rank with config.seed + rank, so the replicas start from different models and stay '
              'different. Based on the solution with this one flaw; the checker must reject it.'),
         patch=(
             ("""    for tensor in model.state_dict().values():
        dist.broadcast(tensor, src=0)
""",
              ''),
         )),
    Flaw('train', 'same_slice', clause='rank-r-trains', case='?',
         why=('every rank takes the same first slice of the '
              'training data (the slice ignores the rank), so the ranks train on duplicate examples and'
              ' half the data is never used. Based on the solution with this one flaw; the checker must'
              ' reject it.'),
         patch=(
             ("""    x_local = train_set.x[rank * per_rank:(rank + 1) * per_rank]
    y_local = train_set.y[rank * per_rank:(rank + 1) * per_rank]
""",
              """    x_local = train_set.x[:per_rank]
    y_local = train_set.y[:per_rank]
"""),
         )),
    Flaw('train', 'sum_not_scaled', clause='so-divide-world', case='?',
         why=('gradients are all-reduced (summed) but not '
              "divided by the world size, although the optimizer was built for one rank's minibatch: "
              'every update is world_size times too large. Based on the solution with this one flaw; '
              'the checker must reject it.'),
         patch=(
             ("""                    p.grad /= world_size
""",
              ''),
         )),
    Flaw('train', 'unequal_minibatches', clause='rank-must-run', case='?',
         why=("the last rank takes 'the rest' of the "
              'training set, so it can get one more minibatch per epoch than the others; nothing checks'
              ' the counts, and that rank waits forever in all_reduce (hang). Based on the solution '
              'with this one flaw; the checker must reject it.'),
         patch=(
             ("""    per_rank = len(train_set) // world_size            # the remainder is not used
    x_local = train_set.x[rank * per_rank:(rank + 1) * per_rank]
    y_local = train_set.y[rank * per_rank:(rank + 1) * per_rank]
""",
              """    per_rank = len(train_set) // world_size
    stop = len(train_set) if rank == world_size - 1 else (rank + 1) * per_rank   # last: the rest
    x_local = train_set.x[rank * per_rank:stop]
    y_local = train_set.y[rank * per_rank:stop]
"""),
             ("""    counts = [None] * world_size
    dist.all_gather_object(counts, steps)
    assert len(set(counts)) == 1, f"minibatches per epoch differ between ranks: {counts}"
""",
              ''),
         )),
    Flaw('train', 'validates_raw_model', clause='validates-ema-model', case='?',
         why=('the leader keeps and updates the EMA '
              'model but validates the trained model instead. Based on the solution with this one flaw;'
              ' the checker must reject it.'),
         patch=(
             ("""            accuracy = T.evaluate(ema.model, test_set.x, test_set.y)
""",
              """            accuracy = T.evaluate(model, test_set.x, test_set.y)
"""),
         )),
]

