"""The normative Z3 encoding states the spec only; the encoded mutants live apart.

:mod:`affinity_proofs.z3_model` and :mod:`affinity_proofs.z3_param` are what a reader checks
against SPEC.md, so they must not carry the mutants: no import of the mutant module, no
identifier named after a mutant or after one of its replacement pieces, no branch on the
pieces record, and a spec pieces record made of spec functions only. Each check runs once
on the real modules and once on a small source written the way a switch-carrying encoding
would be, which it must flag.
"""

from __future__ import annotations

import ast
import inspect
from types import ModuleType
from typing import Any

import attrs
import pytest
from affinity_proofs import z3_model, z3_mutants, z3_param
from affinity_proofs.z3_band_lemmas import BAND_LEMMAS
from affinity_proofs.z3_param import SPEC_POOL_PARTS
from affinity_proofs.z3_param_lemmas import PARAM_LEMMAS

NORMATIVE = (z3_model, z3_param)

# How an encoding with a mutant switch reads: a flag on a rules record, branched on.
SWITCHED = '''
import attrs
from .z3_mutants import by_name

@attrs.frozen
class Rules:
    band_no_cap: bool = False

def band(p, rules):
    if rules.band_no_cap:
        return p.margin + p.quot
    return min(p.margin + p.quot, p.cap)

def keep_rule(p, parts):
    return p.own < p.bound if parts.strict else p.own <= p.bound
'''


def _replaced_pieces() -> dict[str, Any]:
    """Every piece a mutant puts in place of the spec's, by field and function name."""
    spec = attrs.asdict(SPEC_POOL_PARTS, recurse=False)
    out: dict[str, Any] = {}
    for mutant in z3_mutants.ENCODED_MUTANTS:
        for field, piece in attrs.asdict(mutant.variant.parts, recurse=False).items():
            if piece is not spec[field]:
                out[f"{mutant.name}.{field}"] = piece
    return out


def _forbidden() -> set[str]:
    names = {m.name for m in z3_mutants.ENCODED_MUTANTS}
    names |= {piece.__name__.lstrip("_") for piece in _replaced_pieces().values()}
    return names


def _identifiers(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.arg | ast.keyword) and node.arg:
            out.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            out.add(node.name)
    return {name.lstrip("_") for name in out}


def _imports_mutants(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and "z3_mutants" in (node.module or ""):
            return True
        if isinstance(node, ast.ImportFrom | ast.Import) and any(
                "z3_mutants" in alias.name for alias in node.names):
            return True
    return False


def _branches_on_pieces(tree: ast.AST) -> list[str]:
    """``if`` statements and expressions whose test reads a rules or parts record."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If | ast.IfExp):
            names = _identifiers(node.test)
            if names & {"parts", "rules"}:
                found.append(ast.unparse(node.test))
    return found


def _problems(source: str) -> list[str]:
    tree = ast.parse(source)
    out = []
    if _imports_mutants(tree):
        out.append("imports z3_mutants")
    out += [f"names {name!r}" for name in sorted(_identifiers(tree) & _forbidden())]
    out += [f"branches on {test!r}" for test in _branches_on_pieces(tree)]
    return out


def _source(module: ModuleType) -> str:
    return inspect.getsource(module)


@pytest.mark.parametrize("module", NORMATIVE, ids=lambda m: m.__name__)
def test_the_normative_encoding_carries_no_mutant_switch(module: ModuleType) -> None:
    assert _problems(_source(module)) == []


def test_a_switch_carrying_encoding_is_flagged() -> None:
    """Negative control: the same checks on a source with a switch, a branch on it and
    an import of the mutants."""
    problems = _problems(SWITCHED)
    assert "imports z3_mutants" in problems
    assert "names 'band_no_cap'" in problems  # a mutant's name as a flag
    assert "names 'strict'" in problems  # a replacement piece's name as a flag
    assert any(p.startswith("branches on") for p in problems)


def _foreign_pieces(parts: z3_model.Parts) -> list[str]:
    """Fields of a pieces record whose value is not a function (or class) of the
    normative modules."""
    home = {m.__name__ for m in NORMATIVE}
    return [field for field, piece in attrs.asdict(parts, recurse=False).items()
            if not callable(piece) or getattr(piece, "__module__", None) not in home]


def test_the_spec_pieces_are_spec_functions() -> None:
    """No flag, string or number among the spec's pieces: each is a function (or the pool
    class) defined in the normative modules."""
    assert _foreign_pieces(z3_model.SPEC_PARTS) == []
    assert _foreign_pieces(SPEC_POOL_PARTS) == []


def test_every_mutant_replaces_a_piece_with_its_own() -> None:
    """A mutant differs from the spec in pieces defined in the mutant module only, so its
    formulas are the spec builders' with that piece swapped (negative control: each mutant
    record is flagged by the check the spec record passes)."""
    for mutant in z3_mutants.ENCODED_MUTANTS:
        foreign = _foreign_pieces(mutant.variant.parts)
        assert foreign, mutant.name
        for field in foreign:
            piece = getattr(mutant.variant.parts, field)
            assert piece.__module__ == z3_mutants.__name__, (mutant.name, field)


def test_the_mutant_table_pairs_each_mutant_with_a_lemma() -> None:
    names = [m.name for m in z3_mutants.ENCODED_MUTANTS]
    assert len(names) == len(set(names))
    lemmas = {lemma.name: lemma for lemma in (*PARAM_LEMMAS, *BAND_LEMMAS)}
    for mutant in z3_mutants.ENCODED_MUTANTS:
        assert mutant.lemmas, mutant.name
        for name in mutant.lemmas:
            assert mutant.variant in lemmas[name].mutants, (mutant.name, name)
    assert all(lemma.mutants for lemma in lemmas.values())
    with pytest.raises(KeyError, match="unknown encoded mutant 'no_such'"):
        z3_mutants.by_name("no_such")
