"""Backend faults: removal, retry, re-pinning, re-adding, and no leaked counts.

Each test ends with ``assert_idle``: every in-flight count and every lease is back to 0
after the fault.
"""

from __future__ import annotations

import asyncio
import json

from .fleet import Fleet, fleet, run, settle, wait_until


async def _pinned(f: Fleet, key: str) -> tuple[str, str]:
    """Pin ``key`` and return (its backend, the other backend)."""
    reply = await f.complete(key)
    assert reply.status == 200 and reply.backend is not None
    other = next(s for s in f.router.table.servers if s != reply.backend)
    return reply.backend, other


def test_refused_connection_removes_backend_retries_once_and_repins() -> None:
    async def scenario() -> None:
        async with fleet(2, health_interval=0.1, health_timeout=0.5, ejection_base=0.2) as f:
            home, other = await _pinned(f, "s")
            await f.stub_at(home).set_fault("refuse")  # health checks run every 0.1 s
            reply = await f.complete("s")
            assert reply.status == 200
            assert (reply.backend, reply.path) == (other, "reselected")
            assert reply.headers.get("x-affinity-retried") == "1"
            assert f.router.metrics.retries.get() == 1
            assert f.router.metrics.backend_errors.get(home, "refused") == 1
            assert not f.router.table.is_active(home)
            f.assert_idle()
            # The session is now pinned to the other backend and stays there.
            assert (await f.complete("s")).path == "kept"
            # The backend comes back: the health check re-adds it (an AddServers event).
            await f.stub_at(home).set_fault("none")
            await wait_until(lambda: f.router.table.is_active(home), what="re-add")
            assert f.router.table.pool_changes == {"added": 1, "removed": 1}
            again = await f.complete("s")
            assert (again.backend, again.path) == (other, "kept")
            f.assert_idle()
    run(scenario())


def test_hung_backend_times_out_and_only_the_health_check_removes_it() -> None:
    async def scenario() -> None:
        async with fleet(2, upstream_timeout=0.4, health_timeout=0.3) as f:
            home, other = await _pinned(f, "s")
            await f.stub_at(home).set_fault("hang")
            reply = await f.complete("s")
            # sent, then silence: no retry (the backend may be working on it), 504, and a
            # slow request is not a dead backend: no ejection
            assert reply.status == 504, reply.body
            assert "did not answer" in reply.body["error"]["message"]
            assert f.router.table.is_active(home)
            assert f.router.metrics.backend_errors.get(home, "timeout") == 1
            f.assert_idle()
            for _ in range(2):  # /health hangs too: 3 failed checks in a row remove it
                await f.router.monitor.check_health()
                assert f.router.table.is_active(home)
            await f.router.monitor.check_health()
            assert not f.router.table.is_active(home)
            moved = await f.complete("s")
            assert (moved.backend, moved.path) == (other, "reselected")
            await f.router.monitor.check_health()  # still hanging: stays out
            assert not f.router.table.is_active(home)
            await f.stub_at(home).set_fault("none")
            await f.router.monitor.check_health()  # 1 of the 2 passes it needs
            assert not f.router.table.is_active(home)
            await f.router.monitor.check_health()
            assert f.router.table.is_active(home)
            await settle(f)
            f.assert_idle()
    run(scenario())


def test_mid_stream_failure_ends_client_stream_with_error_event() -> None:
    async def scenario() -> None:
        async with fleet(2) as f:
            home, _ = await _pinned(f, "s")
            await f.stub_at(home).set_fault("die_mid_stream")
            body = {"model": "tiny", "prompt": "x", "max_tokens": 10, "stream": True}
            async with f.client.post(f.url + "/v1/completions", json=body,
                                     headers={"x-session-id": "s"}) as resp:
                assert resp.status == 200  # the stream had started
                text = (await resp.read()).decode()
            events = [e for e in text.split("\n\n") if e]
            assert "data: [DONE]" not in events
            assert len(events) == 3  # two relayed chunks, then the error event
            error = json.loads(events[-1][len("data: "):])["error"]
            assert error["type"] == "upstream_error" and home in error["message"]
            assert "mid-stream" in error["message"]
            assert f.router.metrics.backend_errors.get(home, "mid_stream") == 1
            await settle(f)
            f.assert_idle()
    run(scenario())


def test_mid_body_failure_of_a_plain_response_is_a_502() -> None:
    async def scenario() -> None:
        async with fleet(2) as f:
            home, _ = await _pinned(f, "s")
            await f.stub_at(home).set_fault("die_mid_stream")
            reply = await f.complete("s")
            assert reply.status == 502, reply.body
            assert home in reply.body["error"]["message"]
            await settle(f)
            f.assert_idle()
    run(scenario())


def test_backend_error_status_is_retried_elsewhere_and_relayed_when_alone() -> None:
    async def scenario() -> None:
        async with fleet(2) as f:
            home, other = await _pinned(f, "s")
            await f.stub_at(home).set_fault("error")
            reply = await f.complete("s")
            # retried once, unkeyed, while the failed lease is held: the other backend
            assert (reply.status, reply.backend) == (200, other), reply.body
            assert reply.headers.get("x-affinity-retried") == "1"
            assert f.router.metrics.backend_errors.get(home, "5xx") == 1
            assert f.router.table.is_active(home)  # one 5xx does not eject (eject_5xx=5)
            f.assert_idle()
        async with fleet(1) as f:  # no other backend: the 500 is relayed, not retried
            await f.stubs[0].set_fault("error")
            reply = await f.complete("s")
            assert reply.status == 500 and reply.body["error"]["message"] == "injected fault"
            assert f.router.metrics.retries.get() == 0
            f.assert_idle()
    run(scenario())


def test_all_backends_refusing_gives_502_then_503_and_no_leak() -> None:
    async def scenario() -> None:
        async with fleet(2, ejection_base=0.05) as f:
            for stub in f.stubs:
                await stub.set_fault("refuse")
            reply = await f.complete("s")
            assert reply.status == 502, reply.body
            assert "tried 2 backends" in reply.body["error"]["message"]
            assert f.router.table.active == ()
            f.assert_idle()
            nothing = await f.complete("s")
            assert nothing.status == 503
            assert nothing.body["error"]["message"].startswith(
                "No available servers in load balancer")
            async with f.client.get(f.url + "/health") as resp:
                assert resp.status == 503
            for stub in f.stubs:
                await stub.set_fault("none")
            await asyncio.sleep(0.06)  # past the ejection back-off
            await f.router.monitor.check_health()
            assert len(f.router.table.active) == 2
            assert (await f.complete("s")).status == 200
            f.assert_idle()
    run(scenario())


def test_backend_dying_with_requests_in_flight_then_flapping_back() -> None:
    async def scenario() -> None:
        async with fleet(2, tie_break="first", stub={"delay": 0.5}) as f:
            home = f.router.table.servers[0]
            tasks = [asyncio.create_task(f.complete(f"k{i}")) for i in range(2)]
            await wait_until(lambda: f.router.table.inflight(home) >= 1, what="in flight")
            await f.stub_at(home).set_fault("refuse")  # kills the open connections
            replies = await asyncio.gather(*tasks)
            # closed before any response byte: retried once on the other backend
            assert all(r.status == 200 and r.backend != home for r in replies), replies
            assert any(r.headers.get("x-affinity-retried") for r in replies)
            # re-add while nothing is in flight, then route there again
            await f.stub_at(home).set_fault("none")
            await f.router.monitor.check_health()
            f.assert_idle()
            assert f.router.table.state.leases.stale_leases == 0
    run(scenario())


def test_late_release_after_remove_and_readd_cannot_undercount() -> None:
    async def scenario() -> None:
        async with fleet(1, stub={"delay": 0.4}) as f:
            (home,) = f.router.table.servers
            slow = asyncio.create_task(f.complete("old"))
            await wait_until(lambda: f.router.table.inflight(home) == 1, what="in flight")
            f.router.table.remove(home)  # e.g. a failed health check ...
            f.router.table.add(home)  # ... and a passing one, while "old" still runs
            f.stubs[0].options.delay = 1.5  # "new" outlives "old" whatever the machine load
            fresh = asyncio.create_task(f.complete("new"))
            await wait_until(lambda: f.router.table.inflight(home) == 1, what="fresh request")
            await slow  # its release is stale: the fresh request's count must survive
            assert f.router.table.inflight(home) == 1
            assert f.router.table.state.leases.stale_leases == 1
            await fresh
            f.assert_idle()
    run(scenario())
