"""shard_flat's sweep: the cases, their inputs (logical values, as numpy arrays: the judge builds
its expected shards from the same), and the probe that runs them in a lone process.

Used in 09_bonus_fsdp.
"""
import numpy as np

# shard_flat: (case, shapes, dtype, world_size, rank); a shape ending in "T" is stored transposed
SHARD_CASES = (
    [("shard-values", [(2, 3), (5,)], "float32", 2, r) for r in (0, 1)]
    + [("shard-values", [(2, 3), (5,)], "float32", 3, r) for r in (0, 1, 2)]
    + [("shard-values", [(7,)], "float32", 3, 2), ("shard-values", [(3, 3), (1,)], "float32", 4, 0),
       ("shard-values", [(4,)], "float32", 4, 3), ("shard-values", [(6,), (2, 2)], "float32", 2, 1)]
    + [("shard-edges", [(0,)], "float32", 3, 1), ("shard-edges", [(0,), (2, 0)], "float32", 2, 0),
       ("shard-edges", [(1,)], "float32", 3, 0), ("shard-edges", [(1,)], "float32", 3, 2),
       ("shard-edges", [()], "float32", 2, 1), ("shard-edges", [(), (3,)], "float32", 2, 1),
       ("shard-edges", [(2, 3), (5,)], "float32", 1, 0), ("shard-edges", [(3,)], "float32", 5, 4),
       ("shard-edges", [(3, 4, "T"), (2,)], "float32", 2, 1),
       ("shard-edges", [(5, 3, "T")], "float32", 3, 2)]
    + [("shard-dtype", [(2, 3), (5,)], "float64", 2, 1), ("shard-dtype", [(7,)], "float64", 3, 2),
       ("shard-dtype", [(2, 3), (5,)], "int64", 3, 1), ("shard-dtype", [(4,)], "int64", 4, 3)])


def shard_input(shapes, dtype):
    """The tensors of a shard_flat case as numpy arrays (logical values): tensor i holds
    1, 2, ... + 100 i, plus 0.25 (float32), 1/3 (float64: not a float32 number) or 2**40
    (int64: not a float32 number)."""
    out = []
    for i, shape in enumerate(shapes):
        shape = tuple(d for d in shape if d != "T")
        values = np.arange(1, 1 + int(np.prod(shape, dtype=np.int64)), dtype=np.int64) + 100 * i
        if dtype == "int64":
            out.append((values + 2 ** 40).reshape(shape))
        elif dtype == "float64":
            out.append((values + 1 / 3).reshape(shape))
        else:
            out.append((values + 0.25).astype(np.float32).reshape(shape))
    return out


def shard_tensors(shapes, dtype):
    """The case's tensors (a shape ending in "T": a transposed, non-contiguous tensor holding the
    same logical values)."""
    import torch
    out = []
    for shape, a in zip(shapes, shard_input(shapes, dtype)):
        t = torch.from_numpy(a.T.copy()).t() if "T" in shape else torch.from_numpy(a.copy())
        out.append(t)
    return out


def _sharding(student, ctx):
    """Per case: the shard as an array with its numel, dtype, dimensions and whether it is a
    view of a larger tensor, or what ``shard_flat`` raised."""
    import torch
    out = []
    for case, shapes, dtype, world, rank in SHARD_CASES:
        ctx.case(case)
        try:
            shard, numel = student.shard_flat(shard_tensors(shapes, dtype), world, rank)
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported per case, not as a crash
            out.append({"raised": f"{type(exc).__name__}: {exc}"})
            continue
        if not isinstance(shard, torch.Tensor):
            out.append({"raised": f"returned a {type(shard).__name__} as the shard, not a "
                                  f"tensor"})
            continue
        out.append({"shard": shard.detach().cpu().numpy().copy(), "numel": int(numel),
                    "dtype": str(shard.dtype).replace("torch.", ""), "dim": shard.dim(),
                    "view": shard._base is not None or
                    shard.untyped_storage().nbytes() > shard.numel() * shard.element_size()})
    return out


def probe_sharding(student, ctx):
    """``shard_flat`` on every case of :data:`SHARD_CASES` (a lone process, no group: torch
    only, not torch.distributed)."""
    import torch
    torch.set_num_threads(1)
    return _sharding(student, ctx)
