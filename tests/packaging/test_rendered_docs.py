"""Every number the READMEs state is rendered from its data file, and committed as rendered.

``scripts/render_docs.py`` fills each ``<!-- render:NAME -->...<!-- /render -->`` region
from the verify record, the vectors' manifest, the benchmark record, the simulator's run
records and the audit catalogue, and writes ``docs/requirement-ids.md`` from SPEC.md. A
data file re-recorded without re-rendering, or a number edited by hand inside a region,
fails here (fix: ``python scripts/render_docs.py``).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _render_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_docs", ROOT / "scripts" /
                                                  "render_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


render_docs = _render_docs()


def test_every_rendered_file_is_committed_as_rendered() -> None:
    assert render_docs.check() == []


def test_every_file_with_a_region_is_in_the_rendered_list() -> None:
    # a region in a file the script does not list would never be checked
    listed = set(render_docs.RENDERED)
    docs = [p for p in ROOT.rglob("*.md")
            if not any(part.startswith(".") or part == "node_modules" for part in p.parts)]
    with_regions = {p.relative_to(ROOT).as_posix() for p in docs
                    if render_docs.REGION.search(p.read_text(encoding="utf-8"))}
    assert with_regions <= listed, sorted(with_regions - listed)


def test_a_number_edited_by_hand_is_found() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    region = re.search(r"<!-- render:vectors\.total -->(.*?)<!-- /render -->", text)
    assert region, "README.md no longer renders the vector total"
    edited = text.replace(region.group(0),
                          "<!-- render:vectors.total -->999 portable cases<!-- /render -->")
    assert render_docs.render_text(edited) == text


def test_an_unknown_region_is_an_error_naming_it() -> None:
    with pytest.raises(render_docs.RenderError, match=r"'no\.such'"):
        render_docs.render_text("a <!-- render:no.such -->1<!-- /render --> b", "x.md")


def test_requirement_ids_lists_every_id_spec_defines_once() -> None:
    spec = (ROOT / "spec" / "SPEC.md").read_text(encoding="utf-8")
    defined = re.findall(r"^[ \t]*[-*][ \t]+\*\*(R-[A-Z]+-[0-9]+)\*\*", spec, re.M)
    listed = re.findall(r"^- (R-[A-Z]+-[0-9]+) ", render_docs.requirement_ids(), re.M)
    assert listed == defined


def test_every_vector_suite_has_a_rendered_row() -> None:
    # a suite added to the manifest needs its own row, or its count is rendered nowhere
    readme = (ROOT / "spec" / "vectors" / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)` \| <!-- render:vectors\.suite\.(\w+) -->", readme, re.M)
    assert all(a == b for a, b in rows)
    manifest = render_docs._json("spec/vectors/MANIFEST.json")
    assert sorted(a for a, _ in rows) == sorted(manifest["suites"])


def test_the_referees_simulated_column_equals_its_records() -> None:
    # checked on its own, so another file's staleness cannot hide it
    rel = "docs/verl-routing.md"
    text = (ROOT / rel).read_text(encoding="utf-8")
    assert render_docs.render_text(text, rel) == text
    assert "not yet simulated" not in text
    # negative control: a number edited by hand in a cell is rewritten from the records
    cell = re.search(r"(<!-- render:verl-routing\.column\.7613 -->)(.*?)(<!-- /render -->)", text)
    assert cell, "docs/verl-routing.md no longer renders #7613's cell"
    edited = text.replace(cell.group(0), cell.group(1) + "-9.9% [-9.9, -9.9]" + cell.group(3))
    assert render_docs.render_text(edited, rel) == text
