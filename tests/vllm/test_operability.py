"""Operating ``affinity serve``: the access log, per-backend latency histograms,
``build_info``, metric names without stutter or ``_perc``, ``--log-level`` in any case."""

from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path

from affinity_vllm.access_log import session_hash

from affinity_cli.main import build_parser

from .fleet import fleet, run, settle


def test_access_log_has_one_line_per_request_without_the_raw_key(tmp_path: Path) -> None:
    path = tmp_path / "access.log"

    async def scenario() -> None:
        async with fleet(2, access_log=str(path)) as f:
            first = await f.complete("user-42@example.com")
            again = await f.complete("user-42@example.com")
            bad = await f.post("/v1/completions", b"{not json", "user-42@example.com")
            assert (first.status, again.status, bad.status) == (200, 200, 400)
            await settle(f)
            backend = first.backend

        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(lines) == 3
        one, two, three = lines
        assert one["backend"] == two["backend"] == backend
        assert (one["decision"], two["decision"]) == ("new", "kept")
        assert one["status"] == 200 and one["path"] == "/v1/completions"
        assert one["session"] == session_hash("user-42@example.com")
        assert "user-42" not in path.read_text()  # the key itself never reaches the file
        assert 0 < one["ttfb_ms"] <= one["duration_ms"]
        assert isinstance(one["ts"], int)
        assert three["status"] == 400 and three["backend"] is None
    run(scenario())


def test_latency_histograms_build_info_and_clean_metric_names() -> None:
    async def scenario() -> None:
        async with fleet(1) as f:
            for _ in range(3):
                assert (await f.complete("s")).status == 200
            await settle(f)
            text = await f.metrics_text()
            backend = f.stubs[0].url
        for name in ("request_duration_seconds", "time_to_first_byte_seconds"):
            count = re.search(rf'^affinity_router_{name}_count{{backend="{re.escape(backend)}"}}'
                              r" (\S+)$", text, re.M)
            assert count is not None and float(count.group(1)) == 3, name
            assert f'affinity_router_{name}_bucket{{backend="{backend}",le="+Inf"}} 3' in text
        version = metadata.version("affinity-routing")
        assert f'affinity_router_build_info{{version="{version}"}} 1' in text
        names = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
        assert "affinity_router_sticky_kept_total" in names
        assert not [n for n in names if n.startswith("affinity_router_affinity_")], names
        assert not [n for n in names if n.endswith("_perc")], names
    run(scenario())


def test_log_level_is_case_insensitive() -> None:
    for given in ("info", "Info", "INFO", "debug"):
        args = build_parser(["serve"]).parse_args(
            ["serve", "--backend", "http://127.0.0.1:1", "--log-level", given])
        assert args.log_level == given.upper()
