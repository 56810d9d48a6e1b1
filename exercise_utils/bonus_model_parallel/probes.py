"""Probe of notebook 10's tensor-parallel checker: runs inside every gloo rank (2 and 3 ranks,
:mod:`.checks`).

Rank 0's salt (``ctx.salt``; 0 when unsalted) reaches the other ranks by one broadcast made
before the recorder is installed: tensor parallelism needs the same weights and input on every
rank. For every block of :data:`.nets.BLOCKS` (MLP, attention, causal attention; float64 and
float32; where links are observed :data:`.nets.WIRE_BLOCKS` too, on a wide input), each part
named with ``ctx.case`` before it runs: the judge's reference block
(:func:`.nets.build`) is wrapped with the student's ``ParallelMLP.from_mlp`` /
``ParallelAttention.from_attention``, run forward on ``x`` (which requires grad) and backward
from ``(out * upstream).sum()``; the collectives of the forward and of the backward are
recorded separately (:class:`~exercise_utils.recorder.Recorder`). Returned as plain data: the
output, the gradient of ``x``, this rank's gradient of every parameter the contract names
(``None`` where it has none, ``"missing"`` where the attribute does not exist), the events, and
whether the reference block was left as it was: by the wrapping, by the in-place update of the
parallel block (a shard that is one of the block's own Parameters changes with it) and by the
backward pass (no gradient may reach the block's parameters).

Used in 10_bonus_model_parallel.
"""
import torch
import torch.distributed as dist

from ..rankworker import not_implemented
from ..recorder import Recorder
from .nets import PARAMS, SCALE, blocks, build, rows_of


def _attr(module, dotted):
    for part in dotted.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


def _run_block(student, rec, kind, dtype, causal, salts, public, rows):
    block, x, upstream = build(kind, dtype, causal, salts, public, rows)
    before = {k: v.clone() for k, v in block.state_dict().items()}
    if kind == "mlp":
        par = student.ParallelMLP.from_mlp(block)
    else:
        par = student.ParallelAttention.from_attention(block)
    source_kept = all(torch.equal(v, before[k]) for k, v in block.state_dict().items())
    with torch.no_grad():            # every shard changes after the wrapping (the judge's
        for q in par.parameters():   # reference too): a copy of the block kept aside is stale
            q.mul_(SCALE)
    # ... and the block given to from_mlp / from_attention must not change with it: a shard
    # that is one of the block's own Parameters (its bias reused, not copied) changes it
    shared = sorted(k for k, v in block.state_dict().items() if not torch.equal(v, before[k]))
    rec.take()
    out = par(x)
    forward = rec.take()
    (out * upstream).sum().backward()
    backward = rec.take()
    source_grads = sorted(n for n, q in block.named_parameters() if q.grad is not None)
    grads, missing = {}, []
    for name, _ in PARAMS[kind]:
        p = _attr(par, name)
        if not isinstance(p, torch.Tensor):
            missing.append(name)
        elif p.grad is not None:
            grads[name] = p.grad.detach().double().numpy().copy()
    return {"out": out.detach().double().numpy().copy(), "out_dtype": str(out.dtype),
            "x_grad": None if x.grad is None else x.grad.double().numpy().copy(),
            "grads": grads, "missing": missing, "forward": forward, "backward": backward,
            "source_kept": source_kept, "source_shared": shared, "source_grads": source_grads}


def _f_and_g(student, rank, size, salt):
    """f and g alone, float64: each rank's input and upstream gradient differ (drawn from the
    rank's own number: at grading no rank can rebuild another's), so sums over the ranks
    show."""
    from ..rankworker import salted_generator
    out = {}
    for name in ("CopyToParallel", "ReduceFromParallel"):
        gen = salted_generator(4040 + rank, salt)
        x = torch.randn(3, 4, generator=gen, dtype=torch.float64).requires_grad_(True)
        up = torch.randn(3, 4, generator=gen, dtype=torch.float64)
        x_before, up_before = x.detach().clone(), up.clone()
        y = getattr(student, name).apply(x)
        y_value = y.detach().clone()
        y.backward(up)
        out[name] = {"y": y_value.numpy().tolist(), "x_grad": None if x.grad is None
                     else x.grad.numpy().tolist(),
                     "x_kept": bool(torch.equal(x.detach(), x_before)),
                     "up_kept": bool(torch.equal(up, up_before))}
    return out


def _layers(student, size):
    """Column- and row-parallel shards of float64 Linear layers with and without bias, then of
    layers whose widths do not divide by N (ValueError expected), and the blocks that do not."""
    out = {"shards": [], "errors": [], "todo": []}
    gen = torch.Generator().manual_seed(5050)
    for cls_name in ("ColumnParallelLinear", "RowParallelLinear"):
        try:
            _shards(student, size, cls_name, gen, out["shards"])
        except NotImplementedError as exc:        # the other pieces are still judged
            out["todo"].append(not_implemented(student, exc)["todo"])
    from .nets import RefAttention, RefMLP
    bad = (("ColumnParallelLinear.from_linear", lambda: student.ColumnParallelLinear.from_linear(
                torch.nn.Linear(4, 2 * size + 1))),
           ("RowParallelLinear.from_linear", lambda: student.RowParallelLinear.from_linear(
                torch.nn.Linear(2 * size + 1, 4))),
           ("ParallelMLP.from_mlp", lambda: student.ParallelMLP.from_mlp(
                RefMLP(2 * size, 2 * size + 1))),
           ("ParallelAttention.from_attention", lambda: student.ParallelAttention.from_attention(
                RefAttention((size + 1) * size, size + 1))))
    for what, make in bad:
        try:
            make()
            got = {"returned": True}
        except NotImplementedError as exc:
            got = not_implemented(student, exc)
        except Exception as exc:
            got = {"raised": type(exc).__name__, "message": str(exc)[:200]}
        out["errors"].append([what, got])
    try:                                   # h divides by N, d does not: no reason to refuse
        student.ParallelMLP.from_mlp(RefMLP(2 * size + 1, 2 * size))
        out["allowed"] = {"returned": True}
    except NotImplementedError as exc:
        out["allowed"] = not_implemented(student, exc)
    except Exception as exc:
        out["allowed"] = {"raised": type(exc).__name__, "message": str(exc)[:200]}
    return out


def _shards(student, size, cls_name, gen, shards):
    """``cls_name``'s shards of float64 Linear layers with and without bias, appended to
    ``shards``."""
    for bias in (True, False):
        lin = torch.nn.Linear(2 * size, 3 * size, bias=bias).double()
        with torch.no_grad():
            for q in lin.parameters():
                q.copy_(torch.randn(q.shape, generator=gen, dtype=torch.float64))
        full = {n: q.detach().clone().numpy().tolist() for n, q in lin.named_parameters()}
        saved = [q.detach().clone() for q in lin.parameters()]
        layer = getattr(student, cls_name).from_linear(lin)
        source_kept = all(torch.equal(q, v) for q, v in zip(lin.parameters(), saved))
        x = torch.randn(5, 2 * size, generator=gen, dtype=torch.float64)
        k = lin.in_features // size               # the row layer's slice of the input
        y = layer(x if cls_name == "ColumnParallelLinear"
                  else x[:, dist.get_rank() * k:(dist.get_rank() + 1) * k])
        with torch.no_grad():                  # the shard must be a copy
            for q in lin.parameters():
                q.add_(100.0)
        got = {}
        for n in ("weight", "bias"):
            q = getattr(layer, n, "missing")
            got[n] = (q if q is None or isinstance(q, str) else
                      {"value": q.detach().double().numpy().tolist(), "dtype": str(q.dtype),
                       "requires_grad": bool(q.requires_grad)})
        shards.append({"cls": cls_name, "bias": bias, "full": full, "got": got,
                       "x": x.numpy().tolist(), "source_kept": source_kept,
                       "y": y.detach().double().numpy().tolist()})


def probe(student, ctx, only=None, wire=False):
    """``{"salt0": rank 0's salt, "blocks": {name: result}, "hidden": [...]}`` for the blocks
    of :func:`.nets.blocks` (``wire``: the wide ones too; ``only``: these names only); a block
    whose code still raises NotImplementedError gives ``{"todo": function}``."""
    torch.set_num_threads(1)     # 2-3 ranks on 2 cores, small tensors
    salt = torch.tensor([getattr(ctx, "salt", 0) if ctx.rank == 0 else 0], dtype=torch.int64)
    dist.broadcast(salt, src=0)
    salt0 = int(salt.item())
    own = getattr(ctx, "salt", 0)
    mine = [own] * ctx.size           # this rank's number for every part: only its own is true
    rec = Recorder()
    rec.install(student)
    results = {}
    try:
        ctx.case("tp-f-g")
        try:
            results["f-g"] = _f_and_g(student, ctx.rank, ctx.size, own)
        except NotImplementedError as exc:
            results["f-g"] = not_implemented(student, exc)
        rec.take()
        ctx.case("tp-layers")
        try:
            results["layers"] = _layers(student, ctx.size)
        except NotImplementedError as exc:
            results["layers"] = not_implemented(student, exc)
        rec.take()
        for name, kind, dtype, causal in blocks(wire):
            if only is not None and name not in only:
                continue
            ctx.case("tp-mlp-values" if kind == "mlp" else "tp-attention-values")
            try:
                results[name] = _run_block(student, rec, kind, dtype, causal, mine, salt0,
                                           rows_of(name))
            except NotImplementedError as exc:
                results[name] = not_implemented(student, exc)
        hidden = rec.take_hidden()
    finally:
        rec.uninstall()
    return {"salt0": salt0, "blocks": results, "hidden": hidden}
