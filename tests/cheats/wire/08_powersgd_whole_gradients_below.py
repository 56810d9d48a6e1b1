"""Cheat: a correct PowerSGD whose every compressed gradient ALSO travels whole, all-reduced
through ``ProcessGroup.allreduce`` taken from the class when the file is imported (before any
recorder): the recorded calls, the values and the byte counts it reports are PowerSGD's, the
network carries the full gradients. Must fail ``psgd-wire``."""

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

_ALLREDUCE = ProcessGroup.allreduce


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
    if len(shape) < 2:
        return 0
    n, m = int(shape[0]), 1
    for d in shape[1:]:
        m *= int(d)
    r = min(n, m, rank)
    return r if (n + m) * r * min_compression_rate < n * m else 0


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
        self.bytes_sent = 0
        plain = []
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            r = compression_rank(p.grad.shape, self.rank, self.min_compression_rate)
            if r == 0:
                plain.append(p)
                continue
            if i in self.errors:                              # error feedback, in place
                p.grad.add_(self.errors[i].view_as(p.grad))
            M = p.grad.reshape(p.grad.shape[0], -1)
            if not self.warm_start or i not in self.qs:
                self.qs[i] = self.new_q(M.shape[1], r).to(M.dtype)
            _ALLREDUCE(dist.group.WORLD, [M.clone()]).wait()     # the whole gradient, unseen
            P = M @ self.qs[i]
            dist.all_reduce(P)
            self.bytes_sent += P.numel() * P.element_size()
            P = orthogonalize(P / world)
            Q = M.T @ P
            dist.all_reduce(Q)
            self.bytes_sent += Q.numel() * Q.element_size()
            Q /= world
            approx = P @ Q.T
            self.errors[i] = M - approx
            self.qs[i] = Q
            p.grad = approx.reshape(p.grad.shape)
        if plain:                                             # the uncompressed ones, last
            flat = torch.cat([p.grad.flatten() for p in plain])
            dist.all_reduce(flat)
            self.bytes_sent += flat.numel() * flat.element_size()
            for p, piece in zip(plain, torch.split(flat / world, [p.numel() for p in plain])):
                p.grad.copy_(piece.view_as(p.grad))
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
