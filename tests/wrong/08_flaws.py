"""Known-wrong files of notebook 08, as patches of the solution (see tests/flaws.py): one flaw
each, the way a student would make it, naming the clause of the contract it breaks
(exercise_utils/bonus_powersgd/requirements.py) and the check case that must reject it."""
import textwrap

from flaws import Def, Flaw

NORM = "        col /= torch.linalg.vector_norm(col) + eps\n"
RANK_RULE = "    return r if (n + m) * r * min_compression_rate < n * m else 0\n"
SKIP_NONE = "            if p.grad is None:\n                continue\n"
PICK = "            r = compression_rank(p.grad.shape, self.rank, self.min_compression_rate)\n"
M_VIEW = "                m = p.grad.reshape(p.grad.shape[0], -1)\n"
NEW_Q = ("                    self.qs[i] = self.new_q(m.shape[1], r).to(m.dtype)"
         "   # float64 gradients too\n")
PLAIN_CAT = "            flat = torch.cat([p.grad.reshape(-1) for _, p, _ in plain])\n"
PLAIN_BLOCK = """        if plain:
            flat = torch.cat([p.grad.reshape(-1) for _, p, _ in plain])
            dist.all_reduce(flat)
            sent += flat.numel() * flat.element_size()
            flat /= world
            offset = 0
            for _, p, _ in plain:
                n = p.grad.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n
"""
ERROR = "                self.errors[i] = m - approx\n"
INIT_PARAMS = "        self.params = [p for p in params if p.requires_grad]\n"


def rank_def(body):
    """compression_rank with ``body`` (indented as a function body) after the 1-D test."""
    return Def("compression_rank", "def compression_rank(shape, rank, min_compression_rate=1.0):\n"
               "    if len(shape) < 2:\n        return 0\n"
               + textwrap.indent(textwrap.dedent(body).strip("\n"), "    "))


FLAWS = [
    # ------------------------------------------------------------------ orthogonalize
    Flaw("orthogonalize", "no_return", clause="returns", case="ortho-orthonormal",
         why="orthogonalizes P in place (as the docstring allows) but forgets to return it, so "
             "the caller gets None.",
         expect="returned None",
         patch=(("            rest -= col @ (col.T @ rest)\n    return P\n",
                 "            rest -= col @ (col.T @ rest)\n"),)),
    Flaw("orthogonalize", "not_normalized", clause="tensor", case="ortho-orthonormal",
         why="subtracts the projections on the earlier columns but never divides the columns by "
             "their norms (and so projects with unnormalised columns).",
         expect="Q^T Q should be the identity",
         patch=((NORM, ""),)),
    Flaw("orthogonalize", "qr_in_float32", clause="tensor", case="ortho-float64",
         why="returns torch.linalg.qr(P.float()).Q, as the docstring accepts, in float32 'for "
             "speed': a float64 P gets a float32 result.",
         expect="dtype float32; expected a torch tensor of P's shape and dtype",
         patch=(Def("orthogonalize", """
             def orthogonalize(P, eps=1e-8):
                 return torch.linalg.qr(P.float()).Q        # float32 is plenty for a basis
             """),)),
    Flaw("orthogonalize", "float32_arithmetic", clause="p-arg", case="ortho-float64",
         why="Gram-Schmidt on a float32 copy, cast back to P's dtype at the end: the dtype is "
             "right, but a float64 P is orthogonalized only to float32 precision.",
         expect="off by",
         patch=(Def("orthogonalize", """
             def orthogonalize(P, eps=1e-8):
                 Q = P.float()                               # float32 is plenty for a basis
                 for j in range(Q.shape[1]):
                     col = Q[:, j:j + 1]
                     col /= torch.linalg.vector_norm(col) + eps
                     if j + 1 < Q.shape[1]:
                         rest = Q[:, j + 1:]
                         rest -= col @ (col.T @ rest)
                 return Q.to(P.dtype)
             """),)),
    Flaw("orthogonalize", "one_column_vector", clause="p-arg", case="ortho-one-column",
         why="special-cases a single column by normalising P[:, 0], which returns a vector of "
             "shape (n,) instead of an (n, 1) matrix.",
         expect="of shape (7,)",
         patch=(("    for j in range(P.shape[1]):\n        col = P[:, j:j + 1]\n",
                 "    if P.shape[1] == 1:                      # one column: just normalise it\n"
                 "        return P[:, 0] / (torch.linalg.vector_norm(P) + eps)\n"
                 "    for j in range(P.shape[1]):\n        col = P[:, j:j + 1]\n"),)),
    Flaw("orthogonalize", "no_eps", clause="eps", case="ortho-zero-column",
         why="divides each column by its bare norm, without the eps guard: fine on random "
             "matrices, but a zero column (a zero gradient makes P = M Q zero) becomes 0 / 0 = "
             "NaN, and the NaN spreads to the later columns and into the model.",
         expect="returned NaN or inf",
         patch=((NORM, "        col /= torch.linalg.vector_norm(col)\n"),)),
    Flaw("orthogonalize", "eps_under_sqrt", clause="eps", case="ortho-eps-norm",
         why="guards the division with eps under the square root, column / sqrt(sum of squares "
             "+ eps), as in RMSNorm: a zero column still stays zero and columns of norm about 1 "
             "come out unit length, but a column of norm 1e-4 (sum of squares near eps) comes "
             "out well short of it.",
         expect="under the square root",
         patch=((NORM, "        col /= torch.sqrt((col * col).sum() + eps)\n"),)),
    Flaw("orthogonalize", "svd", clause="gram-schmidt", case="ortho-gram-schmidt",
         why="returns the left singular vectors of P (torch.linalg.svd): orthonormal columns "
             "spanning the same space, but column j mixes all of P's columns instead of being "
             "built from columns 0..j (no Gram-Schmidt, no QR).",
         expect="built from P's columns 0..j only",
         patch=(Def("orthogonalize", """
             def orthogonalize(P, eps=1e-8):
                 U, _, _ = torch.linalg.svd(P, full_matrices=False)   # a basis of span(P)
                 return U
             """),)),
    Flaw("orthogonalize", "last_column_first", clause="qr", case="ortho-gram-schmidt",
         why="runs Gram-Schmidt from the last column to the first: orthonormal columns, but "
             "column j is built from columns j..r-1, so P = result @ R has R lower-triangular.",
         expect="built from P's columns 0..j only",
         patch=(Def("orthogonalize", """
             def orthogonalize(P, eps=1e-8):
                 for j in reversed(range(P.shape[1])):
                     col = P[:, j:j + 1]
                     col /= torch.linalg.vector_norm(col) + eps
                     if j > 0:                               # remove it from the earlier ones
                         rest = P[:, :j]
                         rest -= col @ (col.T @ rest)
                 return P
             """),)),
    # ------------------------------------------------------------------ compression_rank
    Flaw("compression_rank", "ignores_rank", clause="rank-arg", case="rank-matrix",
         why="takes r' = min(n, m), the largest possible rank, ignoring the rank asked for.",
         expect="compression_rank(torch.Size([10, 24]), rank=1",
         patch=(("    r = min(n, m, rank)\n", "    r = min(n, m)\n"),)),
    Flaw("compression_rank", "precedence", clause="saving-rule", case="rank-matrix",
         why="writes the saving test as n + m * r' < n * m (a missing parenthesis), which "
             "compresses matrices that would not shrink.",
         expect="compression_rank(torch.Size([5, 6]), rank=3",
         patch=((RANK_RULE,
                 "    return r if n + m * r * min_compression_rate < n * m else 0\n"),)),
    Flaw("compression_rank", "ties_compressed", clause="saving-rule", case="rank-tie",
         why="compresses when (n + m) * r' * min_compression_rate <= n * m: at a tie "
             "compressing saves nothing (a 4 x 4 matrix at rank 2 sends 16 numbers either way) "
             "but still costs two all_reduces and an approximation error.",
         expect="compression_rank(torch.Size([4, 4]), rank=2",
         patch=((RANK_RULE,
                 "    return r if (n + m) * r * min_compression_rate <= n * m else 0\n"),)),
    Flaw("compression_rank", "ignores_rate", clause="rate-arg", case="rank-rate",
         why="ignores min_compression_rate: compresses whenever (n + m) * r' < n * m.",
         expect="min_compression_rate=2.0",
         patch=((RANK_RULE, "    return r if (n + m) * r < n * m else 0\n"),)),
    Flaw("compression_rank", "rate_on_the_other_side", clause="saving-rule", case="rank-rate",
         why="multiplies the uncompressed size by the rate instead of the compressed one: "
             "(n + m) * r' < n * m * min_compression_rate, the same at rate 1 only.",
         expect="min_compression_rate=",
         patch=((RANK_RULE,
                 "    return r if (n + m) * r < n * m * min_compression_rate else 0\n"),)),
    Flaw("compression_rank", "ignores_m", clause="r-prime", case="rank-large",
         why="caps the rank by the number of rows only, r' = min(n, rank): a matrix with fewer "
             "columns than the rank asked for gets a rank it cannot have.",
         expect="r' = min(n, m, rank) = 3",
         patch=(("    r = min(n, m, rank)\n", "    r = min(n, rank)\n"),)),
    Flaw("compression_rank", "last_dim_as_m", clause="matrix-view", case="rank-conv",
         why="views a tensor as (product of all but the last dimension, last dimension), as "
             "for a Linear's input: right for matrices, wrong for conv weights.",
         expect="as a matrix (6, 18)",
         patch=(rank_def("""
                 m = int(shape[-1])                     # the last dimension: the inputs
                 n = 1
                 for d in shape[:-1]:
                     n *= int(d)
                 r = min(n, m, rank)
                 return r if (n + m) * r * min_compression_rate < n * m else 0
             """),)),
    Flaw("compression_rank", "one_d_as_column", clause="never-1d", case="rank-1d",
         why="returns 0 only for 0-d shapes and views a 1-D tensor of length n as an (n, 1) "
             "matrix, so below rate 1 biases are compressed.",
         expect="fewer than 2 dimensions",
         patch=(("    if len(shape) < 2:\n        return 0\n",
                 "    if len(shape) == 0:                 # scalars\n        return 0\n"),)),
    Flaw("compression_rank", "scalar", clause="int-0-tensors", case="rank-scalar",
         why="returns 0 only for 1-D shapes (len(shape) == 1): a 0-d parameter (a learnable "
             "scalar such as a temperature) then reaches shape[0] and raises IndexError.",
         expect="raised IndexError",
         patch=(("    if len(shape) < 2:\n", "    if len(shape) == 1:                 # biases\n"),)),
    Flaw("compression_rank", "numel_of_size", clause="shape-arg", case="rank-tuple",
         why="computes m with shape.numel(), which torch.Size has and a plain tuple has not.",
         expect="raised AttributeError",
         patch=(rank_def("""
                 n = shape[0]
                 m = shape.numel() // n
                 r = min(n, m, rank)
                 return r if (n + m) * r * min_compression_rate < n * m else 0
             """),)),
    Flaw("compression_rank", "numel_over_rows", clause="empty", case="rank-empty",
         why="gets m, the product of the other dimensions, as numel // n: right for every "
             "tensor with elements, a ZeroDivisionError for a shape (0, k).",
         expect="raised ZeroDivisionError",
         patch=(rank_def("""
                 n = int(shape[0])
                 m = torch.Size(shape).numel() // n     # the product of the other dimensions
                 r = min(n, m, rank)
                 return r if (n + m) * r * min_compression_rate < n * m else 0
             """),)),
    Flaw("compression_rank", "tensor_result", clause="int-0-tensors", case="rank-int",
         why="computes m as torch.tensor(shape[1:]).prod(), so whenever m is the smallest of "
             "n, m and rank the result is a 0-d tensor, not an int.",
         expect="returned a torch.Tensor",
         patch=(rank_def("""
                 n = int(shape[0])
                 m = torch.tensor(shape[1:]).prod()     # the product of the other dimensions
                 r = min(n, m, rank)
                 return r if (n + m) * r * min_compression_rate < n * m else 0
             """),)),
    Flaw("compression_rank", "numpy_product", clause="int-0-tensors", case="rank-int",
         why="computes m as numpy.prod(shape[1:]), so whenever m is the smallest of n, m and "
             "rank the result is a numpy.int64, not an int.",
         expect="returned a numpy.int64",
         patch=(rank_def("""
                 n = int(shape[0])
                 import numpy as np
                 m = np.prod(shape[1:])     # the product of the other dimensions
                 r = min(n, m, rank)
                 return r if (n + m) * r * min_compression_rate < n * m else 0
             """),)),
    # ------------------------------------------------------------------ PowerSGD: baseline
    Flaw("powersgd", "one_rank_early_return", clause="one-rank", case="psgd-elements",
         why="returns at once with one rank ('nothing to average'), so gradients are not "
             "compressed and nothing is counted.",
         expect="all_reduced 0 elements",
         patch=(("        world = dist.get_world_size()\n",
                 "        world = dist.get_world_size()\n"
                 "        if world == 1:                          # nothing to average\n"
                 "            return\n"),)),
    Flaw("powersgd", "averages_m_first", clause="sent", case="psgd-elements",
         why="all-reduces each matrix M before compressing it (the approximation of the "
             "average is the same), so the full n * m numbers are sent as well.",
         expect="all_reduced",
         patch=(("                ms.append(m)\n",
                 "                dist.all_reduce(m)              # average M first\n"
                 "                sent += m.numel() * m.element_size()\n"
                 "                m /= world\n"
                 "                ms.append(m)\n"),)),
    Flaw("powersgd", "no_saving_rule", clause="per-parameter", case="psgd-elements",
         why="compresses every matrix at r' = min(n, m, rank) instead of asking "
             "compression_rank, so matrices that would not shrink are compressed too.",
         expect="you compressed matrices that do not shrink",
         patch=((PICK, "            r = min(p.grad.shape[0], p.grad[0].numel(), self.rank) "
                       "if p.grad.dim() >= 2 else 0\n"),)),
    Flaw("powersgd", "rank_one_left_in", clause="rank-arg", case="psgd-elements",
         why="calls compression_rank with rank 1 (left from a test) instead of self.rank.",
         expect="all_reduced",
         patch=((PICK, "            r = compression_rank(p.grad.shape, 1, "
                       "self.min_compression_rate)\n"),)),
    Flaw("powersgd", "float64_arithmetic", clause="dtype", case="psgd-dtype",
         why="computes M, P and Q in float64 'for accuracy' whatever the gradients' dtype, so "
             "a float32 model sends 8 bytes an element.",
         expect="keep the gradients' dtype",
         patch=((M_VIEW, "                m = p.grad.reshape(p.grad.shape[0], -1).double()\n"),)),
    Flaw("powersgd", "plain_per_tensor", clause="plain", case="psgd-one-buffer",
         why="all-reduces each uncompressed gradient on its own: the right averages and "
             "bytes, but one all_reduce per tensor instead of ONE flat buffer.",
         expect="ONE flat buffer",
         patch=((PLAIN_BLOCK, """        for _, p, _ in plain:                  # one all_reduce per tensor
            dist.all_reduce(p.grad)
            sent += p.grad.numel() * p.grad.element_size()
            p.grad /= world
"""),)),
    Flaw("powersgd", "plain_two_buffers", clause="flat-buffer", case="psgd-one-buffer",
         why="one flat buffer for the biases and another for the matrices that do not shrink.",
         expect="ONE flat buffer",
         patch=((PLAIN_BLOCK, """        small = [e for e in plain if e[1].grad.dim() < 2]
        for group in (small, [e for e in plain if e not in small]):   # biases, then matrices
            if not group:
                continue
            flat = torch.cat([p.grad.reshape(-1) for _, p, _ in group])
            dist.all_reduce(flat)
            sent += flat.numel() * flat.element_size()
            flat /= world
            offset = 0
            for _, p, _ in group:
                n = p.grad.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n
"""),)),
    Flaw("powersgd", "plain_with_the_ps", clause="bytes-per-step", case="psgd-one-buffer",
         why="saves a call by putting the uncompressed gradients into the buffer of the P's.",
         expect="ONE flat buffer",
         patch=((PLAIN_BLOCK, ""),
                ("            flat_p = torch.cat([p.reshape(-1) for p in ps])\n",
                 "            plain_n = sum(p.grad.numel() for _, p, _ in plain)\n"
                 "            flat_p = torch.cat([p.grad.reshape(-1) for _, p, _ in plain]\n"
                 "                               + [p.reshape(-1) for p in ps])\n"),
                ("            ps = [orthogonalize(p) for p in _split(flat_p, [p.shape for p in ps])]\n",
                 "            offset = 0\n"
                 "            for _, p, _ in plain:\n"
                 "                n = p.grad.numel()\n"
                 "                p.grad.copy_(flat_p[offset:offset + n].view_as(p.grad) / world)\n"
                 "                offset += n\n"
                 "            ps = [orthogonalize(p) for p in _split(flat_p[plain_n:],\n"
                 "                                                   [p.shape for p in ps])]\n"))),
    Flaw("powersgd", "zero_filled", clause="replace", case="psgd-skip-none",
         why="gives a parameter without a gradient (an unused layer) a zero gradient so that "
             "every parameter can be treated alike.",
         expect="have a gradient after reduce()",
         patch=((SKIP_NONE, "            if p.grad is None:                  # an unused layer\n"
                            "                p.grad = torch.zeros_like(p)\n"),)),
    Flaw("powersgd", "grad_none", clause="replace", case="psgd-values",
         why="assumes every parameter has a gradient: a trainable parameter whose grad is None "
             "(a layer the forward pass did not use) crashes it with AttributeError.",
         expect="p.grad None",
         patch=((SKIP_NONE, ""),)),
    Flaw("powersgd", "plan_found_once", clause="varying", case="psgd-varying",
         why="decides at the first reduce() which tensors have a gradient and how each is sent, "
             "and keeps that plan (\"the model does not change\"): a parameter without a "
             "gradient in the first step is never averaged, one that loses its gradient later "
             "crashes it.",
         expect="Which parameters have a gradient changes from one call to the next",
         patch=(("        plain, compressed = [], []\n        for i, p in enumerate(self.params):\n"
                 + SKIP_NONE + PICK + "            (compressed if r else plain).append((i, p, r))\n",
                 "        if not hasattr(self, \"plan\"):       # the same tensors every step: once\n"
                 "            self.plan = ([], [])\n"
                 "            for i, p in enumerate(self.params):\n"
                 "                if p.grad is None:\n"
                 "                    continue\n"
                 "                r = compression_rank(p.grad.shape, self.rank, "
                 "self.min_compression_rate)\n"
                 "                (self.plan[1] if r else self.plan[0]).append((i, p, r))\n"
                 "        plain, compressed = self.plan\n"),)),
    Flaw("powersgd", "state_dropped", clause="varying", case="psgd-varying",
         why="drops the error of a parameter that has no gradient in this step (\"a stale "
             "error would be added to a gradient many steps later\"): when it has one again, "
             "what its earlier approximations missed is lost.",
         expect="keeps its self.errors[i] and self.qs[i]",
         patch=((SKIP_NONE, "            if p.grad is None:\n"
                            "                self.errors.pop(i, None)        # no stale error later\n"
                            "                continue\n"),)),
    Flaw("powersgd", "matrix_view_first", clause="empty", case="psgd-empty",
         why="views every gradient of 2 or more dimensions as the (n, m) matrix with "
             "reshape(n, -1) before asking compression_rank about it: the same answer for "
             "every tensor with elements, a RuntimeError for a (0, k) gradient.",
         expect="adds no element to the flat buffer",
         patch=((PICK, "            mat = p.grad.reshape(p.grad.shape[0], -1) if p.grad.dim() > 1 "
                       "else p.grad\n"
                       "            r = compression_rank(mat.shape, self.rank, "
                       "self.min_compression_rate)\n"),)),
    Flaw("powersgd", "bytes_in_elements", clause="bytes-sent", case="psgd-bytes",
         why="counts elements, not bytes, in bytes_sent (numel() without element_size()).",
         expect="bytes_sent is",
         patch=(("            sent += flat.numel() * flat.element_size()\n",
                 "            sent += flat.numel()\n"),
                ("            sent += flat_p.numel() * flat_p.element_size()\n",
                 "            sent += flat_p.numel()\n"),
                ("            sent += flat_q.numel() * flat_q.element_size()\n",
                 "            sent += flat_q.numel()\n"))),
    Flaw("powersgd", "bytes_sent_cumulative", clause="bytes-sent", case="psgd-bytes",
         why="keeps counting bytes_sent from one reduce() to the next (it equals total_bytes) "
             "instead of the bytes of the last call.",
         expect="bytes_sent is",
         patch=(("        sent = 0\n", "        sent = self.bytes_sent                  # so far\n"),
                ("        self.total_bytes += sent\n", "        self.total_bytes = sent\n"))),
    Flaw("powersgd", "total_reset", clause="total-bytes", case="psgd-total-bytes",
         why="sets total_bytes to this call's bytes instead of adding them.",
         expect="total_bytes is",
         patch=(("        self.total_bytes += sent\n", "        self.total_bytes = sent\n"),)),
    Flaw("powersgd", "plain_not_copied_back", clause="plain", case="psgd-same",
         why="all-reduces a torch.cat of the uncompressed gradients, believing it shares their "
             "memory, and never copies the average back: every rank keeps its own gradients.",
         expect="differs from rank 0's",
         patch=(("            flat /= world\n            offset = 0\n            for _, p, _ in plain:\n"
                 "                n = p.grad.numel()\n"
                 "                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))\n"
                 "                offset += n\n",
                 "            flat /= world                       # the grads see it (views)\n"),)),
    Flaw("powersgd", "local_ps_kept", clause="same", case="psgd-same",
         why="all-reduces a torch.cat of the P's but goes on with the P's of this rank, so "
             "every rank applies a different P Q^T.",
         expect="differs from rank 0's",
         patch=(("            ps = [orthogonalize(p) for p in _split(flat_p, [p.shape for p in ps])]\n",
                 "            ps = [orthogonalize(p) for p in ps]\n"),)),
    Flaw("powersgd", "plain_not_divided", clause="plain", case="psgd-values",
         why="sums the uncompressed gradients but never divides them by the world size.",
         expect="divide the flat buffer by the world size",
         patch=(("            flat /= world\n", ""),)),
    Flaw("powersgd", "no_error_feedback", clause="feedback", case="psgd-values",
         why="computes and stores error = M - P Q^T but never adds it to the next step's "
             "gradient (M is the raw gradient), so what the approximation misses is lost.",
         expect="error feedback is missing",
         patch=(("                m = m + self.errors[i] if i in self.errors else m.clone()\n",
                 "                m = m.clone()\n"),)),
    Flaw("powersgd", "no_orthogonalization", clause="steps", case="psgd-values",
         why="skips orthogonalize(P) after the all_reduce of P, so P Q^T = P P^T M is not a "
             "projection (wrong scale and mixing).",
         expect="P is not orthogonalized",
         patch=(("            ps = [orthogonalize(p) for p in _split(flat_p, [p.shape for p in ps])]\n",
                 "            ps = _split(flat_p, [p.shape for p in ps])\n"),)),
    Flaw("powersgd", "q_not_averaged", clause="steps", case="psgd-values",
         why="all-reduces the Q's (a sum) but never divides them by the world size, so every "
             "compressed gradient is world_size times too large.",
         expect="the Q's are summed, not averaged",
         patch=(("            flat_q /= world\n", ""),)),
    Flaw("powersgd", "no_warm_start", clause="q", case="psgd-values",
         why="draws a fresh random Q at every step even with warm_start=True, so each step's "
             "power iteration starts from scratch.",
         expect="a fresh random Q is drawn every step",
         patch=(("                if not self.warm_start or i not in self.qs:\n",
                 "                if True:                        # a new Q every step\n"),)),
    Flaw("powersgd", "seed_per_rank", clause="seed-arg", case="psgd-values",
         why="seeds the generator with seed + rank 'so that ranks explore different "
             "directions': the ranks start from different Qs.",
         expect="differs by",
         patch=(("        self.generator = torch.Generator().manual_seed(seed)\n",
                 "        self.generator = torch.Generator().manual_seed(seed + dist.get_rank())\n"),)),
    Flaw("powersgd", "params_generator", clause="attr-params", case="psgd-state",
         why="keeps params as a generator expression (no list), which the first reduce() "
             "exhausts: from the second on nothing is averaged.",
         expect="self.params is a builtins.generator",
         patch=((INIT_PARAMS,
                 "        self.params = (p for p in params if p.requires_grad)\n"),)),
    Flaw("powersgd", "frozen_kept", clause="params-arg", case="psgd-state",
         why="keeps every parameter, frozen ones too, in self.params, so the indices that "
             "identify each tensor's state are not those of the trainable parameters.",
         expect="frozen parameters are left out",
         patch=((INIT_PARAMS, "        self.params = list(params)\n"),)),
    Flaw("powersgd", "indices_of_grads", clause="attr-errors", case="psgd-state",
         why="numbers the parameters that have a gradient, so after an unused layer every "
             "tensor's state is kept under another index than its own in self.params.",
         expect="keys are",
         patch=(("        for i, p in enumerate(self.params):\n" + SKIP_NONE,
                 "        for i, p in enumerate([p for p in self.params if p.grad is not None]):\n"),)),
    Flaw("powersgd", "errors_in_grad_shape", clause="attr-errors", case="psgd-state",
         why="keeps each error in the gradient's own shape instead of the (n, m) matrix.",
         expect="has shape (6, 2, 3, 3)",
         patch=(("                m = m + self.errors[i] if i in self.errors else m.clone()\n",
                 "                m = m + self.errors[i].reshape(m.shape) if i in self.errors "
                 "else m.clone()\n"),
                (ERROR, "                self.errors[i] = (m - approx).view_as(param.grad)\n"))),
    Flaw("powersgd", "error_aliases_grad", clause="error-kept", case="psgd-state",
         why="drops the clone and computes the error in place on M, which at the first step is "
             "a view of p.grad: writing approx into p.grad then turns the error into approx.",
         expect="self.errors[",
         patch=(("                m = m + self.errors[i] if i in self.errors else m.clone()\n",
                 "                m = m + self.errors[i] if i in self.errors else m\n"),
                (ERROR, "                self.errors[i] = m.sub_(approx)      # in place\n"))),
    Flaw("powersgd", "local_q_kept", clause="attr-qs", case="psgd-state",
         why="keeps this rank's Q = M^T P (before its all_reduce) for the warm start instead "
             "of the averaged Q.",
         expect="self.qs[",
         patch=(("                self.qs[i] = q\n", "                self.qs[i] = m.T @ p\n"),)),
    # ------------------------------------------------------------------ one dimension changed
    Flaw("powersgd", "ignores_warm_start_flag", clause="warm-start-arg", case="psgd-cold",
         why="always keeps the previous Q (a new one only for a tensor not seen yet), even when "
             "the compressor was built with warm_start=False.",
         expect="Q is kept although warm_start=False",
         patch=(("                if not self.warm_start or i not in self.qs:\n",
                 "                if i not in self.qs:\n"),)),
    Flaw("powersgd", "ignores_rate", clause="rate-arg", case="psgd-rate",
         why="calls compression_rank without self.min_compression_rate (its default, 1.0).",
         expect="all_reduced",
         patch=((PICK, "            r = compression_rank(p.grad.shape, self.rank)\n"),)),
    Flaw("powersgd", "rank_not_r_prime", clause="full-rank", case="psgd-full-rank",
         why="draws Q with self.rank columns instead of r' = min(n, m, rank): above min(n, m) "
             "it sends more than (n + m) r' numbers and P has more columns than rows.",
         expect="all_reduced",
         patch=((NEW_Q, "                    self.qs[i] = self.new_q(m.shape[1], self.rank)"
                        ".to(m.dtype)\n"),)),
    Flaw("powersgd", "compress_1d", clause="one-buffer", case="psgd-full-rank",
         why="compression_rank views a 1-D tensor of length n as an (n, 1) matrix instead of "
             "always sending it uncompressed (only 0-d ones are), so with a rate below 1 "
             "biases are compressed.",
         expect="you compressed 1-D tensors",
         patch=(("    if len(shape) < 2:\n        return 0\n",
                 "    if len(shape) == 0:\n        return 0\n"),)),
    Flaw("powersgd", "q_left_float32", clause="dtype", case="psgd-float64",
         why="uses new_q's float32 Q as it is, so float64 gradients meet a float32 matrix.",
         expect="in check case 'psgd-float64'",
         patch=((NEW_Q, "                    self.qs[i] = self.new_q(m.shape[1], r)\n"),)),
    Flaw("powersgd", "four_bytes_an_element", clause="bytes-sent", case="psgd-float64",
         why="counts 4 bytes an element (float32) in bytes_sent, whatever the dtype.",
         expect="bytes_sent is",
         patch=(("            sent += flat.numel() * flat.element_size()\n",
                 "            sent += flat.numel() * 4\n"),
                ("            sent += flat_p.numel() * flat_p.element_size()\n",
                 "            sent += flat_p.numel() * 4\n"),
                ("            sent += flat_q.numel() * flat_q.element_size()\n",
                 "            sent += flat_q.numel() * 4\n"))),
    Flaw("powersgd", "float32_flat_buffer", clause="dtype", case="psgd-float64",
         why="sends the uncompressed gradients in a float32 buffer (half the bytes), which "
             "rounds float64 gradients.",
         expect="keep the gradients' dtype",
         patch=((PLAIN_CAT, "            flat = torch.cat([p.grad.reshape(-1).float() "
                            "for _, p, _ in plain])\n"),)),
    Flaw("powersgd", "float32_errors", clause="dtype", case="psgd-float64",
         why="keeps the errors in float32 ('a residual needs no precision').",
         expect="dtype float32",
         patch=((ERROR, "                self.errors[i] = (m - approx).float()\n"),)),
    Flaw("powersgd", "view_transposed", clause="m", case="psgd-model",
         why="takes M with view, which fails on the non-contiguous gradient of a parameter "
             "stored transposed.",
         expect="in check case 'psgd-model'",
         patch=((M_VIEW, "                m = p.grad.view(p.grad.shape[0], -1)\n"),)),
]
