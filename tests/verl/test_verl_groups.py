"""Group pins through the verl adapter and the runtime driver (SPEC §7.6, in-process).

``acquire_server(request_id, request_group_id=None)`` is PR #6122's call shape; verl
0.9.1's ``acquire_server(request_id)`` keeps routing exactly as before. The group options
are validated at construction; under ``full_determinism`` with ``hash_mode="caller"`` the
caller's hash is taken of the placement key, the group id (R-GRP-6); the decision log
carries each acquire's group and a warm restart brings the group pins back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from affinity_verl import AffinityLoadBalancer
from affinity_verl.options import OptionError, parse_options

from affinity_conformance.decision_log import read_log
from affinity_conformance.log_replay import replay_files
from affinity_engine import Config
from affinity_runtime.decision_log import DecisionLogWriter
from affinity_runtime.driver import RoutingDriver

SERVERS = ["s0", "s1", "s2"]
GROUP_KEYS = {"group_stickiness", "group_entries", "group_kept", "group_broken"}


def _balancer(**options: Any) -> AffinityLoadBalancer:
    return AffinityLoadBalancer(dict.fromkeys(SERVERS), tie_break="first", **options)


def test_without_group_stickiness_a_group_id_changes_nothing() -> None:
    plain, sent = _balancer(affinity_break_margin=0), _balancer(affinity_break_margin=0)
    for i in range(12):
        a = plain.acquire_server(f"r{i}")
        b = sent.acquire_server(f"r{i}", request_group_id="g")  # ignored with "off"
        assert a == b, i
    assert plain.get_status() == sent.get_status()
    assert not GROUP_KEYS & set(plain.get_status())
    assert "cleared_groups" not in plain.clear_sticky_cache()


def test_fallback_places_siblings_together_and_reports_the_group_fields() -> None:
    lb = _balancer(group_stickiness="fallback")
    placed = {lb.acquire_server(f"r{i}", request_group_id="uid-1")[0] for i in range(4)}
    assert placed == {"s0"}
    other, _ = lb.acquire_server("x0", request_group_id="uid-2")
    assert other == "s1"  # a new group is placed least-loaded
    assert lb.acquire_server("r1", request_group_id="uid-1")[0] == "s0"  # its own pin
    status = lb.get_status()
    assert status["group_stickiness"] == "fallback"
    assert (status["group_entries"], status["group_kept"], status["group_broken"]) == (2, 3, 0)
    assert status["affinity_kept"] == 1
    cleared = lb.clear_sticky_cache()
    assert cleared["cleared_groups"] == 2 and cleared["cleared_entries"] == 5
    assert lb.get_status()["group_entries"] == 0


def test_group_break_margin_moves_a_group_off_a_busy_server() -> None:
    lb = _balancer(group_stickiness="fallback", group_break_margin=0)
    servers = [lb.acquire_server(f"r{i}", request_group_id="g")[0] for i in range(4)]
    # r0 new on s0; r1 and r2 find the pin one above the least load and move it
    # (broken); r3 finds every server at one, so the pin on s2 is kept
    assert servers == ["s0", "s1", "s2", "s2"]
    status = lb.get_status()
    assert (status["group_kept"], status["group_broken"]) == (1, 2)


def test_only_is_pr_6122_a_group_pin_is_never_reconsidered() -> None:
    lb = _balancer(group_stickiness="only", max_group_cache_size=4)
    for i in range(6):
        assert lb.acquire_server(f"r{i}", request_group_id="g")[0] == "s0"
    status = lb.get_status()
    assert status["sticky_entries"] == 0  # "only" writes no per-request entry
    assert (status["group_kept"], status["group_entries"]) == (5, 1)
    # a request without a group routes by its own pin, as before
    assert lb.acquire_server("solo")[0] == "s1"
    assert lb.get_status()["sticky_entries"] == 1


@pytest.mark.parametrize("bad", ["", 5, "\ud800"])
def test_a_malformed_group_id_is_refused_and_changes_nothing(bad: object) -> None:
    lb = _balancer(group_stickiness="fallback")
    before = lb.get_status()
    with pytest.raises(ValueError, match=r"request_group_id=.*group_id must be a non-empty"):
        lb.acquire_server("r0", request_group_id=bad)  # type: ignore[arg-type]
    assert lb.get_status() == before


@pytest.mark.parametrize(("options", "expected"), [
    ({"group_stickiness": "sometimes"},
     "group_stickiness must be one of 'off', 'fallback', 'only', got 'sometimes'"),
    ({"group_stickiness": "fallback", "group_break_margin": -1},
     "group_break_margin must be null or an integer >= 0, got -1"),
    ({"group_break_margin": 2}, "group_break_margin applies to group pins"),
    ({"group_stickiness": "only", "max_group_cache_size": 0},
     "max_group_cache_size must be an integer >= 1, got 0"),
    ({"group_stickiness": "only", "max_group_cache_size": True},
     "max_group_cache_size must be an integer >= 1, got True"),
])
def test_bad_group_options_fail_at_construction_naming_value_and_range(
        options: dict[str, Any], expected: str) -> None:
    with pytest.raises(OptionError, match="^AffinityLoadBalancer: .*" + _escaped(expected)):
        AffinityLoadBalancer(dict.fromkeys(SERVERS), **options)
    yaml = {"router_class": "x", "full_determinism": False, **options}
    with pytest.raises(OptionError, match=_escaped(expected)):
        parse_options(yaml, source="router.yaml", environ={})


def test_router_yaml_accepts_the_group_options() -> None:
    parsed = parse_options({"router_class": "x", "full_determinism": False,
                            "group_stickiness": "fallback", "group_break_margin": 1,
                            "max_group_cache_size": 64}, source="router.yaml", environ={})
    config = parsed.config
    assert (config.group_stickiness.value, config.group_break_margin,
            config.max_group_cache_size) == ("fallback", 1, 64)


def _escaped(text: str) -> str:
    import re
    return re.escape(text)


def test_caller_hash_mode_hashes_the_group_id_of_a_grouped_acquire() -> None:
    hashed: list[str] = []

    def request_hash(key: str) -> int:
        hashed.append(key)
        return {"g": 2, "r9": 1}.get(key, 0)

    config = Config(full_determinism=True, hash_mode="caller", group_stickiness="fallback")
    driver = RoutingDriver(config, SERVERS, draw=lambda _t: 0, request_hash=request_hash)
    for i in range(3):
        outcome = driver.acquire(f"r{i}", group_id="g")
        assert outcome.server_id == "s2", outcome  # type: ignore[union-attr]
    # the negative control: an acquire without a group hashes its request id
    assert driver.acquire("r9").server_id == "s1"  # type: ignore[union-attr]
    assert hashed == ["g", "g", "g", "r9"]
    # with groups off the group id is never the placement key
    off = RoutingDriver(Config(full_determinism=True, hash_mode="caller"), SERVERS,
                        draw=lambda _t: 0, request_hash=request_hash)
    hashed.clear()
    off.acquire("r9", group_id="g")
    assert hashed == ["r9"]


def test_the_decision_log_carries_group_ids_and_a_warm_restart_keeps_group_pins(
        tmp_path: Path) -> None:
    path = tmp_path / "lb.ndjson"
    options: dict[str, Any] = {"group_stickiness": "fallback", "group_break_margin": 1,
                               "lease_accounting": True, "decision_log": str(path)}
    first = _balancer(**options)
    pins = {}
    for group in ("ga", "gb", "gc", "gd"):
        for i in range(2):
            server, _ = first.acquire_server(f"{group}-{i}", request_group_id=group)
            pins[group] = server
    before = first.get_status()
    files = first.decision_log_files()
    first._driver.close()  # (the actor's end, without Ray)
    records = [r.data for r in read_log(files[-1]) if not r.is_header]
    grouped = [r["event"].get("group_id") for r in records if r["event"]["op"] == "acquire"]
    assert grouped == ["ga", "ga", "gb", "gb", "gc", "gc", "gd", "gd"], json.dumps(records[0])

    second = _balancer(**options)
    status = second.get_status()
    assert status["group_entries"] == before["group_entries"] == 4
    assert (status["group_kept"], status["group_broken"]) == (
        before["group_kept"], before["group_broken"])
    assert status["total_inflight"] == 0  # the dead run's requests were abandoned
    for group, server in pins.items():  # a new sibling joins its group's pin
        assert second.acquire_server(f"{group}-new", request_group_id=group)[0] == server
        second.release_server(server, f"{group}-new")
    assert second.get_status()["group_kept"] == before["group_kept"] + 4
    files = second.decision_log_files()
    second._driver.close()
    results = replay_files(files)  # the two runs replay clean against the core
    assert len(results) == 2
    assert all(r.divergence is None and r.truncated is None for r in results)


def test_the_driver_leaves_group_ids_out_when_group_stickiness_is_off(
        tmp_path: Path) -> None:
    def driver(config: Config, name: str) -> RoutingDriver:
        made = RoutingDriver(config, SERVERS, draw=lambda _t: 0)
        made.attach_log(DecisionLogWriter(tmp_path / name), configured=SERVERS)
        return made

    off = driver(Config(), "off.ndjson")
    on = driver(Config(group_stickiness="fallback"), "on.ndjson")
    for made in (off, on):
        for i in range(3):
            made.acquire(f"r{i}", group_id="g")
        made.close()

    def logged_groups(name: str) -> list[object]:
        return [r.data["event"].get("group_id") for r in read_log(tmp_path / name)
                if not r.is_header and r.data["event"]["op"] == "acquire"]

    assert logged_groups("off.ndjson") == [None, None, None]
    assert logged_groups("on.ndjson") == ["g", "g", "g"]
    assert off.state.groups.kept == 0 and on.state.groups.kept == 2
