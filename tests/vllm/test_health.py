"""Backend health: 5xx runs eject, active checks bring a backend back after its
back-off, a slow backend is not ejected, /health and /status tell the truth, and counts
stay exact through ejection and return with requests in flight."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from affinity_vllm.health import (
    TRANSITIONS,
    BackendHealth,
    Health,
    HealthPolicy,
    PoolChange,
    Signal,
)
from affinity_vllm.routing import Lease, RoutingTable

from affinity_engine import Config

from .fleet import assert_replays, fleet, run, settle, wait_until


def test_transition_table_is_total_and_only_up_routes() -> None:
    assert set(TRANSITIONS) == {(h, s) for h in Health for s in Signal}
    for (state, signal), (target, change) in TRANSITIONS.items():
        # the pool changes exactly when routability does
        entering = state is not Health.UP and target is Health.UP
        leaving = state is Health.UP and target is not Health.UP
        assert (change is PoolChange.ADD) == entering, (state, signal)
        assert (change is PoolChange.REMOVE) == leaving, (state, signal)


def test_back_off_doubles_up_to_the_cap_and_is_forgiven_after_a_quiet_spell() -> None:
    health = BackendHealth(HealthPolicy(eject_5xx=2, ejection_base=1.0, ejection_max=4.0))
    now = 100.0
    backoffs = []
    for _ in range(4):
        assert health.response(500, now, True) is PoolChange.NONE
        assert health.response(500, now, True) is PoolChange.REMOVE
        backoffs.append(health.backoff())
        assert health.probe(True, now + health.backoff() - 0.01) is PoolChange.NONE  # early
        now += health.backoff()
        assert health.probe(True, now) is PoolChange.ADD
    assert backoffs == [1.0, 2.0, 4.0, 4.0]
    assert health.response(200, now, True) is PoolChange.NONE
    health.response(500, now, True)
    assert health.response(500, now, False) is PoolChange.NONE  # never the last routable
    now += 10.0  # up for longer than ejection_max: the run of ejections is forgiven
    assert health.response(500, now, True) is PoolChange.REMOVE
    assert health.backoff() == 1.0


def test_one_backend_answering_500_costs_under_one_percent_of_1000_requests(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        async with fleet(2, decision_log=str(tmp_path / "log.ndjson"), health_interval=0.05,
                         ejection_base=0.1) as f:
            broken = f.stubs[0]
            await broken.set_fault("error")
            client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16))
            ok = 0

            async def one(i: int) -> None:
                nonlocal ok
                body = {"model": "tiny", "prompt": "p", "max_tokens": 1}
                async with client.post(f.url + "/v1/completions", json=body,
                                       headers={"x-session-id": f"s{i % 50}"}) as resp:
                    await resp.read()
                    ok += resp.status == 200

            try:
                for start in range(0, 1000, 50):
                    await asyncio.gather(*(one(i) for i in range(start, start + 50)))
            finally:
                await client.close()
            assert ok >= 990, ok
            metrics = f.router.metrics
            assert metrics.backend_errors.get(broken.url, "5xx") >= 5
            assert metrics.retries.get() >= 5
            assert f.router.table.pool_changes["removed"] >= 1  # ejected ...
            await wait_until(lambda: f.router.table.pool_changes["added"] >= 1,
                             timeout=2.0, what="return")  # ... and brought back by checks
            await settle(f, timeout=2.0)
            f.assert_idle()
        assert_replays(tmp_path / "log.ndjson")
    run(scenario(), timeout=60)
    done = subprocess.run([sys.executable, "-m", "affinity_cli.main", "replay",
                           str(tmp_path / "log.ndjson")], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr  # the command itself accepts it


def test_ejection_and_return_with_requests_in_flight_keep_counts_exact(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        async with fleet(2, decision_log=str(tmp_path / "log.ndjson"), tie_break="first",
                         ejection_base=0.05, stub={"delay": 0.6}) as f:
            a, b = f.router.table.servers
            old = [asyncio.create_task(f.complete(f"k{i}")) for i in range(4)]
            await wait_until(lambda: f.router.table.open_requests[a] == 2, what="in flight")
            for _ in range(5):  # five 5xx answers in a row eject a
                f.router.report(a, "5xx", 503)
            assert not f.router.table.is_active(a)
            status = await f.get_json("/status")
            assert status["backends"][a]["open_requests"] == 2  # still running there
            assert status["backends"][a]["health"] == "ejected"
            assert status["backends"][a]["inflight"] == 2  # not 0: still running there
            assert f.router.table.inflight(a) == 0  # the core's load: out of the pool
            await asyncio.sleep(0.06)
            await f.router.monitor.check_health()  # past the back-off: back in the pool
            assert f.router.table.is_active(a)
            fresh = asyncio.create_task(f.complete("fresh"))
            await wait_until(lambda: f.router.table.inflight(a) == 1, what="fresh request")
            await asyncio.gather(*old)  # their releases are stale, the fresh count survives
            assert f.router.table.inflight(a) == 1
            assert f.router.table.state.leases.stale_leases == 2
            await fresh
            await settle(f, timeout=2.0)
            f.assert_idle()
            assert f.router.table.open_requests == {a: 0, b: 0}
        assert_replays(tmp_path / "log.ndjson")
    run(scenario())


def _drive_health_model(seed: int, lease_accounting: bool) -> None:
    """Model check: the core's in-flight count of a pooled backend equals the leases taken
    since it last (re-)entered the pool and not yet released; open_requests counts all.
    Releases of one (key, backend) pair come in acquire order, the lease book's stated
    precondition (a release cannot name the turn it ends)."""
    rng = random.Random(seed)
    servers = ("a", "b", "c")
    table = RoutingTable(Config(affinity_break_margin=1, lease_accounting=lease_accounting),
                         servers, seed=seed)
    health = {s: BackendHealth(HealthPolicy(eject_5xx=2, ejection_base=1.0)) for s in servers}
    open_leases: list[tuple[Lease, int]] = []
    epoch = dict.fromkeys(servers, 0)
    now = 0.0
    for _ in range(600):
        now += rng.uniform(0, 0.5)
        op = rng.random()
        sid = rng.choice(servers)
        if op < 0.4:
            lease = table.acquire(rng.choice([None, "s1", "s2", "s3", "s4"]))
            if isinstance(lease, Lease):
                open_leases.append((lease, epoch[lease.server_id]))
        elif op < 0.75 and open_leases:
            picked, _ = open_leases[rng.randrange(len(open_leases))]
            index = next(i for i, (lease, _) in enumerate(open_leases)
                         if (lease.server_id, lease.request_id)
                         == (picked.server_id, picked.request_id))  # the pair's oldest
            lease, _ = open_leases.pop(index)
            table.release(lease)
        elif op < 0.9:
            others = any(s != sid for s in table.active)
            change = health[sid].response(500 if rng.random() < 0.7 else 200, now, others)
            if change is PoolChange.REMOVE:
                assert table.remove(sid)
        else:
            change = health[sid].probe(rng.random() < 0.8, now)
            if change is PoolChange.ADD:
                assert table.add(sid)
                epoch[sid] += 1
            elif change is PoolChange.REMOVE:
                assert table.remove(sid)
        for s in servers:
            assert table.is_active(s) == (health[s].state is Health.UP)
            current = sum(1 for lease, e in open_leases if lease.server_id == s
                          and e == epoch[s])
            if table.is_active(s):
                assert table.inflight(s) == current, (s, table.inflight(s), current)
            assert table.open_requests[s] == sum(1 for lease, _ in open_leases
                                                 if lease.server_id == s)
    for lease, _ in open_leases:
        table.release(lease)
    assert table.state.inflight_total == 0 and table.open_leases() == 0


@pytest.mark.parametrize("seed", range(3))
def test_random_ejections_and_returns_keep_core_counts_equal_to_open_leases(seed: int) -> None:
    _drive_health_model(seed, lease_accounting=True)


def test_negative_control_without_lease_accounting_the_model_check_fails() -> None:
    """verl's release-by-server: a late release after an ejection and return undercounts
    the fresh stay, and the same model check catches it."""
    with pytest.raises(AssertionError):
        _drive_health_model(0, lease_accounting=False)


def test_slow_backend_times_out_requests_but_is_never_ejected() -> None:
    async def scenario() -> None:
        async with fleet(2, upstream_timeout=0.2, health_interval=0.05,
                         stub={"slow_seconds": 1.0}) as f:
            slow = f.stubs[0]
            await slow.set_fault("slow")
            home = None
            for _ in range(6):
                reply = await f.complete("pinned")
                home = home or reply.backend
                if reply.backend == slow.url:
                    assert reply.status == 504, reply.body
            await asyncio.sleep(0.3)  # several passing health rounds
            assert f.router.table.is_active(slow.url)
            assert f.router.table.pool_changes == {"added": 0, "removed": 0}
            assert f.router.health[slow.url].state.value == "up"
            await slow.set_fault("none")
            await settle(f, timeout=2.0)
            f.assert_idle()
    run(scenario())


def test_health_is_false_soon_after_every_backend_went_down() -> None:
    async def scenario() -> None:
        async with fleet(2, health_interval=0.05, health_timeout=0.2) as f:
            async with f.client.get(f.url + "/health") as resp:
                assert resp.status == 200
            for stub in f.stubs:
                await stub.set_fault("refuse")

            async def health() -> int:
                async with f.client.get(f.url + "/health") as resp:
                    return resp.status

            deadline = asyncio.get_running_loop().time() + 1.0
            while await health() != 503:
                assert asyncio.get_running_loop().time() < deadline, "still healthy"
                await asyncio.sleep(0.02)
            body = await f.get_json("/health")
            # Health checks alone never empty the pool: one backend stays routable (its
            # requests' connect errors would still eject it), but /health tells the truth.
            assert body == {"status": "no_backends", "active_backends": 1,
                            "healthy_backends": 0}
    run(scenario())


def test_no_retry_and_eject_5xx_0_leave_failed_requests_as_plain_releases() -> None:
    async def scenario() -> None:
        async with fleet(2, retry=False, eject_5xx=0) as f:
            broken = f.stubs[0]
            await broken.set_fault("error")
            replies = [await f.complete(None) for _ in range(12)]
            failed = [r for r in replies if r.backend == broken.url]
            assert failed and all(r.status == 500 for r in failed)  # relayed, not retried
            assert f.router.metrics.retries.get() == 0
            assert f.router.table.is_active(broken.url)  # never ejected for 5xx
            assert f.router.table.pool_changes == {"added": 0, "removed": 0}
            f.assert_idle()
    run(scenario())
