"""Checker of notebook 10's tensor-parallel exercises (``ParallelMLP.from_mlp``,
``ParallelAttention.from_attention`` and what they are built of: f, g, column- and row-parallel
Linear) for ``work/10_model_parallel.py``.

``check_tensor_parallel`` launches 2, then 3 gloo ranks (:mod:`.probes`) and, for every block of
:data:`.nets.BLOCKS` (MLP, attention, causal attention; float64 and float32; weights, input and
upstream gradient salted with rank 0's salt at grading), compares with the judge's own
single-process block (:func:`.nets.reference`):

* ``tp-collectives``: per block exactly one ``dist.all_reduce`` in the forward (g) and one in
  the backward (f), no other collective, on every rank;
* ``tp-mlp-values`` / ``tp-attention-values``: every rank's output and input gradient equal the
  reference's, and every rank's parameter gradients equal its shard of the reference's (rows
  of q, k, v, fc1 and their biases, columns of o / fc2, their whole bias on every rank);
* ``tp-wire``: where links are observed (grading), with two blocks on a wide input more
  (:data:`.nets.WIRE_BLOCKS`), all links together carry what those all-reduces (and the probe's
  own calls) put there (:mod:`.wire`), whatever the ranks do to the recorder in their memory.

Tolerance: ``max |diff| <= tol * scale``, tol ``1e-10`` (float64) or ``1e-5`` (float32); the
scale of an output is its largest reference magnitude, that of a gradient the largest reference
gradient of the whole block (input gradient included): the gradient of the key bias is exactly
zero up to rounding (softmax ignores a constant added to a row of scores), so a tolerance
relative to each tensor's own magnitude would reject correct code.

Used in 10_bonus_model_parallel.
"""
from pathlib import Path

import numpy as np

from ..contract import CheckFailure, fail
from ..harness import HANG_AFTER, check, observing, run_ranks
from ..integrity import verify_rank0_number
from ..notebook_files import no_file, unimplemented, unwritten
from ..recorder import verify_no_hidden
from . import probes
from .nets import BLOCKS, PARAMS, blocks, reference, rows_of, shard
from .wire import check_tp_wire

__all__ = ["check_tensor_parallel"]

WORLD_SIZES = (2, 3)
TOL = {"float64": 1e-10, "float32": 1e-5}
LAYOUT = {"rows": "column-parallel: rank r holds rows [r*k, (r+1)*k) of the weight and of the "
                  "bias",
          "cols": "row-parallel: rank r holds columns [r*k, (r+1)*k) of the weight",
          "full": "row-parallel bias: whole on every rank, added once after the all-reduce, so "
                  "its gradient is the full bias gradient on every rank"}


def _launch(path, size, observed):
    salts, links = {}, {}
    res = run_ranks(path, probes.probe, size, "gloo", {"wire": observed}, HANG_AFTER,
                    what=f"10_model_parallel.py with {size} ranks", case="tp-collectives",
                    salts=salts, links=links)
    try:
        verify_no_hidden(res, f"with {size} ranks", "dist.all_reduce")
    except AssertionError as err:      # an integrity violation: no case of the contract
        raise CheckFailure(str(err)) from None
    verify_rank0_number(res, salts)
    return res, [salts.get(r, 0) for r in range(size)], links


PIECES = (("f and g", ("CopyToParallel", "ReduceFromParallel")),
          ("ColumnParallelLinear", ("ColumnParallelLinear",)),
          ("RowParallelLinear", ("RowParallelLinear",)),
          ("ParallelMLP", ("ParallelMLP",)), ("ParallelAttention", ("ParallelAttention",)))


def _todo(res, path):
    """The functions (``Class.method``) still raising NotImplementedError on any rank, and
    those of the tensor-parallel classes whose body still raises it (read from ``path``), in
    the order the notebook builds them (:data:`PIECES`)."""
    found = []
    for out in res:
        found += [r["todo"] for name, r in out["blocks"].items()
                  if "todo" in r and name != "layers"]
        layers = out["blocks"].get("layers", {})
        todo = layers.get("todo", [])       # (a list: the layers' own pieces)
        found += [todo] if isinstance(todo, str) else todo
        found += [got["todo"] for _, got in layers.get("errors", []) if "todo" in got]
        found += [layers["allowed"]["todo"]] if "todo" in layers.get("allowed", {}) else []
    order = [c for _, classes in PIECES for c in classes]
    if found:
        found += [name for name in unimplemented(path) if name.split(".")[0] in order]
    return sorted(dict.fromkeys(found), key=lambda name: order.index(name.split(".")[0])
                  if name.split(".")[0] in order else len(order))


def _unfinished(todo, path):
    """The verdict of a check whose finished pieces all passed: the first unfinished function,
    the pieces that passed, the rest still to do."""
    classes = {name.split(".")[0] for name in todo}
    passed = [piece for piece, members in PIECES if not classes & set(members)]
    raise CheckFailure("not implemented yet: " + unwritten(
        todo[0], path, todo[1:], passed=f"Finished and passing with "
        f"{' and '.join(map(str, WORLD_SIZES))} ranks: {', '.join(passed)}." if passed else ""))


def _describe(name):
    kind, dtype = name.rsplit("-", 1)
    if kind.endswith("-wire"):
        return f"the {kind[:-5]} block on a {rows_of(name)} batch in {dtype}"
    kind = "mlp (2-D input)" if kind == "mlp-2-d" else kind.replace("-", " ")
    return f"the {kind} block in {dtype}"


def _f_g_inputs(rank, salt):
    import torch
    from ..rankworker import salted_generator
    gen = salted_generator(4040 + rank, salt)
    x = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    return x.numpy(), torch.randn(3, 4, generator=gen, dtype=torch.float64).numpy()


def _check_f_g(size, res, salts):
    """f and g alone: f is the identity forward and sums the gradients backward; g sums
    forward and is the identity backward; neither modifies its input or the incoming
    gradient."""
    inputs = [_f_g_inputs(r, salts[r]) for r in range(size)]
    x_sum = sum(x for x, _ in inputs)
    up_sum = sum(u for _, u in inputs)
    for rank, out in enumerate(res):
        x, up = inputs[rank]
        want = {"CopyToParallel": (x, up_sum, "identity forward, the gradients summed over the "
                                              "ranks backward"),
                "ReduceFromParallel": (x_sum, up, "the inputs summed over the ranks forward, "
                                                  "the identity backward")}
        for name, (y, grad, what) in want.items():
            got = out["blocks"]["f-g"][name]
            where = f"with {size} ranks, rank {rank}: {name}.apply(x)"
            if _max_diff(got["y"], y) > 1e-12:
                fail("tp-f-g", f"{where} returned values off by {_max_diff(got['y'], y):.2e}; "
                               f"expected {what}")
            if got["x_grad"] is None or _max_diff(got["x_grad"], grad) > 1e-12:
                off = "None" if got["x_grad"] is None else f"{_max_diff(got['x_grad'], grad):.2e}"
                fail("tp-f-g", f"{where}: the gradient of x is off by {off}; expected {what}")
            if not got["x_kept"] or not got["up_kept"]:
                what_changed = "x" if not got["x_kept"] else "the incoming gradient"
                fail("tp-f-g", f"{where} modified {what_changed} in place: all-reduce a copy")


def _check_layers(size, res):
    """Column- and row-parallel shards of Linear layers with and without bias: values, dtype,
    a copy that requires grad; ValueError where a width does not divide by N."""
    for rank, out in enumerate(res):
        layers = out["blocks"]["layers"]
        if "shards" not in layers:      # (its code still raises: see _todo)
            continue
        for item in layers["shards"]:
            cls, full = item["cls"], {n: np.asarray(v) for n, v in item["full"].items()}
            rows = cls == "ColumnParallelLinear"
            want = {"weight": shard(full["weight"], "rows" if rows else "cols", rank, size),
                    "bias": (None if "bias" not in full else
                             shard(full["bias"], "rows" if rows else "full", rank, size))}
            where = (f"with {size} ranks, rank {rank}: {cls}.from_linear(Linear(in, out, "
                     f"bias={item['bias']}))")
            if not item["source_kept"]:
                fail("tp-layers", f"{where} changed the layer it was given: build the shard "
                                  "from a copy and leave the layer as it was")
            for n, value in want.items():
                got = item["got"][n]
                if value is None:
                    if got is not None:
                        fail("tp-layers", f"{where}.{n} is not None: a layer without a bias "
                                          "has bias None")
                    continue
                if not isinstance(got, dict):
                    fail("tp-layers", f"{where} has no {n} (got {got!r})")
                arr = np.asarray(got["value"])
                how = "rows" if rows else ("cols" if n == "weight" else "full")
                if arr.shape != value.shape:
                    fail("tp-layers", f"{where}.{n} has shape {arr.shape}; expected "
                                      f"{value.shape} ({LAYOUT[how]})")
                if arr.shape == value.shape and _max_diff(arr, value + 100.0) == 0 < arr.size:
                    fail("tp-layers", f"{where}.{n} changed when the layer's {n} changed "
                                      "after from_linear: it is a view of the layer's tensor; "
                                      "keep a copy (.clone())")
                if _max_diff(arr, value) > 0:
                    fail("tp-layers", f"{where}.{n} holds other values than expected (off by "
                                      f"up to {_max_diff(arr, value):.2e}): {LAYOUT[how]}")
                if got["dtype"] != "torch.float64" or not got["requires_grad"]:
                    fail("tp-layers", f"{where}.{n} is {got['dtype']}, requires_grad="
                                      f"{got['requires_grad']}; expected the layer's dtype "
                                      "(torch.float64) and a parameter that requires grad")
            w, b = full["weight"], full.get("bias")
            x = np.asarray(item["x"])
            y_full = x @ w.T + (0 if b is None else b)
            k = y_full.shape[1] // size
            want_y = y_full[:, rank * k:(rank + 1) * k] if rows else y_full
            y = np.asarray(item["y"])
            if y.shape != want_y.shape or _max_diff(y, want_y) > 1e-10 * max(1.0, np.abs(
                    want_y).max()):
                what = ("columns [r*k, (r+1)*k) of the full layer's output" if rows else
                        "the full layer's output (all-reduced, the bias added once, after the "
                        "all-reduce)")
                off = _max_diff(y, want_y) if y.shape == want_y.shape else None
                small = off is not None and off < 1e-5 * max(1.0, np.abs(want_y).max())
                fail("tp-layers", f"{where}: its forward returned "
                     + (f"values off by {off:.2e}" if off is not None
                        else f"shape {y.shape}, not {want_y.shape}")
                     + f"; expected {what}"
                     + (" (an error the size of float32's rounding: compute in the layer's "
                        "dtype, float64 here)" if small else ""))
        for name, kind, _, _ in BLOCKS:
            if not out["blocks"][name].get("source_kept", True):
                method = ("ParallelMLP.from_mlp" if kind == "mlp"
                          else "ParallelAttention.from_attention")
                fail("tp-layers", f"with {size} ranks, rank {rank}: {method}"
                                  f" changed the block it was given ({_describe(name)}): build "
                                  "the shards from copies and leave the block as it was")
        for name, kind, _, _ in BLOCKS:
            result = out["blocks"][name]
            shared, grads = result.get("source_shared", []), result.get("source_grads", [])
            if shared or grads:
                method, arg = (("ParallelMLP.from_mlp", "mlp") if kind == "mlp" else
                               ("ParallelAttention.from_attention", "attn"))
                did = " and ".join(
                    ([f"multiplying every parameter of the parallel block by 1.25 in place "
                      f"changed the block's {', '.join(shared)} too"] if shared else [])
                    + ([f"the parallel block's backward gave the block's {', '.join(grads)} a "
                        f"gradient"] if grads else []))
                fail("tp-layers", f"with {size} ranks, rank {rank}: the parallel block "
                                  f"{method} built shares parameters with the block it was "
                                  f"given ({_describe(name)}): {did}. `{arg}` itself is left "
                                  f"as it is: every shard is a copy (from_linear's), even the "
                                  f"row-parallel bias that every rank holds whole; never reuse "
                                  f"the block's own Parameters")
        allowed = layers.get("allowed", {})     # (unfinished entries: "todo", see _todo)
        if "raised" in allowed:
            fail("tp-layers", f"with {size} ranks, rank {rank}: ParallelMLP.from_mlp on an MLP "
                              f"whose hidden width divides by {size} (its model width does "
                              f"not) raised {allowed['raised']} ({allowed['message']}); only "
                              "the hidden width is split")
        for what, got in layers["errors"]:
            if "todo" not in got and got.get("raised") != "ValueError":
                did = (f"raised {got['raised']} ({got['message']})" if "raised" in got
                       else "returned")
                fail("tp-layers", f"with {size} ranks, rank {rank}: {what} on a layer whose "
                                  f"split width does not divide by {size} {did}; expected "
                                  "ValueError")


def _check_collectives(size, res, run=BLOCKS):
    for name, _, _, _ in run:
        for rank, out in enumerate(res):
            r = out["blocks"][name]
            for phase, want in (("forward", "g: the all-reduce of the row-parallel layer's "
                                            "partial outputs"),
                                ("backward", "f: the all-reduce of the input's gradient")):
                colls = [e for e in r[phase] if e[0] == "coll"]
                reduces = [e for e in colls if e[1] == "all_reduce"]
                others = sorted({e[1] for e in colls if e[1] != "all_reduce"})
                if others:
                    fail("tp-collectives",
                         f"with {size} ranks, rank {rank} issued {others} in the {phase} of "
                         f"{_describe(name)}: tensor parallelism needs only dist.all_reduce "
                         f"(one forward, one backward per block)")
                if len(reduces) != 1:
                    fail("tp-collectives",
                         f"with {size} ranks, rank {rank} issued {len(reduces)} all-reduce"
                         f"{'s' * (len(reduces) != 1)} in the {phase} of {_describe(name)} "
                         f"(sizes {[e[2] for e in reduces]}); expected exactly 1 ({want}). "
                         + ("Is f (CopyToParallel) in front of the block, shared by q, k and v, "
                            "and does its backward all-reduce the gradient?"
                            if phase == "backward" else
                            "Only the row-parallel layer's output is all-reduced, once; the "
                            "column-parallel layer communicates nothing."))


def _max_diff(a, e):
    a, e = np.asarray(a, dtype=np.float64), np.asarray(e, dtype=np.float64)
    return float(np.max(np.abs(a - e))) if a.size else 0.0


def _compare(case, size, rank, name, what, got, want, scale, tol, hint=""):
    if got is None:
        fail(case, f"with {size} ranks, rank {rank}: {what} of {_describe(name)} is None "
                   f"(no gradient reached it){hint}")
    got = np.asarray(got)
    if got.shape != want.shape:
        fail(case, f"with {size} ranks, rank {rank}: {what} of {_describe(name)} has shape "
                   f"{tuple(got.shape)}, expected {tuple(want.shape)}{hint}")
    diff = _max_diff(got, want)
    if not np.isfinite(diff) or diff > tol * scale:
        fail(case, f"with {size} ranks, rank {rank}: {what} of {_describe(name)} differs from "
                   f"one process by {diff:.2e} (max abs difference; tolerance {tol:g} x "
                   f"{scale:.2e}, the largest reference magnitude){hint}")


def _check_values(size, res, salts, kinds, run=BLOCKS):
    for name, kind, dtype, causal in run:
        if kind not in kinds:
            continue
        case = "tp-mlp-values" if kind == "mlp" else "tp-attention-values"
        ref = reference(kind, dtype, causal, salts, salts[0], rows_of(name))
        tol = TOL[dtype]
        out_scale = float(np.max(np.abs(ref["out"])))
        grad_scale = max([float(np.max(np.abs(g))) for g in ref["grads"].values()]
                         + [float(np.max(np.abs(ref["x_grad"])))])
        for rank, out in enumerate(res):
            r = out["blocks"][name]
            if r["missing"]:
                fail(case, f"with {size} ranks, rank {rank}: the parallel version of "
                           f"{_describe(name)} has no {r['missing']}: keep the layers as "
                           f"attributes with the names of the single-process block")
            if r["out_dtype"] != f"torch.{dtype}":
                fail(case, f"with {size} ranks, rank {rank}: the output of {_describe(name)} "
                           f"is {r['out_dtype']}, expected torch.{dtype}: keep the dtype of "
                           f"the block's weights")
            _compare(case, size, rank, name, "the output", r["out"], ref["out"], out_scale, tol,
                     " (every rank must return the full block's output: the bias of the "
                     "row-parallel layer added once, after the all-reduce"
                     + ("; heads split as whole heads, n_heads the LOCAL count)"
                        if kind == "attention" else ")"))
        for rank, out in enumerate(res):
            r = out["blocks"][name]
            _compare(case, size, rank, name, "the input gradient", r["x_grad"], ref["x_grad"],
                     grad_scale, tol, " (f's backward sums the ranks' partial gradients)")
            for pname, how in PARAMS[kind]:
                _compare(case, size, rank, name, f"the gradient of {pname}",
                         r["grads"].get(pname), shard(ref["grads"][pname], how, rank, size),
                         grad_scale, tol, f" ({LAYOUT[how]})")


@check
def check_tensor_parallel(path):
    """Your ``ParallelMLP`` and ``ParallelAttention`` with 2 and 3 gloo ranks against one
    process: outputs, input gradients and every rank's parameter-gradient shards (float64 and
    float32), and exactly one all-reduce forward and one backward per block. Where links are
    observed (grading) with two blocks on a wide input more, and all links together must carry
    what those all-reduces put there (``tp-wire``, :mod:`.wire`: right files measured 1.08 to
    1.09 times the least, 0.89 to 0.92 of the most; the MLP's whole hidden activation gathered
    beside them, 1.11 times the most)."""
    path = Path(path)
    if not path.is_file():
        raise CheckFailure(no_file(path))
    observed = observing()
    todo = []
    for size in WORLD_SIZES:     # piece by piece: a finished piece is judged before any todo
        res, salts, links = _launch(path, size, observed)
        todo = _todo(res, path)
        run = [b for b in blocks(observed)
               if not any("todo" in out["blocks"][b[0]] for out in res)]
        if not any("todo" in out["blocks"]["f-g"] for out in res):
            _check_f_g(size, res, salts)
        _check_layers(size, res)
        _check_collectives(size, res, run)
        _check_values(size, res, salts, ("mlp",), run)
        _check_values(size, res, salts, ("attention",), run)
        if not todo:
            check_tp_wire(links, size, run)
    if todo:
        _unfinished(todo, path)

