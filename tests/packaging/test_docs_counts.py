"""README.md's table of tie-break and hash defaults equals the defaults of the code.

The table names the defaults of the core's ``Config``, the verl adapter's
``parse_options`` and ``affinity serve``'s options. (The counts the READMEs state are
rendered from their data files: tests/packaging/test_rendered_docs.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

from affinity_verl.options import parse_options
from affinity_vllm.options import RouterOptions

from affinity_engine import Config

ROOT = Path(__file__).resolve().parents[2]


def _text(rel: str) -> str:
    return (ROOT / rel).read_text(encoding="utf-8")


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
