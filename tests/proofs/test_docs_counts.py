"""The counts README.md and proofs/README.md state about ``affinity verify`` equal the code's:
obligations (R-BAND-1..5 made them twenty), all-N lemmas, configuration table cases
(R-CFG-1..6), the independent audit's mutants. The mutant count verify prints at the
default scope needs a full run; it is stated with the run it was taken from."""

from __future__ import annotations

from pathlib import Path

from affinity_proofs import config_table
from affinity_proofs.report import OBLIGATIONS
from affinity_proofs.z3_band_lemmas import BAND_LEMMAS
from affinity_proofs.z3_param_lemmas import PARAM_LEMMAS

from tools.mutation_audit.catalogue import CATALOGUE

ROOT = Path(__file__).resolve().parents[2]
WORDS = {13: "thirteen", 19: "nineteen", 20: "twenty", 22: "twenty-two", 23: "twenty-three"}


def _text(path: str) -> str:
    return " ".join((ROOT / path).read_text(encoding="utf-8").split())


def test_obligation_count_in_both_readmes() -> None:
    count = len([o for o in OBLIGATIONS if o.number >= 1])
    word = WORDS[count]
    assert f"{word.capitalize()} obligations, each by the methods" in _text("README.md")
    assert f"`affinity verify` checks {word} obligations" in _text("proofs/README.md")


def test_all_n_lemma_count_and_rows() -> None:
    lemmas = (*PARAM_LEMMAS, *BAND_LEMMAS)
    text = _text("proofs/README.md")
    assert f"All {WORDS[len(lemmas)]} take about" in text
    for lemma in lemmas:
        assert f"| `{lemma.name}`" in text, lemma.name


def test_configuration_table_count() -> None:
    cases, problems = config_table.check_table()
    assert problems == []
    assert f"exhaustive table of {cases} edge values" in _text("README.md")
    assert f"exhaustive table of {cases} edge values" in _text("proofs/README.md")


def test_audit_catalogue_count() -> None:
    total = len(CATALOGUE)
    counted = sum(1 for m in CATALOGUE if m.equivalent is None)
    assert f"independent set of {total} one-line mutants" in _text("README.md")
    assert f"kills all {counted} non-equivalent" in _text("README.md")
    assert f"**{total} realistic one-line bugs**" in _text("proofs/README.md")
    for mutant in CATALOGUE:
        assert f"| `{mutant.id}` |" in _text("proofs/README.md"), mutant.id
