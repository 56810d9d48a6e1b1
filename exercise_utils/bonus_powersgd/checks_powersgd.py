"""The checker of notebook 08's ``PowerSGD`` (imported by :mod:`.checks`, where the CHECK cell
finds it).

``check_powersgd`` hands ``PowerSGD`` fixed gradients, different on every rank and at every
step, for 4 steps in each of :data:`.reference.SETTINGS` (ranks 2 and 1 with warm start; the
baseline, whose failures are charged to the clause they break; then one dimension changed at a
time: warm_start False, min_compression_rate 2, full rank (on tall matrices), float64
gradients, EdgeNet's parameters, parameters whose gradient is None in some steps only
(``psgd-varying``: a skipped parameter keeps its error and Q), gradients with a zero dimension
(``psgd-empty``; these two on 1 rank only: :data:`.reference.ONE_RANK`); last the baseline on
one wide 256 x 1024 layer), on 1, 2 and 3 ranks, and checks after every step, in this order:

* parameters whose grad is None (an unused layer) are left alone;
* the collectives, COUNTED by wrapping ``torch.distributed``: only ``all_reduce``; (n + m) * r'
  elements per compressed tensor plus every uncompressed element (1-D tensors and matrices
  that would not shrink), the latter in one flat buffer; every buffer in the gradients' dtype;
* ``bytes_sent`` equal to the bytes recorded in this ``reduce()``, ``total_bytes`` their sum
  over the ``reduce()`` calls so far;
* every rank holds the same gradients, equal to the paper's algorithm replayed for every rank in
  float64 (:func:`.expected.simulate`; float64 gradients to float64 precision): error feedback
  carried between steps, P orthogonalized, Q averaged, Q kept. When the result matches a known
  mistake instead, the message names it;
* at grading (:func:`exercise_utils.harness.observing`) the bytes the network counted on the
  links between the 3 ranks, read from the kernel outside the ranks: what the settings'
  all_reduces put there (:func:`wire_envelope`), else ``psgd-wire``; whole gradients sent
  beside the factors (by any path) show;
* the state: ``params`` the list of trainable parameters; ``errors[i]`` this rank's M - approx
  (n, m) and ``qs[i]`` the averaged Q (m, r') (column signs free), in the gradients' dtype; a
  tensor without a gradient in the step keeps those of its last step.

Used in 08_bonus_powersgd.
"""
import numpy as np

from ..harness import check, wire_outside
from ..contract import fail
from . import expected
from . import reference as ref
from .launches import LINKS, TIMEOUT, _results, wire_key, world_salts

TOL = {"float32": 2e-4, "float64": 1e-9}   # |got - want| <= TOL * max|want| (float32 Gram-
#   Schmidt at full rank on the tall matrices, 3000 salted runs: up to 3.3e-5; a mistake: 1e-1
#   and more; float64: up to 1.3e-12; tests/test_08_bonus_powersgd.py)
ESIZE = {"float32": 4, "float64": 8}

FLAWS = {
    "no_error_feedback": "error feedback is missing: keep error = M - P Q^T per tensor (after "
                         "the all_reduces, on this rank) and add it to the next step's gradient "
                         "before compressing; without it what P Q^T misses is lost for good "
                         "(with it, the applied updates sum to the true gradients' sum minus "
                         "the last error: nothing is lost, only delayed)",
    "no_orthogonalization": "P is not orthogonalized: call orthogonalize(P) after all-reducing P "
                            "and before Q = M^T P; otherwise P Q^T = P P^T M is no projection",
    "q_not_averaged": "the Q's are summed, not averaged: divide them by the world size after "
                      "their all_reduce",
    "no_warm_start": "a fresh random Q is drawn every step although warm_start=True: keep "
                     "self.qs[i] = Q and start the next step from it",
    "always_warm": "Q is kept although warm_start=False: draw a fresh self.new_q(m, r') every "
                   "step in that case",
}


WIRE_SETUP = 256_000     # bytes on all links beyond the all_reduces: groups set up three
#                          times, the probe's store and barriers (measured: tests/test_wire.py)
MESSAGE_SLACK = 1_500    # bytes per gloo message: TCP/IP and gloo headers, notifications and
#                          acknowledgements (measured: up to 800 with one call per tensor)
WIRE_OVERHEAD = 0.05     # headers in proportion to the data


@check
def check_powersgd(path, timeout=TIMEOUT):
    """Check ``PowerSGD`` on 1, 2 and 3 ranks in every setting of each world (see the module
    docstring)."""
    for size, res in _results(path, "powersgd", timeout):
        for name in ref.settings(size):
            Setting(name, size, [r[name] for r in res], world_salts(path, size)).check()
    _check_wire(LINKS.get(wire_key(path)))


def wire_envelope():
    """``(least, most)`` bytes all links of the launch carry together: every setting's
    all_reduces for :data:`.reference.STEPS` steps in the world of 2 ranks and in that of 3
    (a ring all_reduce of B bytes over n ranks sends 2 (n - 1) B in all), plus headers and the
    groups' set-up. The world of 1 rank sends nothing."""
    data = messages = 0
    for n in (2, 3):
        for name in ref.settings(n):
            for step in range(ref.STEPS):
                plain, comp = expected.expected_elements(name, step)
                calls = (1 if plain else 0) + 2 * len(comp)
                nbytes = ESIZE[ref.SETTINGS[name].dtype] * (plain + sum(comp))
                data += 2 * (n - 1) * nbytes
                messages += calls * n * 2 * (n - 1)
    return (int(data * (1 - WIRE_OVERHEAD)),
            int(data * (1 + WIRE_OVERHEAD) + messages * MESSAGE_SLACK + WIRE_SETUP))


def _check_wire(links):
    """The bytes the kernel counted on the launch's links (read outside the ranks: nothing in
    them can change the counters) against :func:`wire_envelope`; nothing where they were
    not observed."""
    found = wire_outside(links, wire_envelope())
    if found is None:
        return
    sent, least, most = found
    wide = ref.SETTINGS["wide"]
    plain, comp = expected.expected_elements("wide")
    fail("psgd-wire",
         f"the network counted {sent:,} bytes on the links between the 3 ranks, over the "
         f"check's {len(ref.settings(2))} settings of {ref.STEPS} steps each with 2 and with 3 "
         f"ranks; the all_reduces PowerSGD makes put {least:,} to {most:,} bytes there (e.g. "
         f"at rank={wide.rank} on a 256 x 1024 gradient: (n + m) * r = {sum(comp)} elements for the "
         f"P and Q, {plain} for the bias, not 262,144 for the whole matrix). The calls your "
         f"code made through torch.distributed did not show this traffic: the bytes come "
         f"from the kernel's counters of each link, read outside the ranks. Send only P, Q "
         f"and the flat buffer, each with one dist.all_reduce.")


class Setting:
    """The checks of one setting on one world size, step by step."""

    def __init__(self, name, size, runs, salts=None):
        self.name, self.size, self.runs, self.salts = name, size, runs, salts
        self.s = ref.SETTINGS[name]
        self.want = expected.simulate(name, size, salts=salts)
        self.tol, self.esize = TOL[self.s.dtype], ESIZE[self.s.dtype]
        self.trainable = ref.trainable(self.s.model)
        self.label = (f"PowerSGD(params, rank={self.s.rank}, min_compression_rate={self.s.rate}"
                      f", warm_start={self.s.warm}) on {self._model()} with {size} rank(s)")

    def _model(self):
        return ("EdgeNet's parameters (frozen, unused, tied, transposed, 0-d) and a "
                "channels_last conv weight"
                if self.s.model == "edgenet" else f"{self.s.dtype} gradients")

    def case(self, own):
        """The baseline charges a failure to the clause's own case; another setting to its."""
        return own if self.s.case == "psgd-values" else self.s.case

    def check(self):
        for rank, run in enumerate(self.runs):
            if "raised" in run:                 # one rank: recorded by the probe, in order
                fail(self.s.case, f"rank {rank} raised {run['raised']} in check case "
                                  f"'{self.s.case}' ({self.label}): {run['message']}\n"
                                  f"{run['traceback']}")
        for step in range(ref.STEPS):
            for rank, run in enumerate(self.runs):
                got = run["steps"][step]
                where = f"rank {rank}, step {step + 1} of {self.label}"
                self._skip_none(where, got)
                self._calls(where, got["calls"], step)
                self._bytes(where, got, [s["calls"] for s in run["steps"][:step + 1]])
            self._same(step)
            for rank, run in enumerate(self.runs):
                self._values(rank, step, run["steps"])
            for rank, run in enumerate(self.runs):
                self._state(rank, step, run)

    # ------------------------------------------------------------ structure
    def _skip_none(self, where, got):
        if got["not_none"]:
            fail(self.case("psgd-skip-none"),
                 f"{where}: {got['not_none']} (an unused layer: p.grad was None) have a gradient "
                 f"after reduce(). Replace every p.grad that is not None; leave parameters "
                 f"without a gradient alone (no zeros: an optimizer would decay or move them)")

    def _calls(self, where, calls, step):
        plain, comp = expected.expected_elements(self.name, step)
        want = plain + sum(comp)
        other = [c[0] for c in calls if c[0] != "all_reduce"]
        if other:
            fail(self.case("psgd-elements"), f"{where}: made {other}; PowerSGD uses only "
                                             f"all_reduce (sums of P, Q and the flat buffer)")
        elements = sum(c[1] for c in calls)
        if elements != want:
            fail(self.case("psgd-elements"),
                 f"{where}: all_reduced {elements} elements in {[c[1] for c in calls]}, "
                 f"expected {want}: " + self._elements_hint(elements, plain, comp, step))
        if sum(c[2] for c in calls) != self.esize * want:
            dtypes = sorted({c[3] for c in calls})
            fail(self.case("psgd-dtype"),
                 f"{where}: all_reduced {sum(c[2] for c in calls)} bytes for {want} elements "
                 f"(buffers of {dtypes}): keep the gradients' dtype ({self.s.dtype}, "
                 f"{self.esize} bytes an element) for every buffer you all_reduce: P, Q and the "
                 f"flat buffer")
        if plain and plain not in [c[1] for c in calls]:
            fail(self.case("psgd-one-buffer"),
                 f"{where}: no all_reduce of {plain} elements; expected ONE flat buffer holding "
                 f"every uncompressed gradient (calls: {[c[1] for c in calls]})")
        if len(calls) > (1 if plain else 0) + 2 * len(comp):
            fail(self.case("psgd-one-buffer"),
                 f"{where}: {len(calls)} all_reduce calls; expected the uncompressed gradients "
                 f"in ONE buffer, then the P's, then the Q's (one call per compressed tensor "
                 f"at most)")

    def _elements_hint(self, elements, plain, comp, step):
        one_d = expected.expected_elements(self.name, step, one_d_compressed=True)
        no_rule = expected.expected_elements(self.name, step, no_saving_rule=True)
        if elements == one_d[0] + sum(one_d[1]):
            return ("you compressed 1-D tensors (biases): they must be sent uncompressed, "
                    "whatever min_compression_rate (compression_rank returns 0 for them)")
        if elements == no_rule[0] + sum(no_rule[1]):
            return ("you compressed matrices that do not shrink: send a matrix uncompressed "
                    "when (n + m) * r' * min_compression_rate >= n * m (compression_rank with "
                    "self.min_compression_rate returns 0)")
        varying = (" of the parameters that have a gradient in this step (which changes from "
                   "step to step here: look at p.grad in every call)"
                   if self.s.case == "psgd-varying" else "")
        return (f"(n + m) * r' per compressed tensor {comp} (r' = compression_rank(grad.shape, "
                f"self.rank, self.min_compression_rate)) plus {plain} uncompressed elements "
                f"(1-D tensors and matrices that would not shrink), each sent once per step"
                + varying)

    def _bytes(self, where, got, calls_so_far):
        nbytes = sum(c[2] for c in calls_so_far[-1])
        if got["bytes_sent"] != nbytes:
            fail(self.case("psgd-bytes"),
                 f"{where}: bytes_sent is {got['bytes_sent']!r}, but this reduce() passed "
                 f"{nbytes} bytes to all_reduce: count numel() * element_size() of every tensor "
                 f"you all_reduce in this reduce() ({self.esize} bytes an element for "
                 f"{self.s.dtype}), starting from 0 at each call")
        total = sum(c[2] for calls in calls_so_far for c in calls)
        if got["total_bytes"] != total:
            fail(self.case("psgd-total-bytes"),
                 f"{where}: total_bytes is {got['total_bytes']!r}; the bytes of the "
                 f"{len(calls_so_far)} reduce() calls so far sum to {total}: add each call's "
                 f"bytes_sent to it (never reset it)")

    # ------------------------------------------------------------ values
    def _differs(self, got, want):
        """(name, max abs difference) of the first gradient that differs, or None."""
        for name, w in want.items():
            g = np.asarray(got[name][1] if isinstance(got[name], tuple) else got[name])
            if g.shape != w.shape:
                return name, float("inf")
            diff = float(np.max(np.abs(g - w))) if g.size else 0.0
            if not diff <= self.tol * max(1e-3, float(np.max(np.abs(w), initial=0))):
                return name, diff
        return None

    def _same(self, step):
        first = self.runs[0]["steps"][step]["grads"]
        for rank in range(1, self.size):
            bad = self._differs(self.runs[rank]["steps"][step]["grads"],
                                {n: v for n, (_, v) in first.items()})
            if bad:
                fail(self.case("psgd-same"),
                     f"after step {step + 1} of {self.label}, rank {rank}'s {bad[0]} differs "
                     f"from rank 0's by {bad[1]:.1e}: every rank must end with the same "
                     f"gradients (approx = P Q^T from the all-reduced P and Q, and the "
                     f"all-reduced flat buffer, copied back into each p.grad)")

    def _values(self, rank, step, steps):
        got = steps[step]["grads"]
        for name, (dtype, _) in got.items():
            if dtype != self.s.dtype:
                fail(self.case("psgd-dtype"),
                     f"rank {rank}: after step {step + 1} of {self.label}, {name}.grad is "
                     f"{dtype}: keep the gradients' dtype ({self.s.dtype})")
        bad = self._differs(got, self.want[step]["grads"])
        if bad:
            self._explain(rank, step, steps, bad)

    def _explain(self, rank, step, steps, bad):
        name, diff = bad
        where = (f"rank {rank}: after step {step + 1} of {self.label}, {name} differs by "
                 f"{diff:.1e} from ")
        case = self.case("psgd-values")
        if self.name == "full":
            avg = self.want[step]["grads"][name]
            if not self._differs({name: steps[step]["grads"][name]}, {name: self.size * avg}):
                fail(case, where + f"the average: it is {self.size} times the average: "
                     + FLAWS["q_not_averaged"])
            fail(case, where + "the exact average. At full rank (r' = min(n, m)) P spans the "
                 "whole column space, so P Q^T must equal the average of the ranks' gradients: "
                 "check P = M Q, all_reduce(P), orthogonalize, Q = M^T P, all_reduce(Q) / "
                 "world_size, approx = P Q^T")
        if name not in [c[0] for c in self.want[step]["compressed"].values()]:
            mine, avg = steps[step]["grads"][name][1], self.want[step]["grads"][name]
            if self.size > 1 and not self._differs({name: mine}, {name: self.size * avg}):
                fail(case, where + f"the average: it is {self.size} times the average (an "
                     f"uncompressed tensor): divide the flat buffer by the world size after "
                     f"its all_reduce")
        for flaw, hint in FLAWS.items():
            flawed = expected.simulate(self.name, self.size, flaw, self.salts)
            if all(not self._differs(s["grads"], f["grads"])        # up to this step (later
                   for s, f in zip(steps[:step + 1], flawed)):     # ones may overflow)
                fail(case, where + "PowerSGD: " + hint)
        fail(case, where + "PowerSGD as in the paper (P = M Q with M = gradient + error, "
             "all_reduce P, orthogonalize P, Q = M^T P, all_reduce Q / world_size, approx = "
             "P Q^T, error = M - approx, Q kept; new Qs from self.new_q (cast to the gradient's "
             "dtype) for the compressed tensors only, in parameter order)")

    # ------------------------------------------------------------ state
    def _state(self, rank, step, run):
        where = f"rank {rank}: after step {step + 1} of {self.label}"
        case = self.case("psgd-state")
        names = [n for _, n, _, _ in self.trainable]
        if step == 0 and (run["params"] != names or
                          run["params_type"] not in ("builtins.list", "builtins.tuple")):
            fail(case, f"{where}: self.params is a {run['params_type']} of {run['params']}; "
                       f"expected the list of the trainable parameters in the order given "
                       f"({names}): keep the given __init__ (params may be a generator such as "
                       f"model.parameters(): list it once; frozen parameters are left out), "
                       f"since a parameter's index in self.params identifies its state")
        want, got = self.want[step], run["steps"][step]
        for table in ("errors", "qs"):
            if isinstance(got[table].get("type"), str):          # not a dict (probes._table)
                fail(case, f"{where}: self.{table} is a {got[table]['type']}; expected a dict "
                           f"{{index: tensor}}")
        for i, (pname, n, m, r) in want["compressed"].items():
            skipped = i in want["skipped"]
            self._entry(case, where, got["errors"], "errors", i, pname, (n, m),
                        want["errors"][i][rank], want["scale"][i], "M - approx (this rank's M "
                        "= gradient + previous error, minus the approximation every rank "
                        "applied)", signs=False, skipped=skipped)
            self._entry(case, where, got["qs"], "qs", i, pname, (m, r), want["qs"][i],
                        max(1e-3, float(np.abs(want["qs"][i]).max())),
                        "the all-reduced Q divided by the world size", signs=True,
                        skipped=skipped)

    def _entry(self, case, where, table, attr, i, pname, shape, want, scale, what, signs,
               skipped=False):
        entry = table.get(i)
        if skipped and (entry is None or "value" not in entry or not self._near(
                entry, want, scale, signs)):
            fail(case, f"{where}: {pname} had no gradient in this step, and self.{attr}[{i}] "
                       f"is no longer the one it had after its last step ("
                       f"{'gone' if entry is None else 'changed'}). The docstring: Which "
                       f"parameters have a gradient may change from one call to the next: a "
                       f"parameter skipped in a call keeps its self.errors[i] and self.qs[i] "
                       f"for the next call in which it has a gradient (as torch's PowerSGD "
                       f"keeps them): leave them alone while p.grad is None")
        if entry is None or "value" not in entry:
            fail(case, f"{where}: self.{attr}[{i}] ({pname}, compressed) is "
                       f"{entry and entry.get('type')}; keys are {sorted(table, key=str)}: "
                       f"expected a tensor under the parameter's index in self.params")
        value = entry["value"]
        if value.shape != shape or entry["dtype"] != self.s.dtype:
            dims = "(n, m)" if attr == "errors" else "(m, r')"
            fail(case, f"{where}: self.{attr}[{i}] ({pname}) has shape {value.shape} and dtype "
                       f"{entry['dtype']}; expected {shape}, the {dims} matrix in the "
                       f"gradients' dtype ({self.s.dtype})")
        if not self._near(entry, want, scale, signs):
            diff = self._diff(entry["value"], want, signs)
            fail(case, f"{where}: self.{attr}[{i}] ({pname}) differs by {float(diff.max()):.1e} "
                       f"from {what}: set self.errors[i] = M - approx and self.qs[i] = Q "
                       f"after the all_reduces")

    def _diff(self, value, want, signs):
        diff = np.abs(value - want)
        if signs:                           # a column of Q may flip with the column of P
            diff = np.minimum(diff, np.abs(value + want))
        return diff

    def _near(self, entry, want, scale, signs):
        """Whether a table's entry (``{"dtype", "value"}``) holds ``want`` (within the tolerance
        of the setting, relative to ``scale``)."""
        value = entry.get("value")
        if value is None or value.shape != want.shape:
            return False
        diff = self._diff(value, want, signs)
        return not diff.size or float(diff.max()) <= self.tol * scale
