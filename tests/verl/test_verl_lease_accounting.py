"""Lease accounting through the actor, side by side with verl 0.9.1's real class.

Each scenario runs on three actors: verl's ``GlobalRequestLoadBalancer``, ours with
verl's defaults (legacy release, R-LEASE-1), and ours with ``lease_accounting=True``. The
first two must agree exactly -- and show the count drift of upstream-verl.md section 6 --
while the lease balancer keeps every count equal to the requests really in flight
(R-LEASE-3..5). Pools are chosen so no placement depends on a tie.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import ray
from affinity_verl import AffinityLoadBalancer
from affinity_verl.testing.driving import call
from affinity_verl.testing.replicas import FakeReplica
from affinity_verl.testing.verl_client import VerlClientWorker

from affinity_conformance.upstream import load_upstream_balancer

VERL_KEYS = ("servers", "total_inflight", "active_servers", "registered_handles")


class Trio:
    """The same calls on upstream verl, ours (legacy) and ours (leases)."""

    def __init__(self, servers: list[str]) -> None:
        handles = dict.fromkeys(servers)
        upstream: Any = ray.remote(load_upstream_balancer()).options(num_cpus=0)
        ours: Any = ray.remote(AffinityLoadBalancer).options(num_cpus=0)
        self.upstream: Any = upstream.remote(servers=dict(handles))
        self.legacy: Any = ours.remote(servers=dict(handles))
        self.leases: Any = ours.remote(servers=dict(handles), lease_accounting=True)
        self.all: tuple[Any, ...] = (self.upstream, self.legacy, self.leases)

    def do(self, method: str, **kwargs: Any) -> list[Any]:
        return list(ray.get([getattr(a, method).remote(**kwargs) for a in self.all]))

    def verl_status(self) -> list[dict[str, Any]]:
        return [{k: s[k] for k in VERL_KEYS} for s in self.do("get_status")]

    def loads(self, server: str) -> list[int]:
        return self.do("get_inflight_count", server_id=server)


@pytest.fixture
def trio(ray_cluster: None) -> Iterator[Any]:
    made: list[Trio] = []

    def make(servers: list[str]) -> Trio:
        made.append(Trio(servers))
        return made[-1]

    yield make
    for t in made:
        for actor in t.all:
            ray.kill(actor)


def test_require_release_fields_switches_on_request_ids(trio: Any) -> None:
    t = trio(["s0"])
    assert t.do("require_release_fields") == [[], [], ["request_id"]]


def test_double_release_does_not_undercount(trio: Any) -> None:
    t = trio(["s0"])
    t.do("acquire_server", request_id="a")
    t.do("acquire_server", request_id="b")
    t.do("release_server", server_id="s0", request_id="a")
    t.do("release_server", server_id="s0", request_id="a")  # a duplicate
    upstream, legacy, leases = t.loads("s0")
    assert upstream == legacy == 0  # verl: b is still running but s0 looks idle
    assert leases == 1  # R-LEASE-3: the duplicate has no lease left
    assert call(t.leases, "get_status")["unknown_leases"] == 1  # R-LEASE-6


def test_late_release_after_remove_and_readd_keeps_the_fresh_count(trio: Any) -> None:
    t = trio(["s0"])
    t.do("acquire_server", request_id="old")
    t.do("remove_servers", server_ids=["s0"])
    t.do("add_servers", servers={"s0": None})  # a fresh stay for s0
    t.do("acquire_server", request_id="new")  # s0 is the only server
    t.do("release_server", server_id="s0", request_id="old")  # late, from before removal
    upstream, legacy, leases = t.loads("s0")
    assert upstream == legacy == 0  # drift: "new" is in flight but uncounted
    assert leases == 1  # R-LEASE-3: a stale lease moves no count
    status = call(t.leases, "get_status")
    assert (status["stale_leases"], status["unknown_leases"]) == (1, 0)

    t.do("add_servers", servers={"s1": None})
    # The consequence: verl sees two idle servers (a tie); leases see s0 busy.
    assert t.do("acquire_server", request_id="third")[2] == ("s1", None)
    t.do("release_server", server_id="s0", request_id="new")
    t.do("release_server", server_id="s1", request_id="third")
    assert t.do("get_total_inflight") == [0, 0, 0]
    statuses = t.verl_status()
    assert statuses[0]["registered_handles"] == statuses[1]["registered_handles"]


def test_unknown_lease_is_ignored_and_counted(trio: Any) -> None:
    t = trio(["s0"])
    t.do("acquire_server", request_id="a")
    t.do("release_server", server_id="s0", request_id="never-acquired")
    t.do("release_server", server_id="s0")  # no request id: no unkeyed lease either
    upstream, legacy, leases = t.loads("s0")
    assert upstream == legacy == 0
    assert leases == 1
    assert call(t.leases, "get_status")["unknown_leases"] == 2


def test_readding_an_active_server_keeps_its_count(trio: Any) -> None:
    t = trio(["s0"])
    t.do("acquire_server", request_id="a")
    t.do("add_servers", servers={"s0": "new-handle"})
    upstream, legacy, leases = t.loads("s0")
    assert upstream == legacy == 0  # R-POOL-2: verl resets a live count
    assert leases == 1  # R-LEASE-4
    assert t.do("acquire_server", request_id="a")[2] == ("s0", "new-handle")


def test_with_leases_off_every_step_matches_verl(trio: Any) -> None:
    t = trio(["s0"])  # one server at a time: no placement is a tie
    calls: list[tuple[str, dict[str, Any]]] = [
        ("acquire_server", {"request_id": "a"}),
        ("acquire_server", {"request_id": "a"}),
        ("release_server", {"server_id": "s0", "request_id": "zzz"}),  # id ignored
        ("release_server", {"server_id": "s9"}),
        ("remove_servers", {"server_ids": ["s0"]}),
        ("acquire_server", {"request_id": "a"}),  # raises on both
        ("add_servers", {"servers": {"s0": None}}),
        ("acquire_server", {"request_id": "a"}),
        ("add_servers", {"servers": {"s0": None}}),  # re-add resets
        ("release_server", {"server_id": "s0", "request_id": "a"}),
        ("clear_sticky_cache", {}),
    ]
    for method, kwargs in calls:
        refs = [getattr(actor, method).remote(**kwargs) for actor in (t.upstream, t.legacy)]
        results: list[tuple[Any, ...]] = []
        for ref in refs:
            try:
                results.append(("returned", ray.get(ref)))
            except ray.exceptions.RayTaskError as exc:
                results.append(("raised", type(exc.cause).__name__, str(exc.cause)))
        assert results[0] == results[1], method
        up_status, legacy_status, _ = t.verl_status()
        assert up_status == legacy_status, method


def test_verl_client_sends_request_ids_when_declared(ray_cluster: None) -> None:
    replicas = {name: FakeReplica.remote(name) for name in ("r0", "r1")}
    lb = ray.remote(AffinityLoadBalancer).options(num_cpus=0).remote(
        servers=replicas, lease_accounting=True)
    config = {"actor_rollout_ref": {"rollout": {"name": "vllm", "full_determinism": False}}}
    worker = VerlClientWorker.remote(config, lb)
    try:
        for session in ("a", "b", "c"):
            ray.get(worker.conversation.remote(session, 0, 3))
        assert ray.get(worker.barrier.remote()) == 0
        status = call(lb, "get_status")
        # Had verl's client released without the id, all 9 would be unknown leases.
        assert (status["unknown_leases"], status["stale_leases"]) == (0, 0)
        assert status["affinity_kept"] == 6
    finally:
        for actor in [worker, lb, *replicas.values()]:
            ray.kill(actor)


def test_late_release_of_the_same_id_across_a_readd(trio: Any) -> None:
    """R-LEASE-3: a key's leases settle oldest first, so the first turn's late release after a
    remove/re-add is stale and the second turn (same id, fresh stay) stays counted."""
    t = trio(["s0"])
    t.do("acquire_server", request_id="conv")  # first turn, stay 1
    t.do("remove_servers", server_ids=["s0"])
    t.do("add_servers", servers={"s0": None})
    t.do("acquire_server", request_id="conv")  # second turn of the same id, stay 2
    t.do("release_server", server_id="s0", request_id="conv")  # the first turn ends, late
    assert t.loads("s0")[2] == 1  # the second turn is still in flight
