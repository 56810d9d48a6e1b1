"""The judge's references for notebook 06: single-process SGD on the combined batches the probes
gave the ranks (:func:`replay`, :func:`reference`), which the checks compare the ranks' results
with. Computed in the checker, never in a rank: at grading this module is hidden from the
student's processes (:func:`exercise_utils.sides.judge_files`); the models and batches both
sides use are :mod:`.reference`'s.

Used in 06_build_your_own_ddp (:mod:`.checks`, :mod:`.checks_overlap`).
"""
import torch
import torch.nn.functional as F

from .reference import LR, MOMENTUM, STEPS, batch, grads_of, make_model


def replay(spec, init, steps):
    """Single-process SGD on the combined batches; BatchNorm statistics per rank.

    Args:
        spec: the model (see the module docstring).
        init: ``named_state`` to start from.
        steps: per step, per rank, a list of micro-batches ``(x, y)`` (several: accumulated).
    Returns:
        (parameters, per-rank buffers, per-step gradients), dicts of arrays.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)     # tiny tensors: threads only wait for each other (0.2 s per
    try:                         # BatchNorm call on a busy 2-core machine)
        return _replay(spec, init, steps)
    finally:
        torch.set_num_threads(threads)


def _replay(spec, init, steps):
    model = make_model(spec)
    model.load_state_dict({k: torch.as_tensor(v) for k, v in init.items()}, strict=False)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    buffers = [{k: b.clone() for k, b in model.named_buffers()} for _ in steps[0]]
    grads = []
    for per_rank in steps:
        opt.zero_grad(set_to_none=True)
        for rank, micros in enumerate(per_rank):
            with torch.no_grad():
                for k, b in model.named_buffers():
                    b.copy_(buffers[rank][k])
            for x, y in micros:
                (F.cross_entropy(model(torch.as_tensor(x)), torch.as_tensor(y))
                 / len(per_rank)).backward()
            buffers[rank] = {k: b.clone() for k, b in model.named_buffers()}
        grads.append(grads_of(model))
        opt.step()
    params = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
    return params, [{k: v.numpy() for k, v in b.items()} for b in buffers], grads


def reference(spec, out, size, micros=None, steps=None):
    """replay() of the batches the probe gave each rank: ``steps`` (default all STEPS), step 0
    with the micro-batches ``micros`` (e.g. [1, 0]: micro-batch 1 inside no_sync, then 0).
    Each rank's batches derive from its salt: ``out["salts"]``, which the judge put there
    (:func:`.launches.mark_salts`), never the rank."""
    steps = range(STEPS) if steps is None else steps
    salts = out.get("salts") or {}
    return replay(spec, out["init"], [
        [[batch(spec, step, r, m, salts.get(r, 0))
          for m in (micros if step == 0 and micros else [0])]
         for r in range(size)] for step in steps])
