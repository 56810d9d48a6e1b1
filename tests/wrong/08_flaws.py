"""Known-wrong files of notebook 08, as patches of the solution (see tests/flaws.py)."""
from flaws import Def, Flaw  # noqa: F401

FLAWS = [
    Flaw('compression_rank', 'ignores_rate', clause='otherwise-tensor-viewed', case='?',
         why=('compression_rank ignores '
              "min_compression_rate: it compresses whenever (n + m) * r' < n * m."),
         patch=(
             ("""    return r if (n + m) * r * min_compression_rate < n * m else 0
""",
              """    return r if (n + m) * r < n * m else 0
"""),
             ('        total_bytes: the same, summed over every ``reduce()`` so far.\n    """\n',
              '        total_bytes: the same, summed over every ``reduce()`` so far.\n        steps: how many times ``reduce()`` ran.\n    """\n'),
             ("""        self.bytes_sent, self.total_bytes = 0, 0
""",
              """        self.bytes_sent, self.total_bytes, self.steps = 0, 0, 0
"""),
             ("""        average over the ranks, compressed by PowerSGD; update ``bytes_sent`` and
        ``total_bytes``.
""",
              """        average over the ranks, compressed by PowerSGD; update ``bytes_sent``.
"""),
             ("""        Every rank runs this code on gradients of the same shapes, so all ranks make the same
        all_reduce calls in the same order (whether the uncompressed buffer goes before or
        after the P's and Q's is yours to choose).
""",
              """        Every rank makes the same all_reduce calls in the same order: the uncompressed
        buffer (if any), then the P's, then the Q's (if any tensor is compressed).
"""),
             ("""        self.total_bytes += sent

""",
              """        self.total_bytes += sent
        self.steps += 1

"""),
         )),
    Flaw('compression_rank', 'scalar', clause='int-0-tensors', case='?',
         why=('compression_rank returns 0 only for 1-D '
              'shapes (len(shape) == 1): a 0-d parameter (a learnable scalar such as a temperature) '
              'then reaches shape[0] and raises IndexError.'),
         patch=(
             ("""    if len(shape) < 2:
""",
              """    if len(shape) == 1:                 # biases
"""),
         )),
    Flaw('compression_rank', 'ties_compressed', clause='otherwise-tensor-viewed', case='?',
         why=('compression_rank compresses when '
              "(n + m) * r' * min_compression_rate <= n * m: at a tie compressing saves nothing (e.g. a"
              ' 4 x 4 matrix at rank 2 sends 16 numbers either way) but still costs two all_reduces and'
              ' an approximation error.'),
         patch=(
             ("""    return r if (n + m) * r * min_compression_rate < n * m else 0
""",
              """    return r if (n + m) * r * min_compression_rate <= n * m else 0
"""),
         )),
    Flaw('orthogonalize', 'no_eps', clause='eps-added-column', case='?',
         why=('orthogonalize divides each column by its bare'
              ' norm, without the eps guard: fine on random matrices, but a zero column (a zero '
              'gradient makes P = M Q zero) becomes 0 / 0 = NaN, and the NaN spreads to the later '
              'columns and into the model.'),
         patch=(
             ("""        col /= torch.linalg.vector_norm(col) + eps
""",
              """        col /= torch.linalg.vector_norm(col)
"""),
         )),
    Flaw('orthogonalize', 'not_normalized', clause='tensor-p-s', case='?',
         why=('orthogonalize subtracts the '
              'projections on the earlier columns but never divides the columns by their norms (and so '
              'projects with unnormalised columns).'),
         patch=(
             ("""        col /= torch.linalg.vector_norm(col) + eps
""",
              ''),
             ('        total_bytes: the same, summed over every ``reduce()`` so far.\n    """\n',
              '        total_bytes: the same, summed over every ``reduce()`` so far.\n        steps: how many times ``reduce()`` ran.\n    """\n'),
             ("""        self.bytes_sent, self.total_bytes = 0, 0
""",
              """        self.bytes_sent, self.total_bytes, self.steps = 0, 0, 0
"""),
             ("""        average over the ranks, compressed by PowerSGD; update ``bytes_sent`` and
        ``total_bytes``.
""",
              """        average over the ranks, compressed by PowerSGD; update ``bytes_sent``.
"""),
             ("""        Every rank runs this code on gradients of the same shapes, so all ranks make the same
        all_reduce calls in the same order (whether the uncompressed buffer goes before or
        after the P's and Q's is yours to choose).
""",
              """        Every rank makes the same all_reduce calls in the same order: the uncompressed
        buffer (if any), then the P's, then the Q's (if any tensor is compressed).
"""),
             ("""        self.total_bytes += sent

""",
              """        self.total_bytes += sent
        self.steps += 1

"""),
         )),
    Flaw('orthogonalize', 'svd', clause='tensor-p-s', case='?',
         why=('orthogonalize returns the left singular vectors '
              'of P (torch.linalg.svd): orthonormal columns spanning the same space, but column j mixes'
              " all of P's columns instead of being built from columns 0..j (no Gram-Schmidt, no QR)."),
         patch=(
             ("""    for j in range(P.shape[1]):
        col = P[:, j:j + 1]
        col /= torch.linalg.vector_norm(col) + eps
        if j + 1 < P.shape[1]:              # remove this direction from the later columns
            rest = P[:, j + 1:]
            rest -= col @ (col.T @ rest)
    return P
""",
              """    U, _, _ = torch.linalg.svd(P, full_matrices=False)    # an orthonormal basis of span(P)
    return U
"""),
         )),
    Flaw('powersgd', 'bytes_in_elements', clause='bytes-sent-bytes', case='?',
         why=('PowerSGD.reduce counts elements, not '
              'bytes, in bytes_sent (numel() without element_size()).'),
         patch=(
             ('        total_bytes: the same, summed over every ``reduce()`` so far.\n    """\n',
              '        total_bytes: the same, summed over every ``reduce()`` so far.\n        steps: how many times ``reduce()`` ran.\n    """\n'),
             ("""        self.bytes_sent, self.total_bytes = 0, 0
""",
              """        self.bytes_sent, self.total_bytes, self.steps = 0, 0, 0
"""),
             ("""        average over the ranks, compressed by PowerSGD; update ``bytes_sent`` and
        ``total_bytes``.
""",
              """        average over the ranks, compressed by PowerSGD; update ``bytes_sent``.
"""),
             ("""        Every rank runs this code on gradients of the same shapes, so all ranks make the same
        all_reduce calls in the same order (whether the uncompressed buffer goes before or
        after the P's and Q's is yours to choose).
""",
              """        Every rank makes the same all_reduce calls in the same order: the uncompressed
        buffer (if any), then the P's, then the Q's (if any tensor is compressed).
"""),
             ("""            sent += flat.numel() * flat.element_size()
""",
              """            sent += flat.numel()
"""),
             ("""            sent += flat_p.numel() * flat_p.element_size()
""",
              """            sent += flat_p.numel()
"""),
             ("""            sent += flat_q.numel() * flat_q.element_size()
""",
              """            sent += flat_q.numel()
"""),
             ("""        self.total_bytes += sent

""",
              """        self.total_bytes += sent
        self.steps += 1

"""),
         )),
    Flaw('powersgd', 'compress_1d', clause='1-d-tensors', case='?',
         why=('compression_rank views a 1-D tensor (a bias) '
              'of length n as an (n, 1) matrix instead of always sending it uncompressed, so with a '
              'min_compression_rate below 1 biases are compressed (more elements and collectives than '
              'needed).'),
         patch=(
             ("""    if len(shape) < 2:
        return 0
""",
              ''),
             ('        total_bytes: the same, summed over every ``reduce()`` so far.\n    """\n',
              '        total_bytes: the same, summed over every ``reduce()`` so far.\n        steps: how many times ``reduce()`` ran.\n    """\n'),
             ("""        self.bytes_sent, self.total_bytes = 0, 0
""",
              """        self.bytes_sent, self.total_bytes, self.steps = 0, 0, 0
"""),
             ("""        average over the ranks, compressed by PowerSGD; update ``bytes_sent`` and
        ``total_bytes``.
""",
              """        average over the ranks, compressed by PowerSGD; update ``bytes_sent``.
"""),
             ("""        Every rank runs this code on gradients of the same shapes, so all ranks make the same
        all_reduce calls in the same order (whether the uncompressed buffer goes before or
        after the P's and Q's is yours to choose).
""",
              """        Every rank makes the same all_reduce calls in the same order: the uncompressed
        buffer (if any), then the P's, then the Q's (if any tensor is compressed).
"""),
             ("""        self.total_bytes += sent

""",
              """        self.total_bytes += sent
        self.steps += 1

"""),
         )),
    Flaw('powersgd', 'grad_none', clause='replace-p-grad', case='?',
         why=('PowerSGD.reduce assumes every parameter has a '
              'gradient: a trainable parameter whose grad is None (a layer the forward pass did not '
              'use) crashes it with AttributeError.'),
         patch=(
             ("""            if p.grad is None:
                continue
""",
              ''),
         )),
    Flaw('powersgd', 'ignores_warm_start_flag', clause='q-self-qs', case='?',
         why=('PowerSGD.reduce always keeps the '
              'previous Q (it draws a new one only for a tensor it has not seen), even when the '
              'compressor was built with warm_start=False.'),
         patch=(
             ("""                if not self.warm_start or i not in self.qs:
""",
              """                if i not in self.qs:
"""),
         )),
    Flaw('powersgd', 'no_error_feedback', clause='m-grad-viewed', case='?',
         why=('PowerSGD.reduce computes and stores '
              "error = M - P Q^T but never adds it to the next step's gradient (M is the raw gradient),"
              ' so what the low-rank approximation misses is lost for good.'),
         patch=(
             ('        total_bytes: the same, summed over every ``reduce()`` so far.\n    """\n',
              '        total_bytes: the same, summed over every ``reduce()`` so far.\n        steps: how many times ``reduce()`` ran.\n    """\n'),
             ("""        self.bytes_sent, self.total_bytes = 0, 0
""",
              """        self.bytes_sent, self.total_bytes, self.steps = 0, 0, 0
"""),
             ("""        average over the ranks, compressed by PowerSGD; update ``bytes_sent`` and
        ``total_bytes``.
""",
              """        average over the ranks, compressed by PowerSGD; update ``bytes_sent``.
"""),
             ("""        Every rank runs this code on gradients of the same shapes, so all ranks make the same
        all_reduce calls in the same order (whether the uncompressed buffer goes before or
        after the P's and Q's is yours to choose).
""",
              """        Every rank makes the same all_reduce calls in the same order: the uncompressed
        buffer (if any), then the P's, then the Q's (if any tensor is compressed).
"""),
             ("""                m = m + self.errors[i] if i in self.errors else m.clone()
""",
              """                m = m.clone()
"""),
             ("""        self.total_bytes += sent

""",
              """        self.total_bytes += sent
        self.steps += 1

"""),
         )),
    Flaw('powersgd', 'no_orthogonalization', clause='then-p-m', case='?',
         why=('PowerSGD.reduce skips '
              'orthogonalize(P) after the all_reduce of P, so P Q^T = P P^T M is not a projection '
              '(wrong scale and mixing).'),
         patch=(
             ('        total_bytes: the same, summed over every ``reduce()`` so far.\n    """\n',
              '        total_bytes: the same, summed over every ``reduce()`` so far.\n        steps: how many times ``reduce()`` ran.\n    """\n'),
             ("""        self.bytes_sent, self.total_bytes = 0, 0
""",
              """        self.bytes_sent, self.total_bytes, self.steps = 0, 0, 0
"""),
             ("""        average over the ranks, compressed by PowerSGD; update ``bytes_sent`` and
        ``total_bytes``.
""",
              """        average over the ranks, compressed by PowerSGD; update ``bytes_sent``.
"""),
             ("""        Every rank runs this code on gradients of the same shapes, so all ranks make the same
        all_reduce calls in the same order (whether the uncompressed buffer goes before or
        after the P's and Q's is yours to choose).
""",
              """        Every rank makes the same all_reduce calls in the same order: the uncompressed
        buffer (if any), then the P's, then the Q's (if any tensor is compressed).
"""),
             ("""            ps = [orthogonalize(p) for p in _split(flat_p, [p.shape for p in ps])]
""",
              """            ps = _split(flat_p, [p.shape for p in ps])
"""),
             ("""        self.total_bytes += sent

""",
              """        self.total_bytes += sent
        self.steps += 1

"""),
         )),
    Flaw('powersgd', 'no_warm_start', clause='q-self-qs', case='?',
         why=('PowerSGD.reduce draws a fresh random Q at '
              "every step even with warm_start=True, so each step's power iteration starts from "
              'scratch.'),
         patch=(
             ('        total_bytes: the same, summed over every ``reduce()`` so far.\n    """\n',
              '        total_bytes: the same, summed over every ``reduce()`` so far.\n        steps: how many times ``reduce()`` ran.\n    """\n'),
             ("""        self.bytes_sent, self.total_bytes = 0, 0
""",
              """        self.bytes_sent, self.total_bytes, self.steps = 0, 0, 0
"""),
             ("""        average over the ranks, compressed by PowerSGD; update ``bytes_sent`` and
        ``total_bytes``.
""",
              """        average over the ranks, compressed by PowerSGD; update ``bytes_sent``.
"""),
             ("""        Every rank runs this code on gradients of the same shapes, so all ranks make the same
        all_reduce calls in the same order (whether the uncompressed buffer goes before or
        after the P's and Q's is yours to choose).
""",
              """        Every rank makes the same all_reduce calls in the same order: the uncompressed
        buffer (if any), then the P's, then the Q's (if any tensor is compressed).
"""),
             ("""                if not self.warm_start or i not in self.qs:
""",
              """                if True:  # a new Q every step
"""),
             ("""        self.total_bytes += sent

""",
              """        self.total_bytes += sent
        self.steps += 1

"""),
         )),
    Flaw('powersgd', 'plain_per_tensor', clause='r-0-sent', case='?',
         why=('PowerSGD.reduce all-reduces each '
              'uncompressed gradient (the biases, the matrices that would not shrink) on its own: the '
              'right averages and bytes, but one all_reduce per tensor instead of ONE flat buffer (a '
              'latency per tensor).'),
         patch=(
             ("""        if plain:
            flat = torch.cat([p.grad.reshape(-1) for _, p, _ in plain])
            dist.all_reduce(flat)
            sent += flat.numel() * flat.element_size()
            flat /= world
            offset = 0
            for _, p, _ in plain:
                n = p.grad.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n
""",
              """        for _, p, _ in plain:                  # one all_reduce per uncompressed tensor
            dist.all_reduce(p.grad)
            sent += p.grad.numel() * p.grad.element_size()
            p.grad /= world
"""),
         )),
    Flaw('powersgd', 'q_not_averaged', clause='then-p-m', case='?',
         why=("PowerSGD.reduce all-reduces the Q's (a "
              'sum) but never divides them by the world size, so every compressed gradient is '
              'world_size times too large.'),
         patch=(
             ('        total_bytes: the same, summed over every ``reduce()`` so far.\n    """\n',
              '        total_bytes: the same, summed over every ``reduce()`` so far.\n        steps: how many times ``reduce()`` ran.\n    """\n'),
             ("""        self.bytes_sent, self.total_bytes = 0, 0
""",
              """        self.bytes_sent, self.total_bytes, self.steps = 0, 0, 0
"""),
             ("""        average over the ranks, compressed by PowerSGD; update ``bytes_sent`` and
        ``total_bytes``.
""",
              """        average over the ranks, compressed by PowerSGD; update ``bytes_sent``.
"""),
             ("""        Every rank runs this code on gradients of the same shapes, so all ranks make the same
        all_reduce calls in the same order (whether the uncompressed buffer goes before or
        after the P's and Q's is yours to choose).
""",
              """        Every rank makes the same all_reduce calls in the same order: the uncompressed
        buffer (if any), then the P's, then the Q's (if any tensor is compressed).
"""),
             ("""            flat_q /= world
""",
              ''),
             ("""        self.total_bytes += sent

""",
              """        self.total_bytes += sent
        self.steps += 1

"""),
         )),
]

