"""What notebook 07's launches may put on the wire (the judge's; no rank imports it, so at grading
the sandbox hides it from them).

Where links are observed (at grading, and with ``DTFS_OBSERVE=1`` as root:
:func:`exercise_utils.harness.observing`) the launches of 2 and 3 ranks run rank r on host r of
a mesh and the judge reads the bytes of every link from the kernel's counters, outside the
ranks: ``check_sharded``'s launch trains alone, ``check_checkpoint``'s trains and then
consolidates (:mod:`.checks`). All links together must carry what the calls of that launch put
there (:func:`sharded_calls`, :func:`checkpoint_calls`: what the notebook asks the
``ShardedOptimizer`` to send, and the probe's own collectives), from the least a right file can
send to the most (:func:`bounds`); ``sharded-wire`` or ``checkpoint-wire`` fails otherwise.

The models are small (1462 elements at most): the headers of a call weigh as much as its data,
so the most counts each call's headers as measured for small gloo collectives on the mesh
(:data:`exercise_utils.wire.HEADERS`); the data and its overhead are the core's
(:func:`exercise_utils.wire.volume`, ``OVERHEAD``).

Used in 07_bonus_zero_sharding (by :mod:`.checks` and :mod:`.checks_checkpoint`).
"""
import torch
import torch.nn.functional as F

from .. import wire
from . import probes, probes_base
from .checks_sharded import greedy
from .replay import DEFAULT, SPECS

PICKLED = 330                   # bytes a pickled state tensor takes beside its data (measured 300)
LOOSE = 1.1                     # what a pickled shard may hold beside its state (ids, groups)
NOISE = 0.03                    # two launches of the same training differ by up to 1.7%
CASE = {"sharded": "sharded-wire", "checkpoint": "checkpoint-wire"}


def bounds(least_calls, most_calls, size):
    """``(least, most)`` bytes on all links (:func:`exercise_utils.wire.small_calls`)."""
    return wire.small_calls(least_calls, most_calls, size)


class Run:
    """One run of the probe (:data:`.replay.SPECS`): its model, its groups step by step."""

    def __init__(self, name):
        self.spec = {**DEFAULT, **SPECS[name]}
        with torch.random.fork_rng(devices=[]):
            self.model = probes_base.make_model(self.spec["kind"], self.spec["dtype"])
        self.at(0)

    def at(self, step):
        """The gradients of ``step`` (which parameters have one may change from step to step:
        the Switch model), on rank 0's batch."""
        self.model.zero_grad(set_to_none=True)
        x, y = probes_base.batch(self.spec["kind"], step, 0, self.spec["dtype"])
        F.cross_entropy(self.model(x), y).backward()
        return self

    def groups(self, step):
        """The optimizer's groups (lists of parameters) in ``step``."""
        given = list(self.spec["params"](self.model))
        groups = [list(g["params"]) for g in given] if given and isinstance(given[0], dict) \
            else [given]
        for at, add in self.spec["adds"]:
            if at <= step:
                params = add(self.model)["params"]
                groups.append([params] if isinstance(params, torch.Tensor) else list(params))
        return groups

    def averaging(self):
        """The probe's all-reduce of every gradient of the reference model, per step."""
        return [("all_reduce", _nbytes(p)) for p in self.model.parameters() if p.grad is not None]

    def step(self, step, size, followers=1):
        """``(least, most)`` calls of one step: the probe's averaging, then each follower's
        ``step()``: every owner broadcasts its parameters' new values, at least those that have
        a gradient, at most every parameter of every group, one by one or per owner and group."""
        groups = self.at(step).groups(step)
        params = [p for g in groups for p in g]
        least = [("broadcast", _nbytes(p)) for p in params if p.grad is not None] * followers
        most = ([("broadcast", _nbytes(p)) for p in params]
                + [("broadcast", 0)] * size * len(groups)) * followers
        calls = self.averaging() * (2 if self.spec["closure"] else 1)
        return calls + least, calls + most

    def steps(self, steps, size, followers=1):
        least, most = [], []
        for step in steps:
            low, high = self.step(step, size, followers)
            least += low
            most += high
        return least, most

    def shards(self, size, step):
        """Each rank's optimizer state after ``step``: ``(bytes of its tensors, tensors)``
        (AdamW: two of the parameter's size and a 4-byte step, for each parameter that had a
        gradient at any step up to ``step``; the owners: the notebook's greedy partition, group
        after group)."""
        had = set()
        for earlier in range(step + 1):
            had |= {id(p) for p in self.at(earlier).model.parameters() if p.grad is not None}
        loads, state = [0] * size, [[0, 0] for _ in range(size)]
        for group in self.groups(step):
            owners = greedy([p.numel() for p in group], size, loads)
            for p, r in zip(group, owners):
                loads[r] += p.numel()
                if id(p) in had:
                    state[r][0] += 2 * _nbytes(p) + 4
                    state[r][1] += 3
        return state


def _nbytes(p):
    return p.numel() * p.element_size()


def consolidation(run, size, step, to):
    """``(least, most)`` calls of ``consolidate_state_dict(to=to)`` then the probe's
    ``broadcast_object_list`` of rank ``to``'s state dict: at least every other rank's state
    sent to ``to``; at most every rank's pickled shard (:data:`LOOSE`) to every rank
    (``all_gather_object``: sizes, then the shards padded to the largest); the state dict,
    pickled, from ``to`` to every rank."""
    shards = run.shards(size, step)
    pickled = [LOOSE * (nbytes + PICKLED * tensors) + 1_000 for nbytes, tensors in shards]
    whole = LOOSE * sum(nbytes + PICKLED * tensors for nbytes, tensors in shards) + 2_000
    least = [("send", sum(nbytes for r, (nbytes, _) in enumerate(shards) if r != to)),
             ("broadcast", sum(nbytes for nbytes, _ in shards))]
    most = [("all_gather", 8 * size), ("all_gather", int(size * max(pickled))),
            ("broadcast", 8), ("broadcast", int(whole))]
    return least, most


def partitions():
    """``(least, most)`` bytes of one rank's record of ``partition_parameters`` on every case of
    the probe, pickled (what it all-gathers): the greedy owners shown as a list of ints; at
    most with 220 bytes more each (numpy integers: 200 characters shown, another type name)."""
    import pickle
    records = [{"type": "list", "owners": owners, "loads": loads, "items": ["int"],
                "shown": repr(owners)[:200]} for _, sizes, world, loads in probes.partition_cases()
               for owners in [greedy(sizes, world, loads)]]
    least = len(pickle.dumps(records))
    return least, least + 220 * len(records)


def sharded_calls(size):
    """``(least, most)`` calls of a launch of stage "sharded": the ranks' partitions
    all-gathered (:func:`partitions`), then every run."""
    low, high = partitions()
    least = [("all_gather", 8 * size), ("all_gather", size * low)]
    most = [("all_gather", 8 * size), ("all_gather", size * high)]
    for name in ("train", "float64", "edge", "switch", "closure", "empty", "sgd", "generator",
                 "dicts", "tensor_group", "scheduler"):
        run = Run(name)
        low, high = run.steps(range(run.spec["steps"]), size)
        least, most = least + low, most + high
        if name == "edge":                     # zero_grad(set_to_none=False): one averaging
            least, most = least + run.averaging(), most + run.averaging()
    return least, most


def checkpoint_calls(size):
    """``(least, most)`` calls of stage "checkpoint" (:mod:`.probes_checkpoint`): on the
    baseline three consolidations, 2 steps, then 3 steps of two optimizers that loaded a state
    dict; on the float64 model and EdgeNet one consolidation and 2 steps each; on the Switch
    model one consolidation, 2 steps and another; then an optimizer resumed from the first,
    2 steps and a consolidation."""
    least, most = [], []

    def add(calls):
        least.extend(calls[0])
        most.extend(calls[1])
    net, last = Run("train"), probes_base.STEPS - 1
    add(consolidation(net, size, last, 0))
    add(consolidation(net, size, last, size - 1))
    add(net.steps(range(probes_base.STEPS, probes_base.STEPS + 2), size))
    add(consolidation(net, size, last, 1 % size))
    add(net.steps(range(probes_base.STEPS + 2, probes_base.STEPS + 2 + probes_base.MORE_STEPS),
                  size, 2))
    for name in ("float64", "edge"):
        run = Run(name)
        add(consolidation(run, size, probes_base.SHORT - 1, 0))
        add(run.steps(range(probes_base.SHORT + 1, probes_base.SHORT + 3), size))
    run, last = Run("switch"), probes_base.SHORT + 2
    add(consolidation(run, size, probes_base.SHORT - 1, 0))
    add(run.steps(range(probes_base.SHORT + 1, probes_base.SHORT + 3), size))
    add(consolidation(run, size, last, size - 1))
    add(run.steps(range(probes_base.SHORT + 1, probes_base.SHORT + 3), size))     # the resumed one
    add(consolidation(run, size, last, 1 % size))
    return least, most


def judge(links, stage, size, trained=None):
    """Fail ``stage``'s wire case where the bytes all ``links`` of its launch with ``size``
    ranks carried (empty where they were not observed) lie outside :func:`bounds`: stage
    "sharded" trains alone, "checkpoint" trains then consolidates. ``trained``: the bytes the
    same training carried alone (measured, and held to its own bounds), for the checkpoint: its
    most is then at most those (within :data:`NOISE`) and the most of the consolidations."""
    if not links:
        return
    least, most = sharded_calls(size)
    what = "ShardedOptimizer's training"
    asked = ("per step the owners' broadcasts of every parameter's new value (the check's own "
             "averaging of the gradients included)")
    envelope = bounds(least, most, size)
    if stage == "checkpoint":
        low, high = checkpoint_calls(size)
        envelope = bounds(least + low, most + high, size)
        if trained:
            own = bounds([], high, size)[1] - wire.BASE.get(size, wire.SETUP)
            envelope = envelope[0], min(envelope[1], int(trained * (1 + NOISE)) + own)
        what = "ShardedOptimizer's training, then consolidate_state_dict"
        asked += (", and each consolidation gathering every rank's optimizer state on rank "
                  "`to` (8 of them)")
    wire.check(links, envelope, CASE[stage], f"{what} with {size} ranks", asked)
