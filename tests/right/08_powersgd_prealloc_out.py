"""RIGHT (notebook 08, powersgd): preallocated flat buffers. Every P is computed with
``torch.matmul(..., out=)`` straight into its slice of one preallocated P buffer (and every
Q into its slice of one Q buffer), so the buffers are all-reduced without any torch.cat;
the summed P is NOT divided by the world size (the docstring says dividing is optional);
the uncompressed gradients are packed into a preallocated buffer with ``narrow``/``copy_``
and sent after the Q's; M is built with ``torch.flatten(g, 1)``; the state (M, Q, slices)
lives in a list of small records.

orthogonalize is Gram-Schmidt on the transposed matrix (rows instead of columns, written
back through a transpose); compression_rank compares in integers when the rate is integral.

Written from the release notebook alone; the checker must accept it.
"""
import torch
import torch.distributed as dist


def orthogonalize(P, eps=1e-8):
    """Make the columns of ``P`` orthonormal (Gram-Schmidt); return the result."""
    rows = P.t().clone()                      # (r, n): one row per column of P
    for j in range(rows.shape[0]):
        row = rows[j]
        for k in range(j):
            row -= torch.dot(rows[k], row) * rows[k]
        row /= torch.sqrt(torch.sum(row * row)) + eps
    P.copy_(rows.t())
    return P


def compression_rank(shape, rank, min_compression_rate=1.0):
    """The rank at which a gradient of ``shape`` is sent; 0: sent uncompressed."""
    size = torch.Size(shape)
    if len(size) < 2:
        return 0
    n = size[0]
    m = size[1:].numel()
    r = min(n, m, rank)
    rate = min_compression_rate
    if float(rate).is_integer():
        rate = int(rate)
    return int(r) if (n + m) * r * rate < n * m else 0


class PowerSGD:
    """Averages the gradients of ``params`` over all ranks with PowerSGD compression."""

    def __init__(self, params, rank=1, min_compression_rate=1.0, warm_start=True, seed=0):
        self.params = [p for p in params if p.requires_grad]
        self.rank, self.min_compression_rate = rank, min_compression_rate
        self.warm_start = warm_start
        self.generator = torch.Generator().manual_seed(seed)
        self.errors, self.qs = {}, {}
        self.bytes_sent, self.total_bytes = 0, 0

    def new_q(self, m, r):
        return torch.randn(m, r, generator=self.generator)

    def _send(self, buf):
        self.bytes_sent += buf.numel() * buf.element_size()
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)

    def reduce(self):
        self.bytes_sent = 0
        world = dist.get_world_size()
        grads = [(i, p.grad) for i, p in enumerate(self.params) if p.grad is not None]
        if not grads:
            return
        dtype = grads[0][1].dtype
        for _, g in grads[1:]:
            dtype = torch.promote_types(dtype, g.dtype)
        device = grads[0][1].device

        records, plain = [], []
        p_len = q_len = 0
        for i, g in grads:
            r = compression_rank(g.shape, self.rank, self.min_compression_rate)
            if r == 0:
                plain.append((i, g))
                continue
            M = torch.flatten(g, 1).to(dtype=g.dtype, copy=True)
            if i in self.errors:
                M.add_(self.errors[i])
            n, m = M.shape
            if self.warm_start and i in self.qs:
                Q = self.qs[i]
            else:
                Q = self.new_q(m, r).to(device=M.device, dtype=M.dtype)
            records.append({"i": i, "g": g, "M": M, "Q": Q, "n": n, "m": m, "r": r,
                            "p_at": p_len, "q_at": q_len})
            p_len += n * r
            q_len += m * r

        if records:
            pdt = records[0]["M"].dtype
            p_buf = torch.empty(p_len, dtype=pdt, device=records[0]["M"].device)
            for rec in records:
                view = p_buf[rec["p_at"]:rec["p_at"] + rec["n"] * rec["r"]].view(rec["n"], rec["r"])
                torch.matmul(rec["M"], rec["Q"], out=view)
            self._send(p_buf)
            q_buf = torch.empty(q_len, dtype=pdt, device=p_buf.device)
            for rec in records:
                P = p_buf[rec["p_at"]:rec["p_at"] + rec["n"] * rec["r"]].view(rec["n"], rec["r"])
                rec["P"] = orthogonalize(P.clone())
                view = q_buf[rec["q_at"]:rec["q_at"] + rec["m"] * rec["r"]].view(rec["m"], rec["r"])
                torch.matmul(rec["M"].t(), rec["P"], out=view)
            self._send(q_buf)
            q_buf.div_(world)
            for rec in records:
                Q = q_buf[rec["q_at"]:rec["q_at"] + rec["m"] * rec["r"]].view(rec["m"], rec["r"]).clone()
                approx = rec["P"] @ Q.t()
                self.errors[rec["i"]] = rec["M"] - approx
                self.qs[rec["i"]] = Q
                rec["g"].copy_(approx.view(rec["g"].shape))

        if plain:
            total = sum(g.numel() for _, g in plain)
            buf = torch.empty(total, dtype=dtype, device=device)
            at = 0
            for _, g in plain:
                buf.narrow(0, at, g.numel()).copy_(g.reshape(-1))
                at += g.numel()
            self._send(buf)
            buf.div_(world)
            at = 0
            for _, g in plain:
                g.copy_(buf.narrow(0, at, g.numel()).view(g.shape))
                at += g.numel()

        self.total_bytes += self.bytes_sent


def _split(flat, shapes):
    """Cut a flat tensor into consecutive (cloned) pieces of the given shapes."""
    out, offset = [], 0
    for shape in shapes:
        n = 1
        for d in shape:
            n *= d
        out.append(flat[offset:offset + n].view(*shape).clone())
        offset += n
    return out
