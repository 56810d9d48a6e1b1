"""The judge's reference of notebook 07's stage "sharded": the unsharded optimizer replayed
in the checker's own process, never in a rank.

The ranks train the student's ``ShardedOptimizer`` beside an unsharded ``torch.optim``
optimizer whose averaged gradients both are given (:mod:`.probes`); code in a rank can reach
that optimizer and make it agree with anything (``tests/cheats/judge/``). So the ranks report
the gradients they gave (``seen``, one dict per step), and for each run the judge rebuilds the
model and the optimizer from the run's own description (:data:`.probes_runs.RUNS`, the
baseline, ``step(closure)`` and ``StepLR`` runs), computes every step's averaged gradient
itself from every rank's batch, and steps on the gradients the rank reported where they agree
with its own (within :data:`GRAD_TOL`: the ranks sum in another order), else on its own. A
correct ``ShardedOptimizer`` then matches the judge's parameters bitwise, as it matched the
rank's reference; one that went wrong, whatever the rank's reference said, does not.

Used in 07_bonus_zero_sharding (:mod:`.checks`).
"""
import numpy as np
import torch
import torch.nn.functional as F

from . import probes_base
from .probes_runs import RUNS, _listed

GRAD_TOL = {"float32": 1e-4, "float64": 1e-10}   # relative, of the largest gradient entry

DEFAULT = dict(kind="net", dtype="float32", params=_listed, ref_cls=torch.optim.AdamW,
               hyper=probes_base.ADAMW, adds=(), steps=probes_base.SHORT, closure=False,
               sched=False)
SPECS = {
    "train": dict(params=lambda m: list(m.body.parameters()), steps=probes_base.STEPS,
                  adds=[(probes_base.ADD_AT, lambda m: {"params": list(m.head.parameters()),
                                                        **probes_base.HEAD})]),
    "closure": dict(closure=True),
    "scheduler": dict(steps=probes_base.SCHED_STEPS, sched=True),
    **{name: {k: v for k, v in spec.items() if k != "cls"} for name, spec in RUNS.items()},
}


def averaged(model, kind, dtype, step, size):
    """{name: the gradient averaged over ``size`` ranks' batches at step ``step``, or None}."""
    total = {}
    for rank in range(size):
        model.zero_grad(set_to_none=True)
        x, y = probes_base.batch(kind, step, rank, dtype)
        F.cross_entropy(model(x), y).backward()
        for n, p in model.named_parameters():
            if p.grad is not None:
                total[n] = total.get(n, 0) + p.grad.detach().clone()
    model.zero_grad(set_to_none=True)
    return {n: (total[n] / size).numpy() if n in total else None
            for n, _ in model.named_parameters()}


def agrees(given, mine, dtype):
    """Whether the gradients a rank reported are the judge's (None in the same places)."""
    if given is None or set(given) != set(mine):
        return False
    for n, want in mine.items():
        got = given[n]
        if (got is None) != (want is None):
            return False
        if want is None:
            continue
        scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1e-30)
        if np.shape(got) != np.shape(want) or \
                not np.all(np.abs(np.asarray(got, dtype=np.float64) - want) <=
                           GRAD_TOL[dtype] * scale):
            return False
    return True


class Replay:
    """One run of the reference optimizer, replayed here step by step (see the module)."""

    def __init__(self, name, size):
        self.spec = spec = {**DEFAULT, **SPECS[name]}
        self.kind, self.dtype, self.size = spec["kind"], spec["dtype"], size
        with torch.random.fork_rng(devices=[]):     # (make_model seeds: not the caller's RNG)
            self.model = probes_base.make_model(self.kind, self.dtype)
        self.opt = spec["ref_cls"](spec["params"](self.model), **spec["hyper"])
        self.sched = (torch.optim.lr_scheduler.StepLR(self.opt, **probes_base.SCHED)
                      if spec["sched"] else None)
        self.lrs, self.params = [], dict(self.model.named_parameters())

    def run(self, steps, seen):
        """Steps ``steps`` (their numbers pick the batches), on the gradients ``seen`` (the
        rank's, one dict per step) where they agree with the judge's own."""
        seen = seen if isinstance(seen, list) else []
        for i, step in enumerate(steps):
            self.step(step, seen[i] if i < len(seen) else None)
        return self

    def step(self, step, given):
        for at, group in self.spec["adds"]:
            if step == at:
                self.opt.add_param_group(group(self.model))
        mine = averaged(self.model, self.kind, self.dtype, step, self.size)
        grads = given if agrees(given, mine, self.dtype) else mine

        def put():
            for n, g in grads.items():
                self.params[n].grad = None if g is None else torch.from_numpy(
                    np.array(g, dtype=np.dtype(self.dtype)))
        put()
        if self.spec["closure"]:
            self.opt.step(put)
        else:
            self.opt.step()
        if self.sched is not None:
            self.sched.step()
            self.lrs.append([float(g["lr"]) for g in self.opt.param_groups])
        self.model.zero_grad(set_to_none=True)

    def result(self):
        return {"ref": probes_base.named(self.model),
                "ref_groups": probes_base.groups_info(self.opt.param_groups, self.model),
                "ref_lrs": self.lrs}

    def state(self):
        """The optimizer's state dict as the probe records it (:func:`.probes_base.arrays`)."""
        return probes_base.arrays(self.opt.state_dict())


def reference(name, size, seen):
    """The run ``name`` with ``size`` ranks replayed: ``{"ref": {name: array}, "ref_groups":
    groups, "ref_lrs": [lrs after each scheduler step]}``; ``seen``: the gradients the rank
    reported, one dict per step (missing or wrong ones are replaced by the judge's own)."""
    replay = Replay(name, size)
    return replay.run(range(replay.spec["steps"]), seen).result()


def judge(res, size):
    """Replace what each rank reported of its reference (``ref``, ``ref_groups``,
    ``ref_lrs``) in every replayed run of ``res`` by the judge's own (in place)."""
    for out in res:
        for name in SPECS:
            run = out.get(name)
            if not isinstance(run, dict) or "final" not in run:
                continue
            mine = reference(name, size, run.get("seen"))
            run["ref"] = mine["ref"]
            if "ref_groups" in run:
                run["ref_groups"] = mine["ref_groups"]
            if "ref_lrs" in run:
                run["ref_lrs"] = mine["ref_lrs"]
    return res



def judge_checkpoint(res, size, sharded):
    """The same for stage "checkpoint" (:mod:`.probes_checkpoint`), which goes on from the
    runs of stage "sharded" (``sharded``: that stage's per-rank results of the same launch,
    or None): the reference's state dicts, groups and final parameters, replayed."""
    for rank, out in enumerate(res):
        before = sharded[rank] if sharded and rank < len(sharded) else {}
        net = out.get("net")
        if isinstance(net, dict) and "default" in net:
            replay = Replay("train", size).run(range(probes_base.STEPS),
                                               before.get("train", {}).get("seen"))
            for key in ("default", "last"):
                if isinstance(net.get(key), dict):
                    net[key]["ref"] = replay.state()
            replay.opt.param_groups[0]["lr"] *= 0.5
            seen = net.get("seen") if isinstance(net.get("seen"), list) else []
            replay.run(range(probes_base.STEPS, probes_base.STEPS + 2), seen[:2])
            replay.opt.param_groups[0]["lr"] *= 0.5     # halved again before consolidating
            if isinstance(net.get("fresh"), dict):
                net["fresh"]["ref"] = replay.state()
            net["ref_groups"] = replay.result()["ref_groups"]
            replay.run(range(probes_base.STEPS + 2, probes_base.STEPS + 2 + probes_base.MORE_STEPS),
                       seen[2:])
            net["ref_final"] = replay.result()["ref"]
        trip = out.get("switch")
        if isinstance(trip, dict) and isinstance(trip.get("first"), dict):
            replay = Replay("switch", size).run(range(probes_base.SHORT),
                                                before.get("switch", {}).get("seen"))
            trip["first"]["ref"] = replay.state()
            replay.run(range(probes_base.SHORT + 1, probes_base.SHORT + 3), trip.get("seen"))
            for key in ("again", "resumed"):
                if isinstance(trip.get(key), dict):
                    trip[key]["ref"] = replay.state()
            trip["ref_final"] = replay.result()["ref"]
            if "trip_ref" in trip:              # the resumed optimizer's reference: the same
                trip["trip_ref"] = trip["ref_final"]
        for name in ("float64", "edge"):
            trip = out.get(name)
            if not isinstance(trip, dict) or "ref" not in trip:
                continue
            replay = Replay(name, size).run(range(probes_base.SHORT),
                                            before.get(name, {}).get("seen"))
            trip["ref"] = replay.state()
            if "ref_final" in trip:
                replay.run(range(probes_base.SHORT + 1, probes_base.SHORT + 3), trip.get("seen"))
                trip["ref_final"] = replay.result()["ref"]
    return res
