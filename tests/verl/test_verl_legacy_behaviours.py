"""verl's 15 legacy balancer behaviours (upstream-verl.md section 10), through the actor.

Each test builds ``ray.remote(AffinityLoadBalancer)`` with verl's defaults (margin None)
and drives it over Ray, as verl's ``tests/experimental/agent_loop/test_basic_agent_loop.py``
drives ``GlobalRequestLoadBalancer``; these are our own tests, written from the
reference. The three tie-dependent behaviours (T) run twice: with ``tie_break="first"``
they expect the literal server of Aug-2026 main (R-TIE-2); with the default ``"draw"``
(verl 0.9.1's random ties, R-TIE-3) they assert the tie-agnostic form.
"""

from __future__ import annotations

from typing import Any

import pytest
import ray
from affinity_verl import NO_SERVERS_MESSAGE
from affinity_verl.testing.driving import call

THREE = dict.fromkeys(["s0", "s1", "s2"])
TWO = dict.fromkeys(["s0", "s1"])
TIES = ["first", "draw"]


def _sid(handle: Any, request_id: str) -> str:
    server_id, _handle = call(handle, "acquire_server", request_id=request_id)
    assert isinstance(server_id, str)
    return server_id


def test_three_new_ids_cover_three_servers(make_balancer: Any) -> None:
    lb = make_balancer(servers=THREE)
    assert {_sid(lb, "a"), _sid(lb, "b"), _sid(lb, "c")} == set(THREE)  # R-ACQ-4


@pytest.mark.parametrize("tie_break", TIES)
def test_new_id_goes_to_the_idle_server(make_balancer: Any, tie_break: str) -> None:
    lb = make_balancer(servers=THREE, tie_break=tie_break)
    a = [_sid(lb, "a") for _ in range(3)]
    b = _sid(lb, "b")
    d = _sid(lb, "d")
    assert len(set(a)) == 1 and b != a[0]
    assert d == (set(THREE) - {a[0], b}).pop()  # the only server at load 0
    if tie_break == "first":
        assert (a[0], b, d) == ("s0", "s1", "s2")


def test_concurrent_requests_split_then_split_again(make_balancer: Any) -> None:
    lb = make_balancer(servers=TWO)
    r0, r1 = _sid(lb, "r0"), _sid(lb, "r1")
    assert r0 != r1
    call(lb, "release_server", server_id=r0)
    call(lb, "release_server", server_id=r1)
    assert _sid(lb, "r2") != _sid(lb, "r3")


def test_releasing_an_unknown_server_is_ignored(make_balancer: Any) -> None:
    lb = make_balancer(servers=TWO)
    _sid(lb, "a")
    before = call(lb, "get_status")
    assert call(lb, "release_server", server_id="no-such-server") is None  # R-RLS-1
    assert call(lb, "get_status") == before


def test_releasing_an_idle_server_is_ignored(make_balancer: Any) -> None:
    lb = make_balancer(servers=TWO)
    assert call(lb, "release_server", server_id="s0") is None  # clamp at 0, R-CONS-1
    assert call(lb, "get_inflight_count", "s0") == 0
    assert call(lb, "get_total_inflight") == 0


def test_acquire_release_acquire_keeps_the_server(make_balancer: Any) -> None:
    lb = make_balancer(servers=THREE)
    first = _sid(lb, "conv")
    call(lb, "release_server", server_id=first)
    assert _sid(lb, "conv") == first  # R-ACQ-2


def test_added_server_starts_idle(make_balancer: Any) -> None:
    lb = make_balancer(servers=TWO)
    _sid(lb, "a")
    call(lb, "add_servers", servers={"s9": "handle-9"})
    assert call(lb, "get_inflight_count", "s9") == 0
    assert call(lb, "get_status")["servers"]["s9"] == 0
    assert "s9" in call(lb, "get_all_servers")


def test_removed_server_leaves_status_and_handles(make_balancer: Any) -> None:
    lb = make_balancer(servers=TWO)
    call(lb, "remove_servers", server_ids=["s0"])
    status = call(lb, "get_status")
    assert "s0" not in status["servers"]
    assert status["registered_handles"] == ["s1"]  # R-POOL-3


def test_after_a_removal_requests_go_to_the_other_server(make_balancer: Any) -> None:
    lb = make_balancer(servers=TWO)
    call(lb, "remove_servers", server_ids=["s0"])
    assert {_sid(lb, f"r{i}") for i in range(4)} == {"s1"}


@pytest.mark.parametrize("tie_break", TIES)
def test_sticky_entry_on_a_removed_server_is_reselected(make_balancer: Any, tie_break: str) -> None:
    lb = make_balancer(servers=TWO, tie_break=tie_break)
    occupied = _sid(lb, "occupy-s0")
    sticky = _sid(lb, "sticky-req")
    assert sticky != occupied  # least-loaded
    call(lb, "remove_servers", server_ids=[sticky])
    assert _sid(lb, "sticky-req") == occupied  # R-ACQ-3: lazily invalidated, placed anew
    if tie_break == "first":
        assert (occupied, sticky) == ("s0", "s1")


def test_get_all_servers_excludes_removed(make_balancer: Any) -> None:
    lb = make_balancer(servers=THREE)
    call(lb, "remove_servers", server_ids=["s1", "unknown"])  # unknown ids are ignored
    assert call(lb, "get_all_servers") == ["s0", "s2"]


def test_all_servers_removed_raises_no_available_servers(make_balancer: Any) -> None:
    lb = make_balancer(servers=TWO)
    call(lb, "remove_servers", server_ids=["s0", "s1"])
    with pytest.raises(ray.exceptions.RayTaskError, match=NO_SERVERS_MESSAGE) as info:
        call(lb, "acquire_server", request_id="x")
    assert isinstance(info.value, RuntimeError)  # verl callers catch RuntimeError (R-ACQ-5)


def test_readded_server_is_used_again(make_balancer: Any) -> None:
    lb = make_balancer(servers=TWO)
    call(lb, "remove_servers", server_ids=["s0"])
    call(lb, "add_servers", servers={"s0": None})
    assert call(lb, "get_all_servers") == ["s1", "s0"]  # appended, R-POOL-1
    assert {_sid(lb, "x"), _sid(lb, "y")} == {"s0", "s1"}


@pytest.mark.parametrize("tie_break", TIES)
def test_inflight_count_follows_an_acquire(make_balancer: Any, tie_break: str) -> None:
    lb = make_balancer(servers=TWO, tie_break=tie_break)
    assert call(lb, "get_inflight_count", "s0") == 0
    chosen = _sid(lb, "r1")
    assert call(lb, "get_inflight_count", chosen) == 1
    assert call(lb, "get_inflight_count", "missing") == 0
    if tie_break == "first":
        assert chosen == "s0"


def test_status_of_a_fresh_balancer(make_balancer: Any) -> None:
    lb = make_balancer(servers=TWO)
    status = call(lb, "get_status")
    assert status["active_servers"] == 2
    assert status["total_inflight"] == 0
    assert status["servers"] == {"s0": 0, "s1": 0}
    assert status["registered_handles"] == ["s0", "s1"]
