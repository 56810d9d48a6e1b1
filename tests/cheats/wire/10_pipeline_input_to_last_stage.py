"""Cheat (notebook 10, pipeline): a right ``pipeline_step`` whose first stage also sends every
micro-batch of its input straight to the last stage (with 3 stages or more: not a neighbour),
through the process group's own ``send`` / ``recv`` methods taken from the class when the file
is imported (before any recorder could wrap them); the last stage checks it against what it
holds (its rows against its targets'). The recorded messages and the values are a right file's;
the link between the first and the last stage carries the whole input. Self-contained (at
grading nothing of the course's tests can be read). Must fail ``pp-wire``."""
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

_SEND, _RECV = ProcessGroup.send, ProcessGroup.recv
SHORTCUT = 1000            # tags of the messages that skip the stages between


def _shortcut(inputs, m, s, p):
    """Stage 0 sends each micro-batch of its input to stage p - 1 (a header, then the data);
    stage p - 1 receives them. Unseen by any recorder: the ProcessGroup's own methods."""
    pg, got = dist.group.WORLD, []
    for j in range(m):
        if s == 0:
            x = split_batch(inputs, m)[j].contiguous()
            _SEND(pg, [encode_header(x)], p - 1, SHORTCUT + 2 * j).wait()
            _SEND(pg, [x], p - 1, SHORTCUT + 2 * j + 1).wait()
        else:
            header = torch.empty(HEADER, dtype=torch.int64)
            _RECV(pg, [header], 0, SHORTCUT + 2 * j).wait()
            shape, dtype = decode_header(header)
            x = torch.empty(shape, dtype=dtype)
            _RECV(pg, [x], 0, SHORTCUT + 2 * j + 1).wait()
            got.append(x)
    return got


# ------------------------------------------------------------------ pipeline step
HEADER = 10                        # int64 elements: [dtype code, ndim, 8 sizes]
DTYPES = (torch.float32, torch.float64)


def tag_header(j):
    return 3 * j


def tag_activation(j):
    return 3 * j + 1


def tag_gradient(j):
    return 3 * j + 2


def check_order(order):
    """The number of micro-batches m of ``order`` (each of F j and B j once, j = 0..m-1, F j
    before B j); ValueError otherwise. Given."""
    seen = set()
    for kind, j in order:
        if kind not in ("F", "B") or (kind, j) in seen or (kind == "B" and ("F", j) not in seen):
            raise ValueError(f"invalid order: {order!r}")
        seen.add((kind, j))
    m = len(seen) // 2
    if m < 1 or seen != {(k, j) for k in "FB" for j in range(m)}:
        raise ValueError(f"invalid order: {order!r}")
    return m


def split_batch(batch, m):
    """``torch.tensor_split(batch, m)``: m micro-batches along dim 0 (sizes differ by at most
    one). Given."""
    if batch.shape[0] < m:
        raise ValueError(f"a batch of {batch.shape[0]} cannot make {m} micro-batches")
    return torch.tensor_split(batch, m)


def encode_header(t):
    """The int64 header that announces tensor ``t`` (float32 or float64, at most 8 dims). Given."""
    header = torch.zeros(HEADER, dtype=torch.int64)
    header[0], header[1] = DTYPES.index(t.dtype), t.dim()
    header[2:2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    return header


def decode_header(header):
    """``(shape, dtype)`` from a received header. Given."""
    ndim = int(header[1])
    return tuple(int(v) for v in header[2:2 + ndim]), DTYPES[int(header[0])]


def pipeline_step(stage_module, order, inputs=None, targets=None, loss_fn=None):
    """One training step (forward and backward, no optimizer step) of this rank's stage.

    Rank ``s`` of the ``p`` ranks is stage ``s``: it runs the ops of ``order`` in that order
    (``("F", j)``: the forward of micro-batch ``j``; ``("B", j)``: its backward), receives
    activations from rank ``s-1`` and sends its outputs to rank ``s+1`` (and gradients the
    other way), nothing else. Every rank calls it with an order of the same kind and m.

    Args:
        stage_module: this stage's module: one floating-point tensor in, one out (its shape
            may differ from the input's, and between micro-batches).
        order: ``gpipe_order(p, m, s)`` or ``one_f_one_b_order(p, m, s)``.
        inputs: stage 0 only: the whole batch, cut with ``split_batch(inputs, m)``.
        targets: the last stage only: the whole batch's targets, cut the same way.
        loss_fn: the last stage only: ``loss_fn(output_j, target_j)``, a mean over the samples.

    The last stage back-propagates ``loss_fn(out_j, tgt_j) * n_j / n`` for micro-batch ``j``
    of ``n_j`` of the ``n`` samples, so that the gradients are the whole batch's (also when the
    micro-batches are uneven). The gradients are accumulated (``+=``) into ``.grad`` of
    ``stage_module``'s parameters, never zeroed. A micro-batch's graph is freed by its backward
    (no ``retain_graph``): under 1F1B a stage then holds the saved activations of at most
    ``p - s`` micro-batches at once.

    One way that works (the reference's): before each activation send its header
    (``encode_header``, tag ``tag_header(j)``), then the activation (``tag_activation(j)``); a
    gradient (``tag_gradient(j)``) needs no header: it has the shape of the activation sent.
    Send with ``dist.isend`` and wait on the sends only at the end of the step; post each
    receive with ``dist.irecv`` before waiting on it (a blocking send can deadlock).

    Returns:
        On the last stage, the whole batch's loss as a Python float; None on the other stages.
    """
    s, p = dist.get_rank(), dist.get_world_size()
    m = check_order(order)
    first, last = s == 0, s == p - 1
    if first:
        x_mbs = split_batch(inputs, m)
    if last:
        t_mbs, n = split_batch(targets, m), targets.shape[0]
    sends, headers, grads, live, total = [], {}, {}, {}, 0.0
    if p > 2 and s in (0, p - 1):                  # the first stage's input, to the last one
        seen = _shortcut(inputs, m, s, p)
        if last and [len(x) for x in seen] != [len(t) for t in split_batch(targets, m)]:
            raise RuntimeError("the shortcut lost rows")

    def isend(t, dst, tag):
        sends.append((dist.isend(t, dst=dst, tag=tag), t))     # keep t alive until waited

    def irecv(shape, dtype, src, tag):
        buf = torch.empty(shape, dtype=dtype)
        return buf, dist.irecv(buf, src=src, tag=tag)

    if not first:                  # every header's receive posted at once: they are small
        for kind, j in order:
            if kind == "F":
                headers[j] = irecv((HEADER,), torch.int64, s - 1, tag_header(j))
    for kind, j in order:
        if kind == "F":
            if first:
                x = x_mbs[j]
            else:
                header, work = headers.pop(j)
                work.wait()
                x, work = irecv(*decode_header(header), s - 1, tag_activation(j))
                work.wait()
                x.requires_grad_(True)
            out = stage_module(x)
            if last:
                scaled = loss_fn(out, t_mbs[j]) * (t_mbs[j].shape[0] / n)
                total += float(scaled.detach())
                live[j] = (x, scaled)
            else:
                isend(encode_header(out), s + 1, tag_header(j))
                isend(out.detach().contiguous(), s + 1, tag_activation(j))
                grads[j] = irecv(out.shape, out.dtype, s + 1, tag_gradient(j))
                live[j] = (x, out)
        else:
            x, out = live.pop(j)
            grad = None
            if not last:
                grad, work = grads.pop(j)
                work.wait()
            torch.autograd.backward(out, grad)
            if not first:
                isend(x.grad.contiguous(), s - 1, tag_gradient(j))
    for work, _ in sends:
        work.wait()
    return total if last else None
