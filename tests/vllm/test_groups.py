"""Group pins through ``affinity serve`` on stub backends (SPEC §7.6, fast tier).

A request's group comes from ``--group-header`` (default x-group-id), else
``--group-body-field``, read only with ``--group-stickiness fallback`` or ``only``. A
malformed group id is a 400 naming where it came from, as a malformed session key is;
/status and /metrics report the core's group counters.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from affinity_vllm.cli import options_from_args
from affinity_vllm.options import OptionsError, RouterOptions

from affinity_cli.main import build_parser

from .fleet import Fleet, Reply, fleet, run


async def _grouped(f: Fleet, session: str, group: str | None, **fields: object) -> Reply:
    headers = {} if group is None else {"x-group-id": group}
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 4, **fields}
    return await f.post("/v1/completions", body, session, headers)


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_fallback_puts_a_groups_sessions_on_one_backend() -> None:
    async def scenario() -> None:
        async with fleet(3, group_stickiness="fallback", tie_break="first") as f:
            replies = [await _grouped(f, f"s{i}", "prompt-7") for i in range(4)]
            assert [r.path for r in replies] == ["new", *["group_kept"] * 3]
            assert len({r.backend for r in replies}) == 1
            again = await _grouped(f, "s2", "prompt-7")  # its own pin first
            assert again.path == "kept" and again.backend == replies[0].backend
            status = await f.get_json("/status")
            assert status["group_stickiness"] == "fallback"
            assert (status["group_entries"], status["group_kept"],
                    status["group_broken"]) == (1, 3, 0)
            assert status["decisions"] == {"new": 1, "group_kept": 3, "kept": 1}
            text = await f.metrics_text()
            assert _metric(text, "affinity_router_group_kept_total") == 3
            assert _metric(text, "affinity_router_group_broken_total") == 0
            assert 'affinity_router_decisions_total{outcome="group_kept"} 3' in text
            f.assert_idle()
    run(scenario())


def test_group_break_margin_moves_a_busy_groups_pin() -> None:
    async def scenario() -> None:
        # All four are in flight together, so each acquire sees the others' counts:
        # new on A; B and C each find the pin one above the least load (broken); the
        # last finds every backend at one and keeps the pin.
        async with fleet(3, stub={"delay": 0.3}, group_stickiness="fallback",
                         group_break_margin=0) as f:
            replies = []
            for i in range(4):
                replies.append(asyncio.create_task(_grouped(f, f"s{i}", "g")))
                await asyncio.sleep(0.03)
            done = await asyncio.gather(*replies)
            assert sorted(str(r.path) for r in done) == sorted(
                ["new", "group_broken", "group_broken", "group_kept"])
            status = await f.get_json("/status")
            assert (status["group_kept"], status["group_broken"]) == (1, 2)
            text = await f.metrics_text()
            assert _metric(text, "affinity_router_group_broken_total") == 2
    run(scenario())


def test_group_from_the_body_field_and_only_mode() -> None:
    async def scenario() -> None:
        async with fleet(2, group_stickiness="only", group_body_field="uid",
                         tie_break="first") as f:
            a = await _grouped(f, "s0", None, uid="u-1")
            b = await _grouped(f, "s1", None, uid="u-1")
            c = await _grouped(f, "s0", None, uid="u-1")  # "only": its own pin unread
            assert (a.path, b.path, c.path) == ("new", "group_kept", "group_kept")
            assert a.backend == b.backend == c.backend
            status = await f.get_json("/status")
            assert status["sticky_entries"] == 0 and status["group_entries"] == 1
            plain = await _grouped(f, "solo", None)  # no group: its own pin, as before
            assert plain.path == "new"
            assert (await f.get_json("/status"))["sticky_entries"] == 1
    run(scenario())


def test_without_group_stickiness_the_group_header_is_not_read() -> None:
    async def scenario() -> None:
        async with fleet(2, tie_break="first") as f:
            replies = [await _grouped(f, f"s{i}", "g") for i in range(2)]
            assert [r.path for r in replies] == ["new", "new"]
            assert replies[0].backend == replies[1].backend  # both idle: first in order
            status = await f.get_json("/status")
            assert "group_kept" not in status and "group_entries" not in status
            assert "group_kept_total" not in await f.metrics_text()
    run(scenario())


def test_a_malformed_group_id_is_a_400_with_a_message() -> None:
    async def scenario() -> None:
        async with fleet(1, group_stickiness="fallback", group_body_field="uid") as f:
            for fields, expected in (
                    ({"uid": ["a"]}, "group id in body field 'uid' must be a string or an "
                                     "integer, got list"),
                    ({"uid": "\ud800"}, "group id in body field 'uid' is not valid Unicode"),
                    ({"uid": "x" * 1025}, "group id in body field 'uid' is 1025 characters; "
                                          "the limit is 1024")):
                reply = await _grouped(f, "s", None, **fields)
                assert reply.status == 400, reply.body
                assert expected in reply.body["error"]["message"], reply.body
            long_header = await _grouped(f, "s", "y" * 2000)
            assert long_header.status == 400
            assert "group id in header x-group-id is 2000 characters" in \
                long_header.body["error"]["message"]
            assert f.router.table.decisions == {}  # nothing was routed
            ok = await _grouped(f, "s", None, uid=17)  # an integer is a group id, as a key
            assert ok.status == 200 and ok.path == "new"
            f.assert_idle()
    run(scenario())


def test_group_options_are_checked_naming_value_and_range() -> None:
    base = ("http://127.0.0.1:9",)
    with pytest.raises(OptionsError, match="--group-break-margin applies to group pins"):
        RouterOptions(backends=base, group_break_margin=1)
    with pytest.raises(OptionsError, match="--group-stickiness must be one of 'off', "
                       "'fallback', 'only', got 'sometimes'"):
        RouterOptions(backends=base, group_stickiness="sometimes")
    with pytest.raises(OptionsError, match=r"max_group_cache_size must be an integer in "
                       r"\[1, 1000000000\], got 0"):
        RouterOptions(backends=base, group_stickiness="only", max_group_cache_size=0)
    with pytest.raises(OptionsError, match="group_stickiness 'off' never reads"):
        RouterOptions(backends=base, group_body_field="uid")
    with pytest.raises(OptionsError, match="group_header must be an HTTP header name"):
        RouterOptions(backends=base, group_stickiness="only", group_header="bad header")
    args = build_parser(["serve"]).parse_args(
        ["serve", "--backend", base[0], "--group-stickiness", "fallback",
         "--group-break-margin", "2", "--max-group-cache-size", "64",
         "--group-header", "x-uid", "--group-body-field", "uid"])
    options = options_from_args(args)
    config = options.core_config()
    assert (config.group_stickiness.value, config.group_break_margin,
            config.max_group_cache_size) == ("fallback", 2, 64)
    assert (options.group_header, options.group_body_field) == ("x-uid", "uid")


def test_serve_help_lists_the_group_options() -> None:
    done = subprocess.run([sys.executable, "-m", "affinity_cli.main", "serve", "--help"],
                          capture_output=True, text=True, timeout=60, check=True)
    for flag in ("--group-stickiness {off,fallback,only}", "--group-break-margin N|none",
                 "--max-group-cache-size", "--group-header NAME", "--group-body-field NAME"):
        assert flag in done.stdout, flag
    bad = subprocess.run([sys.executable, "-m", "affinity_cli.main", "serve", "--backend",
                          "http://127.0.0.1:9", "--group-break-margin", "-1"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2
    assert "--group-break-margin must be null or an integer >= 0, got -1" in bad.stderr
