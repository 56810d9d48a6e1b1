"""Notebook 10's try cells (issue 39): each part of ``work/10_model_parallel.py`` run as soon
as it is written, on 2 gloo ranks (the pipeline: 2 stages), printing what it computed beside
what one process computes, in numbers a student can read (:mod:`exercise_utils.tries`). Not a
check: nothing is judged or graded here (the CHECK cells do that); a wrong part shows as a
difference, a part not written yet as the short box of :mod:`exercise_utils.display`.

    from exercise_utils.bonus_model_parallel import tries
    tries.run("f_and_g")        # then "layers", "blocks" and "pipeline"
    tries.schedules()           # in the notebook's own process: the orders for p = 3, m = 4

Used in 10_bonus_model_parallel.
"""
import torch

from .. import tries as core

WORK = "work/10_model_parallel.py"


def run(piece, work=WORK):
    """Run the try of ``piece`` (``"f_and_g"``, ``"layers"``, ``"blocks"`` or
    ``"pipeline"``) with the file ``work`` on 2 gloo ranks; print what each computed."""
    core.run(TRIES, piece, work)


def schedules(work=WORK, stages=3, microbatches=4):
    """Print the file's GPipe and 1F1B orders of every stage (no ranks needed)."""
    core.ready(work, ("gpipe_order", "one_f_one_b_order"))
    from ..rankworker import load_student
    mine = load_student(work)
    print(f"p = {stages} stages, m = {microbatches} micro-batches")
    for s in range(stages):
        orders = [" ".join(f"{kind}{j}" for kind, j in order(stages, microbatches, s))
                  for order in (mine.gpipe_order, mine.one_f_one_b_order)]
        print(f"stage {s}:  GPipe {orders[0]:<{6 * microbatches}}  1F1B {orders[1]}")


# ----------------------------------------------------------------------------- in the ranks
def _diff(a, b):
    return f"{float((a - b).detach().abs().max()):.1e}"


def try_f_and_g(mine, ctx):
    rank, world = ctx.rank, ctx.size
    x = torch.tensor([1.0, 2.0], dtype=torch.float64) * (rank + 1)
    total = [v * world * (world + 1) / 2 for v in (1.0, 2.0)]
    xf = x.clone().requires_grad_()
    yf = mine.CopyToParallel.apply(xf)
    yf.backward(torch.ones_like(yf))
    xg = x.clone().requires_grad_()
    yg = mine.ReduceFromParallel.apply(xg)
    yg.backward(torch.ones_like(yg))
    return [f"x = {x.tolist()} (each backward below is given a gradient of ones)",
            f"f(x) = {yf.detach().tolist()} (expected {x.tolist()}), backward "
            f"{xf.grad.tolist()} (expected {[float(world)] * 2})",
            f"g(x) = {yg.detach().tolist()} (expected {total}), backward "
            f"{xg.grad.tolist()} (expected [1.0, 1.0])"]


def try_layers(mine, ctx):
    rank, world = ctx.rank, ctx.size
    nn = torch.nn
    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(8, 4 * world).double(), nn.Linear(4 * world, 8).double()
    x = torch.randn(3, 8, dtype=torch.float64)
    col = mine.ColumnParallelLinear.from_linear(fc1)
    row = mine.RowParallelLinear.from_linear(fc2)
    k = fc1.out_features // world
    full = fc1(x).detach()
    mine_col = col(x)
    out = row(mine_col)
    return [f"fc1 column-parallel: weight {tuple(col.weight.shape)}, output "
            f"{tuple(mine_col.shape)}; max difference from the full output's columns "
            f"{rank * k}..{(rank + 1) * k - 1}: {_diff(mine_col, full[:, rank * k:(rank + 1) * k])}",
            f"fc2 row-parallel: weight {tuple(row.weight.shape)}; after the all-reduce, max "
            f"difference from fc2(fc1(x)): {_diff(out, fc2(full))}"]


def try_blocks(mine, ctx):
    rank, world = ctx.rank, ctx.size
    torch.manual_seed(0)
    mlp = mine.MLP(8, 4 * world).double()
    attn = mine.Attention(8, 2 * world, causal=True).double()
    lines = []
    for name, block, wrap in (("MLP", mlp, mine.ParallelMLP.from_mlp),
                              ("causal attention", attn, mine.ParallelAttention.from_attention)):
        x = torch.randn(2, 5, 8, dtype=torch.float64)
        xr, xp = x.clone().requires_grad_(), x.clone().requires_grad_()
        ref, par = block(xr), wrap(block)(xp)
        ref.sum().backward()
        par.sum().backward()
        lines.append(f"{name}: max difference from one process: output {_diff(par, ref)}, "
                     f"input gradient {_diff(xp.grad, xr.grad)}")
    return lines


def try_pipeline(mine, ctx):
    rank, world = ctx.rank, ctx.size
    nn = torch.nn
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(4, 6), nn.Tanh()), nn.Linear(6, 3)]
    model = nn.Sequential(*layers).double()
    x, t = torch.randn(7, 4, dtype=torch.float64), torch.randn(7, 3, dtype=torch.float64)
    loss_fn = nn.functional.mse_loss
    reference = loss_fn(model(x), t)
    reference.backward()
    expected = [p.grad.clone() for p in layers[rank].parameters()]
    lines = []
    for name, order in (("GPipe", mine.gpipe_order), ("1F1B", mine.one_f_one_b_order)):
        stage = layers[rank]
        stage.zero_grad()
        loss = mine.pipeline_step(stage, order(world, 3, rank), x if rank == 0 else None,
                                  t if rank == world - 1 else None, loss_fn)
        worst = max(float((p.grad - e).abs().max()) for p, e in zip(stage.parameters(), expected))
        said = (f"loss {loss:.6f} (one process {float(reference.detach()):.6f}); "
                if loss is not None else "")
        lines.append(f"{name}, 3 micro-batches of 7 samples: {said}max gradient difference "
                     f"{worst:.1e}")
    return lines


TRIES = {
    "f_and_g": core.Try(try_f_and_g, ("CopyToParallel.forward", "CopyToParallel.backward",
                                      "ReduceFromParallel.forward",
                                      "ReduceFromParallel.backward"), "f and g"),
    "layers": core.Try(try_layers, ("ColumnParallelLinear.from_linear",
                                    "ColumnParallelLinear.forward",
                                    "RowParallelLinear.from_linear", "RowParallelLinear.forward"),
                       "the column- and row-parallel layers"),
    "blocks": core.Try(try_blocks, ("ParallelMLP.from_mlp", "ParallelMLP.forward",
                                    "ParallelAttention.from_attention",
                                    "ParallelAttention.forward"), "the MLP and the attention"),
    "pipeline": core.Try(try_pipeline, ("gpipe_order", "one_f_one_b_order", "pipeline_step"),
                         "a 2-stage pipeline step"),
}
