"""Checker of notebook 11's ring attention for ``work/11_composed.py``: ``check_ring_attention``
(the judge: expected values from :mod:`.refs`).

It launches 3 gloo ranks (a ring of 3) and 4 (a ring of 4, two rings of 2 whose group ranks are
not the global ranks, and rings of 1), :mod:`.probes_ring`:

* ``ring-pure`` (rank 0): ``merge_blocks`` against the merge's definition (rows with -inf on
  one side and on both, sides 800 apart), the inputs left as they were and new tensors
  returned; ``balanced_positions`` on uneven and even splits and ValueError on invalid
  arguments; ``block_pairs`` on the judge's layouts (runs, skipped pairs, masks);
* ``ring-values``: on every ring, for each case of :data:`.inputs.RING_CASES` (causal and not,
  the balanced and the contiguous split, uneven chunks, float64 and float32), each rank's output
  and gradients of q, k, v equal to attention over the whole sequence in one process;
* ``ring-messages``: only point-to-point messages, sent to the next rank and received from the
  previous one, none larger than one block of keys and values (with their gradients in the
  backward), the first block sent before the first ``block_forward``; no collective;
* ``ring-memory``: what the forward keeps for the backward is at most 1.1 times this rank's own
  q, k, v, output and log-sum-exp;
* ``ring-work``: every block product made with ``block_forward`` / ``block_backward``; causal,
  no more query x key entries than the rank must see plus two chunks' squares (masked pairs
  skipped), and with the balanced split every rank's entries within one chunk's square of
  every other's;
* ``ring-wire``: where links are observed (grading), with a long, wide case more
  (:data:`.inputs.RING_WIRE_CASE`), each directed link carries what the ring's messages put
  there, and links between ranks that are not ring neighbours the set-up only (:mod:`.wire`).

Tolerance: ``1e-10`` (float64) or ``1e-5`` (float32) times the largest reference magnitude.

Used in 11_bonus_composed.
"""
import math
from pathlib import Path

import numpy as np

from ..contract import CheckFailure, fail
from ..harness import HANG_AFTER, check, observing, run_ranks
from ..notebook_files import no_file, unimplemented
from . import inputs, probes_ring, refs
from .checks import close, max_diff, unfinished
from .wire import check_ring_wire

__all__ = ["check_ring_attention"]

TOL = {"torch.float64": 1e-10, "torch.float32": 1e-5}
PIECES = ("merge_blocks", "balanced_positions", "block_pairs", "RingAttention.forward",
          "RingAttention.backward")


def _check_pure(pure):
    merge = pure["merge"]
    if "todo" not in merge:
        if "raised" in merge:
            fail("ring-pure", f"merge_blocks raised {merge['raised']} ({merge['message']})")
        out, lse, out_b, lse_b = probes_ring.merge_cases()
        want_out, want_lse = refs.merged(out, lse, out_b, lse_b)
        got_lse = np.array([-np.inf if x is None else x for x in merge["lse"]])
        if merge["shapes"] != [list(want_out.shape), list(want_lse.shape)]:
            fail("ring-pure", f"merge_blocks returned shapes {merge['shapes']}; expected "
                              f"{[list(want_out.shape), list(want_lse.shape)]}")
        w = want_lse.reshape(-1).numpy()
        if not (np.array_equal(np.isinf(got_lse), np.isinf(w))
                and max_diff(got_lse[~np.isinf(w)], w[~np.isinf(w)]) <= 1e-12):
            fail("ring-pure", "merge_blocks: the merged log-sum-exp is off (log(exp(lse) + "
                              "exp(lse_b)), -inf only where both sides are -inf; one row's "
                              "sides are 800 apart: a naive exp overflows)")
        close("ring-pure", "merge_blocks: the merged output", merge["out"], want_out.numpy(),
               1e-12, " (each side weighted by exp(its lse - the merged lse); a side at -inf "
                      "weighs 0, never NaN)")
        if not merge["kept"] or merge["same"]:
            fail("ring-pure", "merge_blocks modified its inputs or returned one of them: "
                              "return new tensors")
    if "todo" not in pure["balanced"]:
        for S, c, got in pure["balanced"]:
            valid = (S, c) in {(repr(a), repr(b)) for a, b in probes_ring.BALANCED}
            where = f"balanced_positions({S}, {c})"
            if valid:
                want = refs.balanced(int(S), int(c))
                if got.get("value") != want or got.get("dtypes") != ["torch.int64"]:
                    said = (f"raised {got['raised']} ({got['message']})" if "raised" in got
                            else f"returned {got.get('value')} ({got.get('dtypes')})")
                    fail("ring-pure", f"{where} {said}; expected {want} as int64 tensors "
                                      "(2c chunks of torch.tensor_split; rank r: chunk r, "
                                      "then chunk 2c - 1 - r)")
            elif got.get("raised") != "ValueError":
                did = (f"raised {got['raised']} ({got['message']})" if "raised" in got
                       else f"returned {got.get('value')}")
                fail("ring-pure", f"{where} {did}; expected ValueError")
    if "todo" not in pure["pairs"]:
        for q_pos, k_pos, causal, got in pure["pairs"]:
            want = refs.pairs(q_pos, k_pos, causal)
            if got.get("value") != want:
                said = (f"raised {got['raised']} ({got['message']})" if "raised" in got
                        else f"returned {got.get('value')}")
                fail("ring-pure", f"block_pairs(tensor({q_pos}), tensor({k_pos}), {causal}) "
                                  f"{said}; expected {want} (as query indices, key indices, "
                                  "mask: one pair per query run and key run, pairs no query "
                                  "sees left out, mask None where every query sees every key)")


def _messages(where, events, nbrs, limit, phase):
    colls = sorted({e[0] for e in events if e[0] not in ("send", "isend", "recv", "irecv",
                                                        "block_forward", "block_backward")})
    if colls:
        fail("ring-messages", f"{where}: the {phase} called {colls}; ring attention talks to "
                              "its two ring neighbours with point-to-point messages only")
    for name, n, peer in events:
        if name in ("send", "isend", "recv", "irecv") and n is not None and n > limit:
            fail("ring-messages", f"{where}: the {phase} made a message of {n} numbers ({name} "
                                  f"with rank {peer}); at most {limit}: one block's keys and "
                                  "values" + (" and their gradients" if phase == "backward"
                                              else ""))


def _reference(cache, salts, ring, index, case):
    """Attention over the whole sequence of ``case`` on ``ring`` (once per ring and case)."""
    key = (tuple(ring), index)
    if key not in cache:
        _, dtype, kind, causal, S = case
        positions = inputs.layout(kind, S, len(ring))
        q, k, v, dout = inputs.qkv([salts[r] for r in ring], positions, index, dtype,
                                   inputs.head_dim(case))
        cache[key] = (positions, refs.attention(q, k, v, positions, causal, dout))
    return cache[key]


def _check_ring(launch, res, salts, cases):
    cache = {}
    for rank, out in enumerate(res):
        for item in out["rings"]:
            ring, c = item["ring"], len(item["ring"])
            me = ring.index(rank)
            for index, case in enumerate(cases):
                name, dtype, kind, causal, S = case
                got = item["cases"].get(name)
                if got is None or "todo" in got:
                    continue
                hd = inputs.head_dim(case)
                wide = hd != inputs.HD
                where = (f"with {launch}, rank {rank} (rank {me} of the ring {ring}), "
                         f"{name.replace('-', ' ')}, S = {S}")
                if "stopped" in got:
                    fail("ring-messages", f"{where}: stopped a message: {got['stopped']}. "
                                          "Send to the next rank of the ring, receive from the "
                                          "previous one (ring_peers gives their global ranks)")
                positions, ref = _reference(cache, salts, ring, index, case)
                pos = positions[me].numpy()
                tol = TOL[str(dtype)]
                if got["dtype"] != str(dtype):
                    fail("ring-values", f"{where}: the output is {got['dtype']}, expected "
                                        f"{dtype}")
                close("ring-values", f"{where}: the output", got["out"],
                       refs.digest(ref[0][:, :, pos], wide), tol,
                       " (attention over the whole sequence for this rank's queries: every "
                       "block merged with merge_blocks)")
                if got["backward_raised"]:
                    fail("ring-values", f"{where}: the backward failed: "
                                        f"{got['backward_raised']} (it returns the gradients of "
                                        "this rank's own q, k and v, of their shapes: after c "
                                        "steps each block's gradient is back on its own rank)")
                for i, g in ((1, "dq"), (2, "dk"), (3, "dv")):
                    close("ring-values", f"{where}: the gradient of {g[1]}", got[g],
                           refs.digest(ref[i][:, :, pos], wide), tol,
                           " (the backward passes each block with its gradients around the "
                           "ring: after c steps they are back on their own rank)")
                block = inputs.B * inputs.H * max(len(p) for p in positions) * hd
                _messages(where, got["forward"], got["neighbours"], 2 * block, "forward")
                _messages(where, got["backward"], got["neighbours"], 4 * block, "backward")
                names = [e[0] for e in got["forward"]]
                if c > 1 and "block_forward" in names and (
                        "isend" not in names and "send" not in names
                        or min(names.index(s) for s in ("isend", "send") if s in names)
                        > names.index("block_forward")):
                    fail("ring-messages", f"{where}: the first block was computed before it was "
                                          "sent on: start passing the held block (dist.isend, "
                                          "dist.irecv) before computing with it")
                if got["kept"] > 1.1 * got["own"]:
                    fail("ring-memory", f"{where}: the forward keeps {got['kept']} bytes for "
                                        f"the backward; at most 1.1 x {got['own']}, this "
                                        "rank's own q, k, v, output and log-sum-exp (a block "
                                        "received from another rank is passed again in the "
                                        "backward, never kept)")
                _work(where, got, positions, me, causal)
        _balanced(launch, res, cases)


def contiguous(pos):
    """The runs of consecutive positions of ``pos`` (a tensor)."""
    return refs.runs(pos.tolist())


def _work(where, got, positions, me, causal):
    fwd = sum(n for name, n, _ in got["forward"] if name == "block_forward")
    bwd = sum(n for name, n, _ in got["backward"] if name == "block_backward")
    L = len(positions[me])
    if fwd == 0 and L:
        fail("ring-work", f"{where}: block_forward was never called: compute every block "
                          "product with block_forward (and block_backward in the backward)")
    if bwd == 0 and L:
        fail("ring-work", f"{where}: block_backward was never called: compute every block's "
                          "share of the gradient with block_backward")
    if causal:
        S, c = sum(len(p) for p in positions), len(positions)
        chunk = -(-S // (2 * c if len(contiguous(positions[me])) > 1 or c == 1 else c))
        need = refs.causal_entries(positions[me].tolist(), positions)
        for phase, n in (("forward", fwd), ("backward", bwd)):
            if n > need + 2 * chunk * chunk:
                fail("ring-work", f"{where}: the {phase} computed {n} query x key entries; this "
                                  f"rank's queries see {need} keys in all (at most "
                                  f"{need + 2 * chunk * chunk} with the masked part of the "
                                  "diagonal pairs): leave out the pairs in which no query sees "
                                  "any key (block_pairs)")


def _balanced(launch, res, cases):
    """With the balanced split, causal: every rank's entries within one chunk's square."""
    for index, case in enumerate(cases):
        name, _, kind, causal, S = case
        if kind != "balanced" or not causal:
            continue
        for ring in {tuple(item["ring"]) for out in res for item in out["rings"]}:
            if S % (2 * len(ring)):
                continue        # uneven chunks: the layout itself is not balanced
            counts = {}
            for rank in ring:
                item = next(i for i in res[rank]["rings"] if tuple(i["ring"]) == ring)
                got = item["cases"].get(name, {})
                if "forward" in got:
                    counts[rank] = sum(n for e, n, _ in got["forward"] if e == "block_forward")
            chunk = math.ceil(S / (2 * len(ring)))
            if len(counts) == len(ring) and max(counts.values()) - min(counts.values()) > \
                    chunk * chunk:
                fail("ring-work", f"with {launch}, on the ring {list(ring)}, "
                                  f"{name.replace('-', ' ')}, S = {S}: the ranks computed "
                                  f"{counts} query x key entries; "
                                  f"with balanced_positions they must be within {chunk * chunk} "
                                  "(one chunk's square) of each other")


def _rings(size, specs):
    """Every ring a launch makes (lists of global ranks): the world's, and those of each spec."""
    return [list(range(size)) if spec is None else list(r) for spec in specs
            for r in ([None] if spec is None else spec)]


@check
def check_ring_attention(path):
    """Your merge_blocks, balanced_positions, block_pairs and RingAttention on rings of 1, 2, 3
    and 4 gloo ranks against attention in one process: values and gradients (float64 and
    float32, causal and not, balanced and contiguous splits), the ring's messages, what the
    forward keeps, and the work of each rank. Where links are observed (grading), with a long,
    wide case more, every directed link must carry what the ring's messages put there
    (``ring-wire``: right files measured 0.71 to 0.85 of each neighbour link's most, 0.03 to
    0.06 on the others; every block all-gathered beside the ring, 1.19 times a neighbour
    link's most)."""
    path = Path(path)
    if not path.is_file():
        raise CheckFailure(no_file(path))
    found, observed = [], observing()
    cases = inputs.ring_cases(observed)
    for launch, size, rings in inputs.RING_LAUNCHES:
        salts, links = {}, {}
        res = run_ranks(path, probes_ring.probe_ring, size, "gloo",
                        {"rings": rings, "wire": observed}, HANG_AFTER,
                        what=f"11_composed.py's ring attention with {launch}",
                        case="ring-messages", salts=salts, links=links)
        salts = [salts.get(r, 0) for r in range(size)]
        pure = res[0]["pure"]
        found = [pure["todo"]] if "todo" in pure else [
            v["todo"] for v in pure.values() if isinstance(v, dict) and "todo" in v]
        found += [got["todo"] for out in res for item in out["rings"]
                  for got in item["cases"].values() if "todo" in got]
        if "todo" not in pure:
            _check_pure(pure)
        _check_ring(launch, res, salts, cases)
        if not found:
            check_ring_wire(links, size, _rings(size, rings), cases, launch)
    if found:
        passed = [p for p in PIECES if p not in found + unimplemented(path)]
        unfinished(found, path, PIECES, "3 and 4", passed)
