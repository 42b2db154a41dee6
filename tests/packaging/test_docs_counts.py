"""The counts and defaults the READMEs state come from the code and the data.

* spec/vectors/README.md: the total and the per-suite table equal MANIFEST.json;
* README.md and docs/conformance.md state the same total;
* README.md's table of tie-break and hash defaults equals the defaults of the core's
  ``Config``, the verl adapter's ``parse_options`` and ``affinity serve``'s options.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from affinity_verl.options import parse_options
from affinity_vllm.options import RouterOptions

from affinity_engine import Config

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = json.loads((ROOT / "spec" / "vectors" / "MANIFEST.json").read_text(encoding="utf-8"))


def _text(rel: str) -> str:
    return (ROOT / rel).read_text(encoding="utf-8")


def test_vector_readme_counts_match_the_manifest() -> None:
    readme = _text("spec/vectors/README.md")
    total = re.search(r"\[`spec/SPEC.md`\]\(../SPEC.md\): (\d+) cases", readme)
    assert total and int(total.group(1)) == MANIFEST["cases"]
    table = dict(re.findall(r"^\| `(\w+)` \| (\d+) \|", readme, re.M))
    assert {k: int(v) for k, v in table.items()} == MANIFEST["suites"]


def test_other_docs_state_the_same_total() -> None:
    cases = MANIFEST["cases"]
    assert f"holds the {cases} portable cases" in " ".join(_text("README.md").split())
    assert f"| {cases} portable cases" in _text("docs/conformance.md")


def test_readme_defaults_table_matches_the_code() -> None:
    rows = dict((name.strip(), (tie, mode)) for name, tie, mode in re.findall(
        r"^\| ([^|]+) \| `(\w+)` \| `(\w+)` \|", _text("README.md"), re.M))
    core = Config()
    adapter = parse_options().config
    serve = RouterOptions(backends=("http://127.0.0.1:1",))
    assert rows["core `Config()`"] == (core.tie_break.value, core.hash_mode.value)
    assert rows["verl adapter `AffinityLoadBalancer`"] == (adapter.tie_break.value,
                                                          adapter.hash_mode.value)
    assert rows["`affinity serve`"] == (serve.tie_break, serve.hash_mode)
