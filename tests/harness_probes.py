"""Probes for tests/test_harness.py (imported by worker processes through PYTHONPATH)."""
import torch
import torch.distributed as dist


def probe_gloo_sum(student, ctx):
    """Call the student's ``reduce(t)`` on a tensor holding the rank; return the result."""
    t = torch.tensor([float(ctx.rank + 1)])
    student.reduce(t)
    return float(t.item())


def probe_value(student, ctx):
    return student.value(ctx.rank)


def probe_world(student, ctx):
    return (ctx.rank, ctx.size, dist.is_initialized() if ctx.backend == "gloo" else None)


def probe_dynamo_loaded(student, ctx):
    """Whether ``torch._dynamo`` (imported by the first optimizer) is loaded when the probe starts."""
    import sys
    return "torch._dynamo" in sys.modules
