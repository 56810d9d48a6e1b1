"""What notebook 08's exercises require, quoted from the docstrings of ``work/08_powersgd.py``.

``REQUIREMENTS[exercise]`` lists the sentences a correct file must satisfy, word for word as
the solution notebook states them. Every one has at least one wrong file in ``tests/wrong/``
whose docstring quotes it and which the exercise's check rejects; every wrong file quotes one
(``tests/test_requirements.py``). A requirement without a wrong file is either checked next
time or deleted from the notebook.

Used in 08_bonus_powersgd.
"""
from ..contract import Clause

CONTRACT = {
    "orthogonalize": [
        Clause("tensor-p-s",
               "A tensor of P's shape and dtype (it may be ``P`` itself, changed in place) whose"
               " columns are orthonormal, column j built from P's columns 0..j only: column j "
               "minus its projections on the (already orthonormal) columns 0..j-1, divided by "
               "its norm (+ eps).",
               cases=()),
        Clause("eps-added-column",
               "eps: added to each column's norm before dividing by it (a zero column stays zero"
               " instead of becoming NaN).",
               cases=()),
    ],
    "compression_rank": [
        Clause("int-0-tensors",
               "int: 0 for tensors with fewer than 2 dimensions (biases: always uncompressed, "
               "whatever the rate).",
               cases=()),
        Clause("otherwise-tensor-viewed",
               "Otherwise, with the tensor viewed as a matrix (n, m), n = shape[0], m = the "
               "product of the other dimensions, and r' = min(n, m, rank): r' if (n + m) * r' * "
               "min_compression_rate < n * m (compressing saves enough), else 0.",
               cases=()),
    ],
    "powersgd": [
        Clause("replace-p-grad",
               "Replace every ``p.grad`` (``p`` in ``self.params``, ``p.grad`` not None) by its "
               "average over the ranks, compressed by PowerSGD",
               cases=()),
        Clause("1-d-tensors",
               "1-D tensors (biases) and matrices that would not shrink are all-reduced "
               "uncompressed, together in ONE flat buffer.",
               cases=()),
        Clause("r-0-sent",
               "r' == 0: sent uncompressed. All of these go in ONE flat buffer: ONE all_reduce "
               "(sum), divide by the world size, copy back into each ``p.grad``.",
               cases=()),
        Clause("m-grad-viewed", "M = grad viewed as (n, m), plus ``self.errors[i]`` if there is one.",
               cases=()),
        Clause("q-self-qs",
               "Q is ``self.qs[i]``, or ``self.new_q(m, r')`` if there is none yet or if "
               "``warm_start`` is False (draw them in parameter order).",
               cases=()),
        Clause("then-p-m",
               "Then P = M Q; all_reduce the P's (sum; they may share one flat buffer); P = "
               "orthogonalize(P); Q = M^T P; all_reduce the Q's and divide them by the world "
               "size; approx = P Q^T; ``self.errors[i] = M - approx``; ``self.qs[i] = Q``; "
               "``p.grad`` <- approx (its own shape).",
               cases=()),
        Clause("bytes-sent-bytes",
               "bytes_sent: bytes this rank passed to ``all_reduce`` during the last "
               "``reduce()`` (elements times element size, all calls together). total_bytes: the"
               " same, summed over every ``reduce()`` so far.",
               cases=()),
    ],
}
