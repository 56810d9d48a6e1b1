"""RIGHT (notebook 08, compression_rank): the matrix view from torch.Size: m = shape.numel() // n
(a tuple is turned into a torch.Size first; shape[1:].numel() when n is 0); len(shape) <= 1 as
the test for scalars and biases; the saving test as an early return of 0.

Based on the solution with this one change; the checker must accept it.
"""
import torch
import torch.distributed as dist


# ---------------------------------------------------------------- stage 1: orthogonalize
def orthogonalize(P, eps=1e-8):
    """Make the columns of ``P`` orthonormal (Gram-Schmidt); return the result.

    Args:
        P: float tensor of shape (n, r) with n >= r.
        eps: added to each column's norm before dividing by it (a zero column stays zero
            instead of becoming NaN).
    Returns:
        A tensor of P's shape and dtype (it may be ``P`` itself, changed in place) whose
        columns are orthonormal, column j built from P's columns 0..j only: column j minus
        its projections on the (already orthonormal) columns 0..j-1, divided by its norm
        (+ eps). In matrix terms P = result @ R with R upper-triangular (a QR
        decomposition; ``torch.linalg.qr(P).Q`` is also accepted).
    """
    # TODO: for each column j: subtract its projections on columns 0..j-1, then normalise.
    for j in range(P.shape[1]):
        col = P[:, j:j + 1]
        col /= torch.linalg.vector_norm(col) + eps
        if j + 1 < P.shape[1]:              # remove this direction from the later columns
            rest = P[:, j + 1:]
            rest -= col @ (col.T @ rest)
    return P


# ---------------------------------------------------------------- stage 2: what to compress
def compression_rank(shape, rank, min_compression_rate=1.0):
    """The rank at which a gradient of ``shape`` is sent; 0: sent uncompressed.

    Args:
        shape: the gradient's shape (a tuple or ``torch.Size``).
        rank: the rank r asked for.
        min_compression_rate: compress only if it divides the numbers sent by more than this.
    Returns:
        int: 0 for tensors with fewer than 2 dimensions (biases: always uncompressed,
        whatever the rate). Otherwise, with the tensor viewed as a matrix (n, m), n =
        shape[0], m = the product of the other dimensions, and r' = min(n, m, rank):
        r' if (n + m) * r' * min_compression_rate < n * m (compressing saves enough),
        else 0.
    """
    # TODO: 1-D -> 0; the matrix view (n, m); r' = min(n, m, rank); the saving test.
    shape = torch.Size(shape)
    if len(shape) <= 1:                     # scalars and biases: always uncompressed
        return 0
    n = shape[0]
    m = shape.numel() // n if n else shape[1:].numel()   # n = 0: no elements
    r = min(n, m, rank)
    if (n + m) * r * min_compression_rate >= n * m:
        return 0                            # compressing would not save enough
    return r


# ---------------------------------------------------------------- stage 3: PowerSGD
class PowerSGD:
    """Averages the gradients of ``params`` over all ranks with PowerSGD compression.

    Args:
        params: the parameters (an iterable); those with ``requires_grad=False`` are ignored.
        rank: the rank r of the approximations.
        min_compression_rate: see :func:`compression_rank`.
        warm_start: keep each tensor's Q from one step to the next (else a fresh random Q
            every step).
        seed: seed of the random Qs: the same on every rank, so the ranks start from the
            same Q.

    Attributes:
        params: the list of parameters (their index in it identifies their state).
        errors: ``{index: error matrix (n, m)}`` (error feedback) of the compressed tensors.
        qs: ``{index: Q (m, r')}`` of the compressed tensors (warm start).
        bytes_sent: bytes this rank passed to ``all_reduce`` during the last ``reduce()``
            (elements times element size, all calls together).
        total_bytes: the same, summed over every ``reduce()`` so far.
    """

    def __init__(self, params, rank=1, min_compression_rate=1.0, warm_start=True, seed=0):
        self.params = [p for p in params if p.requires_grad]
        self.rank, self.min_compression_rate = rank, min_compression_rate
        self.warm_start = warm_start
        self.generator = torch.Generator().manual_seed(seed)
        self.errors, self.qs = {}, {}
        self.bytes_sent, self.total_bytes = 0, 0

    def new_q(self, m, r):
        """A fresh random Q of shape (m, r), standard normal, float32: the same on every rank
        as long as every rank draws in the same order (parameter order)."""
        return torch.randn(m, r, generator=self.generator)

    def reduce(self):
        """Replace every ``p.grad`` (``p`` in ``self.params``, ``p.grad`` not None) by its
        average over the ranks, compressed by PowerSGD; update ``bytes_sent`` and
        ``total_bytes``.

        Per parameter (index i in ``self.params``, in that order), r' = compression_rank(
        grad.shape, self.rank, self.min_compression_rate):

        * r' == 0: sent uncompressed. All of these go in ONE flat buffer: ONE all_reduce
          (sum), divide by the world size, copy back into each ``p.grad``.
        * r' > 0: M = grad viewed as (n, m), plus ``self.errors[i]`` if there is one. Q is
          ``self.qs[i]``, or ``self.new_q(m, r')`` if there is none yet or if
          ``warm_start`` is False (draw them in parameter order). Then P = M Q; all_reduce
          the P's (sum; they may share one flat buffer); P = orthogonalize(P); Q = M^T P;
          all_reduce the Q's and divide them by the world size; approx = P Q^T;
          ``self.errors[i] = M - approx``; ``self.qs[i] = Q``; ``p.grad`` <- approx (its
          own shape).

        Every rank runs this code on gradients of the same shapes, so all ranks make the same
        all_reduce calls in the same order (whether the uncompressed buffer goes before or
        after the P's and Q's is yours to choose).
        """
        # TODO: split by compression_rank; one flat all_reduce of the uncompressed ones;
        #       then P = M Q, all_reduce, orthogonalize, Q = M^T P, all_reduce / world,
        #       approx = P Q^T, error = M - approx; count the bytes you all_reduce.
        world = dist.get_world_size()
        sent = 0
        plain, compressed = [], []
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            r = compression_rank(p.grad.shape, self.rank, self.min_compression_rate)
            (compressed if r else plain).append((i, p, r))

        if plain:
            flat = torch.cat([p.grad.reshape(-1) for _, p, _ in plain])
            dist.all_reduce(flat)
            sent += flat.numel() * flat.element_size()
            flat /= world
            offset = 0
            for _, p, _ in plain:
                n = p.grad.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n

        if compressed:
            ms, ps = [], []
            for i, p, r in compressed:
                m = p.grad.reshape(p.grad.shape[0], -1)
                m = m + self.errors[i] if i in self.errors else m.clone()
                if not self.warm_start or i not in self.qs:
                    self.qs[i] = self.new_q(m.shape[1], r).to(m.dtype)
                ms.append(m)
                ps.append(m @ self.qs[i])
            flat_p = torch.cat([p.reshape(-1) for p in ps])
            dist.all_reduce(flat_p)
            sent += flat_p.numel() * flat_p.element_size()
            ps = [orthogonalize(p) for p in _split(flat_p, [p.shape for p in ps])]
            flat_q = torch.cat([(m.T @ p).reshape(-1) for m, p in zip(ms, ps)])
            dist.all_reduce(flat_q)
            sent += flat_q.numel() * flat_q.element_size()
            flat_q /= world
            qs = _split(flat_q, [(m.shape[1], p.shape[1]) for m, p in zip(ms, ps)])
            for (i, param, _), m, p, q in zip(compressed, ms, ps, qs):
                approx = p @ q.T
                self.errors[i] = m - approx
                self.qs[i] = q
                param.grad.copy_(approx.view_as(param.grad))

        self.bytes_sent = sent
        self.total_bytes += sent


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
