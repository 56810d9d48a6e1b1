"""Contracts as data: what an exercise promises, and which check case holds each promise.

An exercise's contract is a list of :class:`Clause` rows in its package's ``requirements.py``
(``CONTRACT = {exercise: [Clause(...), ...]}``): every Args / Returns / Raises clause of the
exercise's docstrings and every behavioural sentence of the notebook, quoted word for word,
each naming the check cases that exercise it. A check case is a named verification of a
checker (``"bounds-tile"``, ``"float64-model"``); when it finds a violation it raises
:class:`CheckFailure` through :func:`fail`, carrying its name. A crash or a hang inside a
launch is charged to the case the ranks were running (``run_ranks(..., case=...)``, or the
probe's ``ctx.case(...)``).

The tests hold the table to the checks (``tests/test_requirements.py``): every clause has a
case, every case rejects at least one known-wrong file (``tests/wrong/NN_flaws.py``: one
patch of the solution per flaw, each naming the clause it breaks and the case that must
reject it), and every case a checker names is in the table.

Used by every checker (01_mpi_parallel_sgd onwards).
"""
from typing import NamedTuple


class CheckFailure(AssertionError):
    """A check's verdict against a student file: the message the student reads, and the case
    (:attr:`case`) of the contract that found the violation (None: no case, e.g. a file that
    does not exist or an exercise not implemented yet)."""

    def __init__(self, message, case=None):
        super().__init__(message)
        self.case = case
        self.__suppress_context__ = True     # raised while handling another error: the
        #                                      student reads this message, not a chain


def fail(case, message):
    """Raise :class:`CheckFailure` for the check case ``case`` with ``message``."""
    raise CheckFailure(message, case)


class Clause(NamedTuple):
    """One row of an exercise's contract.

    Attributes:
        id: a short name, unique within the exercise (flaws name it).
        text: the clause, word for word as the solution notebook states it (its text or a
            docstring of its ``%%writefile`` cell); white space may differ.
        cases: the check cases that exercise it.
    """
    id: str
    text: str
    cases: tuple


def cases(contract):
    """``{case: [clause ids]}`` over the rows of one exercise's contract."""
    out = {}
    for clause in contract:
        for case in clause.cases:
            out.setdefault(case, []).append(clause.id)
    return out
