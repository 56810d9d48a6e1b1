"""RIGHT (notebook 08, compression_rank): the matrix view built by an explicit loop over the
dimensions with early returns (no numel/prod helpers); the shape is read by ``len`` and
indexing only, so a tuple and a torch.Size go the same way.

orthogonalize here is classical Gram-Schmidt, out of place, with the projections on the
earlier columns computed as one matrix-vector product; PowerSGD all-reduces each P and each Q
on its own (per tensor, in parameter order) and the uncompressed flat buffer last.

Written from the release notebook alone; the checker must accept it.
"""
import torch
import torch.distributed as dist


def orthogonalize(P, eps=1e-8):
    """Make the columns of ``P`` orthonormal (Gram-Schmidt); return the result."""
    out = torch.empty_like(P)
    for j in range(P.shape[1]):
        v = P[:, j]
        if j:
            basis = out[:, :j]
            v = v - basis @ (basis.transpose(0, 1) @ v)
        out[:, j] = v / (v.norm() + eps)
    return out


def compression_rank(shape, rank, min_compression_rate=1.0):
    """The rank at which a gradient of ``shape`` is sent; 0: sent uncompressed."""
    ndim = len(shape)
    if ndim < 2:
        return 0
    n = int(shape[0])
    m = 1
    k = 1
    while k < ndim:
        m *= int(shape[k])
        k += 1
    r = rank
    if n < r:
        r = n
    if m < r:
        r = m
    r = int(r)
    sent = (n + m) * r * min_compression_rate
    full = n * m
    if sent < full:
        return r
    return 0


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

    def _allreduce(self, t):
        dist.all_reduce(t)
        self.bytes_sent += t.element_size() * t.numel()

    def reduce(self):
        self.bytes_sent = 0
        world = dist.get_world_size()
        whole = []
        work = []
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            r = compression_rank(p.grad.shape, self.rank, self.min_compression_rate)
            if r == 0:
                whole.append(p)
                continue
            M = p.grad.reshape(p.grad.shape[0], -1)
            M = M + self.errors[i] if i in self.errors else M.clone()
            if self.warm_start and i in self.qs:
                Q = self.qs[i]
            else:
                Q = self.new_q(M.shape[1], r).to(M)
            work.append((i, p, M, Q))

        for i, p, M, Q in work:
            P = M @ Q
            self._allreduce(P)
            P = orthogonalize(P)
            Q = M.t() @ P
            self._allreduce(Q)
            Q /= world
            approx = P @ Q.t()
            self.errors[i] = M - approx
            self.qs[i] = Q
            p.grad.copy_(approx.reshape(p.grad.shape))

        if whole:
            flat = torch.cat([p.grad.reshape(-1) for p in whole])
            self._allreduce(flat)
            flat /= world
            # (not _split: its view(*shape) fails on a 0-d gradient's empty shape)
            pieces = flat.split([p.grad.numel() for p in whole])
            for p, piece in zip(whole, pieces):
                p.grad.copy_(piece.reshape(p.grad.shape))

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
