r"""Notebook 11's memory per dimension: what one rank holds when the same GPT is split along one
dimension of the mesh only (data, pipeline or tensor parallelism), against one process.

A torchrun script on gloo ranks (CPU, one thread each), importing the student file::

    python -m torch.distributed.run --nproc-per-node 2 \
        -m exercise_utils.bonus_composed.bench_memory \
        --work work/11_composed.py --out results/11_composed_memory.json

On ``n`` ranks, your ``GPT`` (:data:`.network.MODEL`'s sizes, seed 0, float32) on a batch (seed
1), cut by ``GPTStage.from_model`` on your ``Mesh`` of each shape ``(n, 1, 1)``, ``(1, n, 1)``
and ``(1, 1, n)`` (one shape, ``(1, 1, 1)``, on one rank), one ``composed_step``. Per rank:
``params``, the bytes of its stage's parameters; ``saved``, the bytes the forward kept for the
backward (a saved-tensors hook around the step: every floating-point tensor autograd saved,
parameters and tensors saved twice counted once; the step's own messages and collectives
save nothing). Rank 0 writes one row per shape with the largest rank's of each (the rank that
decides what a machine must hold) and their mean. Used in 11_bonus_composed (:func:`run`,
:func:`table`).
"""
from ..bench import script_parser
from ..config import quick
from .bench_sp import saving
from .network import MODEL, model_and_batch

WORLD_SIZES = quick((1, 2, 4), (1, 2))
THREADS = 1
PG_TIMEOUT_S = 120
TIMEOUT = quick(300, 200)
DIMS = ("dp", "pp", "tp")


def parse_args(argv=None):
    return script_parser("a rank's memory when the GPT is split along one dimension",
                         "work/11_composed.py", "results/11_composed_memory.json",
                         {**MODEL, "threads": THREADS}).parse_args(argv)


def shapes(world):
    """The meshes measured on ``world`` ranks: each dimension alone (one shape on one rank)."""
    if world == 1:
        return [(1, 1, 1)]
    return [tuple(world if i == k else 1 for i in range(3)) for k in range(3)]


def measure(student, args, shape):
    """This rank's ``(params, saved)`` bytes on the mesh ``shape``."""
    model, tokens, targets = model_and_batch(student, args)
    mesh = student.Mesh(*shape)
    stage = student.GPTStage.from_model(model, mesh)
    params = {p.data_ptr() for p in stage.parameters()}
    held = sum(p.numel() * p.element_size() for p in stage.parameters())
    saved = [0]
    with saving(params, lambda nbytes: saved.__setitem__(0, saved[0] + nbytes)):
        student.composed_step(stage, tokens, targets, mesh)
    return held, saved[0]


def benchmark(student, args, rank, world):
    """Rank 0's rows: one per shape (every rank measures; rank 0 gathers)."""
    import warnings

    import torch.distributed as dist
    warnings.filterwarnings("ignore", category=FutureWarning)  # (torch 2.14: *_single names)
    rows = []
    for shape in shapes(world):
        mine = measure(student, args, shape)
        every = [None] * world
        dist.all_gather_object(every, mine)
        dim = next((name for name, n in zip(DIMS, shape) if n > 1), "none")
        rows.append({"world_size": world, "shape": list(shape), "dim": dim,
                     "params_max": max(p for p, _ in every),
                     "params_mean": sum(p for p, _ in every) / world,
                     "saved_max": max(s for _, s in every),
                     "saved_mean": sum(s for _, s in every) / world,
                     "batch": args.batch, "seq": args.seq, "width": args.width})
    return rows


def main(argv=None):
    """Entry point of every rank started by torchrun (see the module docstring)."""
    from ..bench import rank_rows
    rank_rows(benchmark, parse_args(argv), PG_TIMEOUT_S)


def run(work="work/11_composed.py", out="results/11_composed_memory.json",
        world_sizes=WORLD_SIZES, echo=True, timeout=TIMEOUT):
    """Launch the measurement on the student's ``work``, once per number of ranks; return the
    rows (also written to ``out``)."""
    from ..bench import torchrun_rows
    return torchrun_rows(__name__, world_sizes, out, ["--work", work], timeout, echo, THREADS,
                         env=None)


def summary(rows):
    """One row per split: the largest rank's parameters and saved activations as fractions of
    one process's (the ``(1, 1, 1)`` row)."""
    base = next(r for r in rows if r["dim"] == "none")
    out = []
    for r in sorted((r for r in rows if r["dim"] != "none"),
                    key=lambda r: (DIMS.index(r["dim"]), r["world_size"])):
        out.append({"dim": r["dim"], "n": r["world_size"],
                    "shape": "x".join(str(n) for n in r["shape"]),
                    "params_mb": r["params_max"] / 1e6,
                    "params_ratio": r["params_max"] / base["params_max"],
                    "saved_mb": r["saved_max"] / 1e6,
                    "saved_ratio": r["saved_max"] / base["saved_max"]})
    return [{"dim": "none", "n": 1, "shape": "1x1x1", "params_mb": base["params_max"] / 1e6,
             "params_ratio": 1.0, "saved_mb": base["saved_max"] / 1e6, "saved_ratio": 1.0},
            *out]


COLUMNS = [("dim", "split"), ("n", "n"), ("shape", "dp x pp x tp"),
           ("params_mb", "params MB (largest rank)"), ("params_ratio", "of one process"),
           ("saved_mb", "saved MB (largest rank)"), ("saved_ratio", "of one process")]
FORMATS = {"params_mb": ".2f", "params_ratio": ".3f", "saved_mb": ".2f", "saved_ratio": ".3f"}


def table(rows):
    """The summary as text."""
    from ..bench import format_table
    return format_table(summary(rows), COLUMNS, FORMATS)


if __name__ == "__main__":
    main()
