"""What notebook 08's exercises promise: their contracts, clause by clause, with the check cases
that hold each clause.

``CONTRACT[exercise]`` lists :class:`~exercise_utils.contract.Clause` rows: every Args / Returns
/ Attributes clause of the docstrings of ``work/08_powersgd.py`` and every behavioural sentence
of the notebook, word for word, and the cases of :mod:`.checks` and :mod:`.checks_powersgd`
that exercise it. Every case rejects at least one known-wrong file of
``tests/wrong/08_flaws.py``, which names the clause it breaks (``tests/test_requirements.py``,
``tests/test_checks.py``).

Used in 08_bonus_powersgd.
"""
from ..contract import Clause

CONTRACT = {
    "orthogonalize": [
        Clause("returns", "Make the columns of ``P`` orthonormal (Gram-Schmidt); return the "
               "result.", cases=("ortho-orthonormal",)),
        Clause("tensor", "A tensor of P's shape and dtype (it may be ``P`` itself, changed in "
               "place) whose columns are orthonormal",
               cases=("ortho-orthonormal", "ortho-float64")),
        Clause("p-arg", "P: float32 or float64 tensor of shape (n, r) with n >= r (r may be 1).",
               cases=("ortho-float64", "ortho-one-column")),
        Clause("gram-schmidt", "column j built from P's columns 0..j only: column j minus its "
               "projections on the (already orthonormal) columns 0..j-1, divided by its norm "
               "(+ eps).", cases=("ortho-gram-schmidt",)),
        Clause("qr", "In matrix terms P = result @ R with R upper-triangular (a QR "
               "decomposition; ``torch.linalg.qr(P).Q`` is also accepted).",
               cases=("ortho-gram-schmidt",)),
        Clause("eps", "eps: added to each column's norm before dividing by it (a zero column "
               "stays zero instead of becoming NaN).",
               cases=("ortho-zero-column", "ortho-eps-norm")),
    ],
    "compression_rank": [
        Clause("shape-arg", "shape: the gradient's shape (a tuple or ``torch.Size``).",
               cases=("rank-tuple",)),
        Clause("rank-arg", "rank: the rank r asked for.", cases=("rank-matrix",)),
        Clause("rate-arg", "min_compression_rate: compress only if it divides the numbers sent "
               "by more than this.", cases=("rank-rate",)),
        Clause("int-0-tensors", "int: 0 for tensors with fewer than 2 dimensions (biases: always "
               "uncompressed, whatever the rate).",
               cases=("rank-1d", "rank-scalar", "rank-int")),
        Clause("matrix-view", "Otherwise, with the tensor viewed as a matrix (n, m), n = "
               "shape[0], m = the product of the other dimensions,", cases=("rank-conv",)),
        Clause("r-prime", "r' = min(n, m, rank)", cases=("rank-large",)),
        Clause("saving-rule", "r' if (n + m) * r' * min_compression_rate < n * m (compressing "
               "saves enough), else 0.", cases=("rank-matrix", "rank-tie", "rank-rate")),
        Clause("never-1d", "A tensor is compressed only when it shrinks: `(n + m) r < n m`; 1-D "
               "tensors never are.", cases=("rank-1d", "rank-tie")),
        Clause("empty", "A shape with a zero dimension (no elements) gives 0, whatever the rate "
               "(r' = 0: nothing to compress).", cases=("rank-empty",)),
    ],
    "powersgd": [
        Clause("params-arg", "params: the parameters (an iterable); those with "
               "``requires_grad=False`` are ignored.", cases=("psgd-state",)),
        Clause("rank-arg", "rank: the rank r of the approximations.",
               cases=("psgd-elements", "psgd-values", "psgd-full-rank")),
        Clause("rate-arg", "min_compression_rate: see :func:`compression_rank`.",
               cases=("psgd-rate",)),
        Clause("warm-start-arg", "warm_start: keep each tensor's Q from one step to the next "
               "(else a fresh random Q every step).", cases=("psgd-values", "psgd-cold")),
        Clause("seed-arg", "seed: seed of the random Qs: the same on every rank, so the ranks "
               "start from the same Q.", cases=("psgd-values",)),
        Clause("attr-params", "params: the list of the trainable parameters "
               "(``requires_grad=True``), in the order given (their index in it identifies "
               "their state).", cases=("psgd-state",)),
        Clause("attr-errors", "errors: ``{index: error matrix (n, m)}`` (error feedback) of the "
               "compressed tensors.", cases=("psgd-state",)),
        Clause("attr-qs", "qs: ``{index: Q (m, r')}`` of the compressed tensors (warm start).",
               cases=("psgd-state",)),
        Clause("bytes-sent", "bytes_sent: bytes this rank passed to ``all_reduce`` during the "
               "last ``reduce()`` (elements times element size, all calls together).",
               cases=("psgd-bytes", "psgd-float64")),
        Clause("total-bytes", "total_bytes: the same, summed over every ``reduce()`` so far.",
               cases=("psgd-total-bytes",)),
        Clause("replace", "Replace every ``p.grad`` (``p`` in ``self.params``, ``p.grad`` not "
               "None) by its average over the ranks, compressed by PowerSGD",
               cases=("psgd-values", "psgd-skip-none")),
        Clause("per-parameter", "Per parameter (index i in ``self.params``, in that order), r' "
               "= compression_rank( grad.shape, self.rank, self.min_compression_rate):",
               cases=("psgd-elements", "psgd-rate", "psgd-full-rank")),
        Clause("plain", "r' == 0: sent uncompressed. All of these go in ONE flat buffer: ONE "
               "all_reduce (sum), divide by the world size, copy back into each ``p.grad``.",
               cases=("psgd-one-buffer", "psgd-values", "psgd-same")),
        Clause("m", "M = grad reshaped to (n, m) (``reshape``, not ``view``: a gradient may be "
               "non-contiguous, e.g. of a parameter stored transposed or of a channels_last "
               "conv weight), plus ``self.errors[i]`` if there is one.",
               cases=("psgd-values", "psgd-model")),
        Clause("q", "Q is ``self.qs[i]``, or ``self.new_q(m, r')`` if there is none yet or if "
               "``warm_start`` is False (draw them in parameter order).",
               cases=("psgd-values", "psgd-cold", "psgd-full-rank")),
        Clause("steps", "Then P = M Q; all_reduce the P's (sum; they may share one flat "
               "buffer); P = orthogonalize(P); Q = M^T P; all_reduce the Q's and divide them "
               "by the world size; approx = P Q^T; ``self.errors[i] = M - approx``; "
               "``self.qs[i] = Q``; ``p.grad`` <- approx (its own shape).",
               cases=("psgd-values", "psgd-same", "psgd-state")),
        Clause("dtype", "Gradients are float32 or float64 (the model's dtype): keep that dtype "
               "everywhere (M, P, Q, ``self.errors``, ``self.qs``, the flat buffer; ``new_q`` "
               "draws float32, so cast its Q to M's dtype), so that float64 gradients are sent "
               "with 8 bytes an element.", cases=("psgd-dtype", "psgd-float64")),
        Clause("varying", "Which parameters have a gradient may change from one call to the "
               "next: a parameter skipped in a call keeps its ``self.errors[i]`` and "
               "``self.qs[i]`` for the next call in which it has a gradient.",
               cases=("psgd-varying",)),
        Clause("empty", "A gradient with a zero dimension, e.g. of shape (0, k), is sent "
               "uncompressed (r' = 0): it adds no element to the flat buffer.",
               cases=("psgd-empty",)),
        Clause("one-rank", "This works with any number of ranks, one included: each compressed "
               "gradient then becomes its own approximation P Q^T.",
               cases=("psgd-elements", "psgd-values")),
        Clause("same", "approx = P Q^T # the same on every rank: the new gradient",
               cases=("psgd-same",)),
        Clause("error-kept", "error = M - approx # kept for the next step (per tensor, on this "
               "rank)", cases=("psgd-values", "psgd-state")),
        Clause("sent", "Sent per compressed tensor: (n + m) * r numbers instead of n * m.",
               cases=("psgd-elements", "psgd-wire")),
        Clause("one-buffer", "1-D tensors (biases) and matrices that would not shrink are "
               "all-reduced uncompressed, together in ONE flat buffer.",
               cases=("psgd-one-buffer", "psgd-full-rank")),
        Clause("feedback", "The part of `M` the rank-`r` approximation misses, `M − P Qᵀ`, is "
               "kept and added to the next gradient: nothing is lost for good, it is only "
               "delayed.", cases=("psgd-values",)),
        Clause("flat-buffer", "The uncompressed tensors are all-reduced together in one flat buffer "
               "(notebook 06).", cases=("psgd-one-buffer",)),
        Clause("full-rank", "full rank, where the result must equal the exact average",
               cases=("psgd-full-rank",)),
        Clause("bytes-per-step", "checks the bytes per step: `(n + m) r` elements per "
               "compressed tensor plus every uncompressed element, in one flat buffer",
               cases=("psgd-elements", "psgd-one-buffer")),
    ],
}
