"""Checker of notebook 04's ``rank_process`` (imported by :mod:`.checks`, which the CHECK cell
names).

One launch of 3 processes runs the student's ``rank_process`` in every run of
:data:`.probes_rank.RUNS` (2 ranks; train raising; 1 rank; 3 ranks; a GPU per rank and one
shared GPU, simulated) with a stand-in ``train`` (:mod:`.probes_rank`). The verdicts come one
promise at a time, over every run, the most basic first: train called in a group of the
right ranks, the store, the group on it, the timeouts, the backend and device, the barrier,
the destroy, the return value, and an exception of train let through after the cleanup. Each
failure names its case of the contract (:mod:`.requirements`).

Used in 04_resnet_cifar_data_parallel.
"""
from ..contract import fail
from ..harness import HANG_AFTER, check, run_ranks
from .probes import CONFIG, LAUNCH
from .probes_rank import RUNS, probe_rank_process

TIMEOUT = HANG_AFTER     # seconds without progress before a launch is a hang (harness)


def distinct_ports(n):
    """``n`` different free ports."""
    from ..launch import free_port
    ports = []
    while len(ports) < n:
        ports += [p for p in [free_port()] if p not in ports]
    return ports


@check
def check_rank_process(path, timeout=TIMEOUT):
    """Check ``rank_process`` with 1, 2 and 3 ranks, without a GPU, with one shared GPU and
    with a GPU per rank (simulated): the store, the group, their timeouts, backend and device,
    train called, the barrier, the group destroyed (also after a raise), the return value."""
    ports = distinct_ports(len(RUNS) + 1)
    res = run_ranks(path, probe_rank_process, LAUNCH, "none",
                    kwargs=dict(config=CONFIG, ports=ports[1:], port=ports[0]),
                    timeout=timeout, what="rank_process with 1, 2 and 3 ranks", warm_up=True,
                    case="rp-store")
    runs = [(run, [res[r][run[0]] for r in range(run[1])]) for run in RUNS if run[0] in res[0]]
    for verdict in (_check_reached_train, _check_train_call, _check_store, _check_timeouts,
                    _check_backend, _check_barrier, _check_destroy, _check_return, _check_raise):
        for run, outs in runs:
            for rank, out in enumerate(outs):
                verdict(run, rank, out, f"rank {rank} of the run with {run[0]}")


def _check_reached_train(run, rank, out, where):
    if out["seen"] is not None:
        return
    if "raised" not in out:
        fail("rp-train", f"{where}: rank_process returned without calling train(rank, "
                         f"world_size, config, device)")
    made = [s for s in out["stores"] if s["created"]]
    case, what = (("rp-store", "creating the dist.TCPStore") if not made else
                  ("rp-group", "initialising the process group on the store"))
    fail(case, f"{where}: rank_process raised before it called train (while {what}?): "
               f"{out['raised']}")


def _check_train_call(run, rank, out, where):
    _, world = run[:2]
    seen = out["seen"]
    want = dict(rank=rank, world_size=world, same_config=True, group_rank=rank,
                group_size=world, sum=world * (world + 1) / 2)
    wrong = {k: seen[k] for k in want if seen[k] != want[k]}
    if wrong:
        fail("rp-train", f"{where}: inside train saw {wrong}; expected "
                         f"{ {k: want[k] for k in wrong} }: call train(rank, world_size, "
                         f"config, device) with rank_process's own arguments, inside a "
                         f"default process group of world_size ranks in which this rank is "
                         f"`rank`")


def _check_store(run, rank, out, where):
    """The group's store: the config's address and port, the TCPStore the student created,
    hosted by rank 0, for world_size ranks."""
    _, world = run[:2]
    seen = out["seen"]
    used = [s for s in out["stores"] if s["used"]]
    if out["stores"] and not used:
        fail("rp-group", f"{where}: the process group does not run on the dist.TCPStore "
                         f"rank_process created: pass it to dist.init_process_group(backend, "
                         f"store=store, rank=rank, world_size=world_size, timeout=...)")
    if (seen["host"], seen["port"]) != (out["addr"], out["port"]):
        fail("rp-store", f"{where}: the process group's store is at {seen['host']}:"
                         f"{seen['port']}; expected config.master_addr:config.master_port = "
                         f"{out['addr']}:{out['port']}: create the dist.TCPStore at "
                         f"config.master_addr, config.master_port")
    if not used:
        return          # the store torch made from an init_method at the right address
    store = used[-1]
    if store["is_master"] != (rank == 0) or store["world_size"] != world:
        fail("rp-store", f"{where}: its dist.TCPStore was created with is_master="
                         f"{store['is_master']}, world_size={store['world_size']}; expected "
                         f"is_master={rank == 0}, world_size={world}: rank 0 hosts the store "
                         f"(is_master=True there only), for world_size ranks")


def _check_timeouts(run, rank, out, where):
    want = out["timeout"]
    seen = out["seen"]
    for what, key, default in (("the TCPStore", "store_timeout", "5 minutes"),
                               ("the process group", "group_timeout", "30 minutes for gloo")):
        got = seen[key]
        if got is not None and abs(got - want) > 0.5:
            fail("rp-timeout",
                 f"{where}: {what} has a timeout of {got:g} s; expected config.timeout_s = "
                 f"{want:g} s. Pass timeout=datetime.timedelta(seconds=config.timeout_s) to "
                 f"dist.TCPStore and to dist.init_process_group (their defaults: {default}; a "
                 f"rank waiting for a peer that never comes would block that long)")


def expected_backend(gpus, world_size, rank):
    """The (backend, device) the contract names for a rank: NCCL on cuda:rank with a GPU per
    rank, else gloo on cuda:0 with a GPU, else gloo on the CPU."""
    if gpus >= world_size:
        return "nccl", f"cuda:{rank}"
    return ("gloo", "cuda:0") if gpus else ("gloo", "cpu")


def _check_backend(run, rank, out, where):
    _, world, gpus = run[:3]
    backend, device = expected_backend(gpus, world, rank)
    got_backend = (out["backends"] or ["none"])[-1].lower()
    got_device = out["seen"]["device"]
    got_device = "cuda:0" if got_device == "cuda" and device == "cuda:0" else got_device
    if (got_backend, got_device) != (backend, device):
        gpu = {0: "no GPU", 1: "one GPU"}.get(gpus, f"{gpus} GPUs")
        fail("rp-backend", f"{where} ({gpu}, simulated): backend {got_backend!r} and device "
                           f"{got_device!r}; expected {backend!r} and {device!r}. NCCL when "
                           f"CUDA has at least world_size GPUs (rank r on cuda:r), otherwise "
                           f"gloo (on cuda:0 if there is a GPU, else on the CPU): "
                           f"runner.choose_backend(world_size, rank) returns that pair")


def _check_barrier(run, rank, out, where):
    if run[5]:
        return
    events = out["events"]
    after = events[events.index("train returned") + 1:] if "train returned" in events else []
    destroy = "dist.destroy_process_group()"
    if "raised" in out:
        fail("rp-barrier", f"{where}: after train returned, rank_process raised (calls after "
                           f"train: {' then '.join(after) or 'none'}): {out['raised']}")
    if run[1] == 1:
        return          # a barrier of one rank waits for nobody: leaving it out is harmless
    if "dist.barrier()" not in after[:after.index(destroy) if destroy in after else None]:
        fail("rp-barrier", f"{where}: after train returned, rank_process called "
                           f"{' then '.join(after) or 'nothing'}; expected dist.barrier() and "
                           f"then dist.destroy_process_group(): the barrier makes every rank "
                           f"finish its last collective before any rank tears the group down")


def _check_destroy(run, rank, out, where):
    if not run[5] and out["still_initialized"]:
        fail("rp-destroy", f"{where}: the process group is still initialized after "
                           f"rank_process returned: call dist.destroy_process_group() (after a "
                           f"final dist.barrier())")


def _check_return(run, rank, out, where):
    if not run[5] and out.get("value") != {"rank": rank, "ok": True}:
        fail("rp-return", f"{where}: rank_process returned {out.get('value')!r}; it must "
                          f"return what train returned ({ {'rank': rank, 'ok': True} })")


def _check_raise(run, rank, out, where):
    if not run[5]:
        return
    first = out.get("raised", "").split("\n")[0]
    if "train failed on purpose" not in first:
        did = f"raised {first}" if first else f"returned {out.get('value')!r}"
        fail("rp-raise", f"{where}: train raised KeyError('train failed on purpose'), and "
                         f"rank_process {did}: clean up, then let train's exception through "
                         f"to the caller")
    if out["still_initialized"]:
        fail("rp-raise", f"{where}: when train raised, the process group was left "
                         f"initialized: destroy it in a `finally:` block")
    events = out["events"]
    after = events[events.index("train raised") + 1:] if "train raised" in events else []
    if "dist.barrier()" in after:
        fail("rp-raise", f"{where}: when train raised, rank_process called "
                         f"{' then '.join(after)}: the barrier belongs after a train that "
                         f"returned, never in the `finally:`. A rank whose training failed "
                         f"must not wait for the others: they may be inside a collective it "
                         f"will never join, and its barrier then waits until the timeout "
                         f"instead of tearing down at once")
