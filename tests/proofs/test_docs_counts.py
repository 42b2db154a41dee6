"""The recorded verify run the docs are rendered from is a run of the current suite.

README.md and proofs/README.md render their obligation table, all-N lemmas and counts from
``proofs/verify-default.json`` (``scripts/render_docs.py``). That record must be current:
its obligations are :data:`~affinity_proofs.report.OBLIGATIONS`, its all-N lemmas are the
suite's, its configuration table has the cases the table has now, and it passed. Adding an
obligation, a lemma or a table case without re-recording
(``affinity verify --json proofs/verify-default.json``) fails here. The independent audit's
record names every mutant of the catalogue.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from affinity_proofs import config_table
from affinity_proofs.report import OBLIGATIONS
from affinity_proofs.z3_all_n import ALL_N_LEMMAS

from tools.mutation_audit.catalogue import CATALOGUE

ROOT = Path(__file__).resolve().parents[2]


def _record() -> dict[str, Any]:
    with open(ROOT / "proofs" / "verify-default.json", encoding="utf-8") as handle:
        record: dict[str, Any] = json.load(handle)
    return record


def test_the_record_is_a_passing_default_run() -> None:
    record = _record()
    assert record["format"] == "affinity-verify-report/1"
    assert record["scope"] == "default" and record["only"] is None
    assert record["passed"] is True


def test_the_record_has_the_current_obligations() -> None:
    recorded = [(o["obligation"], o["title"]) for o in _record()["obligations"]]
    assert recorded == [(o.number, o.title) for o in OBLIGATIONS]


def test_the_record_has_the_current_all_n_lemmas() -> None:
    recorded = {r["evidence"]["lemma"] for r in _record()["rows"]
                if r["scope_kind"] == "all N" and "lemma" in r["evidence"]}
    assert recorded == {lemma.name for lemma in ALL_N_LEMMAS}


def test_the_record_has_the_current_configuration_table() -> None:
    cases, problems = config_table.check_table()
    assert problems == []
    row = next(r for r in _record()["rows"] if r["method"] == "exhaustive edge-value table")
    assert row["evidence"]["cases"] == cases


def test_the_audit_record_names_every_catalogue_mutant() -> None:
    text = (ROOT / "docs" / "records" / "2026-12-proofs-audit.md").read_text(encoding="utf-8")
    missing = [m.id for m in CATALOGUE if f"| `{m.id}` |" not in text]
    assert missing == []
