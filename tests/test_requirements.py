"""Every clause of every exercise's contract is checked, by a case that rejects a known-wrong file.

Each notebook's package has ``requirements.py`` with ``CONTRACT = {exercise: [Clause(id, text,
cases), ...]}`` (:mod:`exercise_utils.contract`): every Args / Returns / Raises clause of the
exercise docstrings and every behavioural sentence of the notebook, word for word, with the
check cases that exercise it. ``tests/wrong/NN_flaws.py`` holds the known-wrong files, one flaw
each, each naming the clause it breaks and the case that must reject it (``tests/flaws.py``;
``tests/test_checks.py`` proves that this case does reject it). For every notebook:

* one contract per CHECK cell; each clause quoted from the solution notebook (white space
  collapsed), with at least one case; clause ids unique within the exercise;
* every flaw names an exercise, a clause of it and a case of that clause, and its patch applies;
* every clause is broken by at least one flaw, and every case of the table rejects at least
  one flaw (a case that can reject nothing checks nothing), or, for what only the network's
  counters can see, a cheat of ``tests/cheats/wire/``; every exercise has two flaws;
* every case the package's modules name (``fail("case", ...)``, ``case="..."``,
  ``ctx.case("...")``) is in the notebook's table, so no verification runs outside the contract,
  and every case of the table is named in those modules.
"""
import ast
import importlib
import json
import re
from pathlib import Path

import pytest

import flaws

ROOT = Path(__file__).resolve().parents[1]


def norm(text):
    return re.sub(r"\s+", " ", text).strip()


def package(number):
    return flaws.notebook(number).stem[3:]


def contract(number):
    return importlib.import_module(f"exercise_utils.{package(number)}.requirements").CONTRACT


def notebook_text(number):
    cells = json.loads(flaws.notebook(number).read_text())["cells"]
    return norm(" ".join("".join(c["source"]) for c in cells))


def modules(number):
    """The package's modules but its contract: checks, probes, references, inputs."""
    folder = ROOT / "exercise_utils" / package(number)
    return sorted(p for p in folder.glob("*.py") if p.stem != "requirements")


def named_cases(number):
    """``{case: module}`` for every literal case name the notebook's modules pass to ``fail``,
    ``case=`` or ``ctx.case``."""
    found = {}
    for path in modules(number):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            args = []
            if name in ("fail", "case") and node.args:
                args.append(node.args[0])
            args += [k.value for k in node.keywords if k.arg == "case"]
            for arg in args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found[arg.value] = path.name
    return found


@pytest.mark.parametrize("number", flaws.numbers())
def test_contract_quotes_the_notebook_and_gives_every_clause_a_case(number):
    table, text = contract(number), notebook_text(number)
    assert sorted(table) == sorted(flaws.checkers(number)), "one contract per CHECK cell"
    for exercise, clauses in table.items():
        assert clauses, exercise
        ids = [c.id for c in clauses]
        assert len(ids) == len(set(ids)), f"{exercise}: clause ids repeat: {ids}"
        for clause in clauses:
            assert norm(clause.text) in text, (
                f"{exercise}.{clause.id}: not in the notebook: {clause.text!r}")
            assert clause.cases, f"{exercise}.{clause.id}: no check case exercises it"
            assert isinstance(clause.cases, tuple), f"{exercise}.{clause.id}: cases is a tuple"


def wire_cases(number):
    """The cases proven by the cheats of ``tests/cheats/wire/`` instead of a flaw: what only the
    network's counters can see (each cheat's docstring: "Must fail ``case``";
    ``tests/test_wire.py`` proves that the case rejects it)."""
    return {m[1] for p in (ROOT / "tests" / "cheats" / "wire").glob(f"{number}_*.py")
            for m in [re.search(r"Must fail ``([\w-]+)``", p.read_text())] if m}


@pytest.mark.parametrize("number", flaws.numbers())
def test_every_clause_and_case_rejects_a_flaw(number):
    table, found = contract(number), flaws.load(number)
    for flaw in found:
        where = f"flaw {flaws.flaw_id(number, flaw)}"
        assert flaw.exercise in table, f"{where}: no exercise {flaw.exercise!r}"
        clause = next((c for c in table[flaw.exercise] if c.id == flaw.clause), None)
        assert clause, f"{where}: {flaw.exercise} has no clause {flaw.clause!r}"
        assert flaw.case in clause.cases, (
            f"{where}: case {flaw.case!r} is not one of clause {flaw.clause!r}'s cases "
            f"{clause.cases}")
        _, name = flaws.checker(number, flaw.exercise)
        flaws.apply(flaws.solution_file(number, name), flaw.patch)
    names = [flaws.flaw_id(number, f) for f in found]
    assert len(names) == len(set(names)), "flaw names repeat"
    for exercise, clauses in table.items():
        mine = [f for f in found if f.exercise == exercise]
        assert len(mine) >= 2, f"{exercise}: fewer than two flaws"
        for clause in clauses:
            assert any(f.clause == clause.id for f in mine), (
                f"{exercise}.{clause.id}: no flaw breaks it (tests/wrong/{number}_flaws.py)")
            for case in clause.cases:
                assert any(f.case == case for f in mine) or case in wire_cases(number), (
                    f"{exercise}.{clause.id}: case {case!r} rejects no flaw: give it a wrong "
                    f"file it must catch, or drop it")


@pytest.mark.parametrize("number", flaws.numbers())
def test_every_case_the_checkers_name_is_in_the_contract(number):
    listed = {case for clauses in contract(number).values() for c in clauses for case in c.cases}
    stray = {case: module for case, module in named_cases(number).items() if case not in listed}
    assert not stray, f"cases named by the checkers but in no clause of the contract: {stray}"
    literals = {node.value for path in modules(number)
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    unnamed = sorted(listed - literals)
    assert not unnamed, f"cases of the contract that no module of the package names: {unnamed}"


def test_the_rules_can_fail(monkeypatch):
    """A clause without a case, one without a flaw, a case that rejects no flaw, a flaw naming
    a case outside its clause, a sentence the notebook does not state and a case the checkers
    name outside the table each fail."""
    from exercise_utils.contract import Clause
    module = importlib.import_module("exercise_utils.mpi_parallel_sgd.requirements")
    real = {e: list(c) for e, c in module.CONTRACT.items()}

    def with_shards(*extra):
        monkeypatch.setattr(module, "CONTRACT", {**real, "shards": real["shards"] + list(extra)})

    with_shards(Clause("numpy", "Shards are returned as numpy arrays.", ("bounds-tile",)))
    with pytest.raises(AssertionError, match="not in the notebook"):
        test_contract_quotes_the_notebook_and_gives_every_clause_a_case("01")
    sentence = real["shards"][0].text
    with_shards(Clause("twice", sentence, ()))
    with pytest.raises(AssertionError, match="no check case exercises it"):
        test_contract_quotes_the_notebook_and_gives_every_clause_a_case("01")
    with_shards(Clause("twice", sentence, real["shards"][0].cases))
    with pytest.raises(AssertionError, match="no flaw breaks it"):
        test_every_clause_and_case_rejects_a_flaw("01")
    first = real["shards"][0]
    monkeypatch.setattr(module, "CONTRACT", {**real, "shards": [
        first._replace(cases=first.cases + ("never-fails",))] + real["shards"][1:]})
    with pytest.raises(AssertionError, match="case 'never-fails' rejects no flaw"):
        test_every_clause_and_case_rejects_a_flaw("01")
    monkeypatch.setattr(module, "CONTRACT", {**real, "shards": [
        first._replace(cases=("elsewhere",))] + real["shards"][1:]})
    with pytest.raises(AssertionError, match="is not one of clause"):
        test_every_clause_and_case_rejects_a_flaw("01")
    with pytest.raises(AssertionError, match="in no clause of the contract"):
        test_every_case_the_checkers_name_is_in_the_contract("01")
    monkeypatch.setattr(module, "CONTRACT", {**real, "shards": [
        first._replace(cases=first.cases + ("nowhere-named",))] + real["shards"][1:]})
    with pytest.raises(AssertionError, match="no module of the package names: .'nowhere-named'"):
        test_every_case_the_checkers_name_is_in_the_contract("01")
