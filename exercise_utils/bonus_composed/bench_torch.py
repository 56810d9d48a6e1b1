r"""Notebook 11's comparison with torch's own composition: your composed step against torch's
tensor parallelism (``parallelize_module``) inside torch's pipelining (``PipelineStage`` +
``ScheduleGPipe``) on a ``DeviceMesh``, with the gradients averaged over its ``dp`` group.

A torchrun script on 8 gloo ranks (CPU, one thread each), importing the student file::

    python -m torch.distributed.run --nproc-per-node 8 \
        -m exercise_utils.bonus_composed.bench_torch \
        --work work/11_composed.py --out results/11_composed_torch.json

The model: your ``GPT`` (:data:`.network.MODEL`'s sizes, seed 0, float32) and a batch (seed 1).
Yours: ``GPTStage.from_model`` on your ``Mesh(2, 2, 2)`` and ``composed_step``. Torch's: on
``init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "pp", "tp"))`` (the same ranks:
``tp`` fastest), stage ``p`` holds the same blocks (``stage_layers``) with the query, key and
value projections as three ``Linear`` (the fused ``qkv``'s rows), ``ColwiseParallel`` on them
and on fc1, ``RowwiseParallel`` on proj and fc2, the embedding ``RowwiseParallel`` and the head
``ColwiseParallel`` gathered (torch's loss on the whole logits); ``PipelineStage`` over the
mesh's ``pp`` group, ``ScheduleGPipe`` with one micro-batch, then every gradient all-reduced
over the ``dp`` group and divided by 2. The two run interleaved, ``WARMUP`` untimed rounds then
``REPS`` timed ones (a barrier before each), the slowest rank's median. Rank 0 writes one row:
``mine_ms``, ``torch_ms``, ``ratio`` (yours / torch's), the losses of both (replica 0's for
torch: its schedule's own) and ``grad_diff``, the largest difference of the blocks' gradients
(every rank's shards). Used in 11_bonus_composed (:func:`run`, :func:`table`).
"""
import copy
import statistics
import time

from ..bench import script_parser
from ..config import quick
from .network import MODEL, model_and_batch

WARMUP = 1
REPS = quick(5, 2)
THREADS = 1
PG_TIMEOUT_S = 120
TIMEOUT = quick(300, 200)
WORLD = 8


def parse_args(argv=None):
    return script_parser("your composed step against torch's composition on 8 gloo ranks",
                         "work/11_composed.py", "results/11_composed_torch.json",
                         {**MODEL, "reps": REPS, "threads": THREADS}).parse_args(argv)


def torch_stage(student, model, p, args):
    """Stage ``p`` of ``model`` as torch's composition holds it, before parallelizing."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    d, heads = args.width, args.heads

    class Block(nn.Module):
        def __init__(self, block):
            super().__init__()
            self.ln1, self.ln2, self.proj = block.ln1, block.ln2, block.proj
            self.fc1, self.fc2 = block.fc1, block.fc2
            self.q, self.k, self.v = (nn.Linear(d, d) for _ in range(3))
            with torch.no_grad():
                for i, lin in enumerate((self.q, self.k, self.v)):
                    lin.weight.copy_(block.qkv.weight[i * d:(i + 1) * d])
                    lin.bias.copy_(block.qkv.bias[i * d:(i + 1) * d])
            self.heads = heads

        def forward(self, x):
            h = self.ln1(x)
            b, s, _ = h.shape
            q, k, v = (f(h).reshape(b, s, -1, d // heads).transpose(1, 2)
                       for f in (self.q, self.k, self.v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, -1))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            m = copy.deepcopy(model)
            first, last = p == 0, p == 1
            self.tok, self.pos = (m.tok, m.pos) if first else (None, None)
            self.blocks = nn.ModuleList(Block(m.blocks[i])
                                        for i in student.stage_layers(args.layers, 2, p))
            self.norm, self.head = (m.norm, m.head) if last else (None, None)

        def forward(self, x):
            if self.tok is not None:
                x = self.tok(x) + self.pos(torch.arange(x.shape[1]))
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x)) if self.head is not None else x
    return Stage()


def benchmark(student, args, rank, world):
    """Rank 0's row (see the module docstring)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    if world != WORLD:
        raise ValueError(f"the comparison runs on {WORLD} ranks, not {world}")
    model, tokens, targets = model_and_batch(student, args)
    mesh = student.Mesh(2, 2, 2)
    mine = student.GPTStage.from_model(model, mesh)
    tm = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "pp", "tp"))
    d, p, t = tm.get_coordinate()
    st = torch_stage(student, model, p, args)
    plan = {"tok": RowwiseParallel(input_layouts=Replicate())} if p == 0 else {
        "head": ColwiseParallel(output_layouts=Replicate())}
    for j in range(len(st.blocks)):
        plan.update({f"blocks.{j}.{n}": ColwiseParallel() for n in ("q", "k", "v", "fc1")})
        plan.update({f"blocks.{j}.{n}": RowwiseParallel() for n in ("proj", "fc2")})
    parallelize_module(st, tm["tp"], plan)
    for block in st.blocks:
        block.heads = args.heads // 2
    b = args.batch // 2
    rows = slice(d * b, (d + 1) * b)
    # what each stage receives and sends, requiring grad: the schedule then sends gradients back
    shapes = ((torch.zeros(b, args.seq, dtype=torch.long),
               torch.zeros(b, args.seq, args.width, requires_grad=True)) if p == 0 else
              (torch.zeros(b, args.seq, args.width, requires_grad=True),
               torch.zeros(b, args.seq, args.vocab, requires_grad=True)))
    stage = PipelineStage(st, p, 2, torch.device("cpu"), input_args=(shapes[0],),
                          output_args=(shapes[1],), group=tm["pp"].get_group())

    def loss_fn(out, tgt):
        return F.cross_entropy(out.flatten(0, 1), tgt.flatten())
    schedule = ScheduleGPipe(stage, n_microbatches=1, loss_fn=loss_fn)
    losses = {"mine": None, "torch": None}

    def yours():
        for q in mine.parameters():
            q.grad = None
        losses["mine"] = student.composed_step(mine, tokens, targets, mesh)

    def torchs():
        for q in st.parameters():
            q.grad = None
        got = []
        if p == 0:
            schedule.step(tokens[rows])
        else:
            schedule.step(target=targets[rows], losses=got)
            losses["torch"] = float(got[0].detach())
        for q in st.parameters():
            g = q.grad.to_local() if hasattr(q.grad, "to_local") else q.grad
            dist.all_reduce(g, group=tm["dp"].get_group())
            g /= 2
    times = {"mine": [], "torch": []}
    for r in range(WARMUP + args.reps):
        for name, step in (("mine", yours), ("torch", torchs))[::1 if r % 2 else -1]:
            dist.barrier()
            start = time.perf_counter()
            step()
            if r >= WARMUP:
                times[name].append(time.perf_counter() - start)
    diff = _grad_diff(mine, st, args)
    both = torch.tensor([[statistics.median(times["mine"]), statistics.median(times["torch"]),
                          diff]], dtype=torch.float64)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    loss = torch.tensor([losses["torch"] if (d, p, t) == (0, 1, 0) else 0.0],
                        dtype=torch.float64)
    dist.all_reduce(loss)
    mine_ms, torch_ms, diff = (float(v) for v in both[0])
    return [{"world_size": world, **{k: getattr(args, k) for k in MODEL},
             "mine_ms": 1e3 * mine_ms, "torch_ms": 1e3 * torch_ms,
             "ratio": mine_ms / torch_ms, "loss_mine": losses["mine"],
             "loss_torch_replica0": float(loss), "grad_diff": diff,
             "threads": torch.get_num_threads()}]


def _grad_diff(mine, st, args):
    """The largest difference between your blocks' gradients and torch's (this rank's shards)."""
    import torch

    def local(g):
        return g.to_local() if hasattr(g, "to_local") else g
    worst = 0.0
    for a, b in zip(mine.blocks, st.blocks):
        qkv = torch.cat([local(x.weight.grad) for x in (b.q, b.k, b.v)])
        pairs = [(a.w_qkv.grad, qkv), (a.w_proj.grad, local(b.proj.weight.grad)),
                 (a.b_proj.grad, local(b.proj.bias.grad)), (a.w1.grad, local(b.fc1.weight.grad)),
                 (a.b1.grad, local(b.fc1.bias.grad)), (a.w2.grad, local(b.fc2.weight.grad)),
                 (a.b2.grad, local(b.fc2.bias.grad)), (a.ln1.weight.grad, local(b.ln1.weight.grad)),
                 (a.ln2.bias.grad, local(b.ln2.bias.grad))]
        worst = max([worst] + [float((x - y).abs().max()) for x, y in pairs])
    return worst


def main(argv=None):
    """Entry point of every rank started by torchrun (see the module docstring)."""
    from ..bench import rank_rows
    rank_rows(benchmark, parse_args(argv), PG_TIMEOUT_S)


def run(work="work/11_composed.py", out="results/11_composed_torch.json", echo=True,
        timeout=TIMEOUT):
    """Launch the comparison on the student's ``work`` (8 ranks); return its row."""
    from ..bench import torchrun_rows
    return torchrun_rows(__name__, (WORLD,), out, ["--work", work], timeout, echo, THREADS,
                         env=None)


def table(rows):
    """The row as text."""
    from ..bench import format_table, load_note
    cols = [("mine_ms", "your step ms"), ("torch_ms", "torch's step ms"),
            ("ratio", "yours / torch's"), ("loss_mine", "your loss"),
            ("grad_diff", "max gradient difference")]
    return format_table(rows, cols, {"mine_ms": ".0f", "torch_ms": ".0f", "ratio": ".2f",
                                     "loss_mine": ".6f", "grad_diff": ".1e"}) + load_note(rows)


if __name__ == "__main__":
    main()
