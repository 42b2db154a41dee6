"""Load from vLLM's own gauges: scraped /metrics -> ObserveLoads -> effective loads.

R-OBS-1: for each listed active backend, external := max(0, observed - in-flight), with
observed = vllm:num_requests_running + vllm:num_requests_waiting. R-OBS-2: routing
compares in-flight + external; releases only move in-flight.
"""

from __future__ import annotations

import asyncio

from .fleet import fleet, run, wait_until


def test_background_scrape_sets_external_load_and_steers_new_sessions() -> None:
    async def scenario() -> None:
        async with fleet(2, scrape_metrics=True, scrape_interval=0.05) as f:
            busy, idle = f.router.table.servers
            f.stub_at(busy).phantom_running = 5  # another client's requests
            await wait_until(lambda: f.router.table.external(busy) == 5, what="scrape")
            status = await f.get_json("/status")
            assert status["backends"][busy]["external_load"] == 5
            assert status["backends"][busy]["num_requests_running"] == 5
            assert status["servers"] == {busy: 0, idle: 0}  # in-flight only, as verl
            replies = [await f.complete(f"new{i}") for i in range(4)]
            assert {r.backend for r in replies} == {idle}
            f.stub_at(busy).phantom_running = 0
            await wait_until(lambda: f.router.table.external(busy) == 0, what="clear")
            assert (await f.complete("later")).status == 200
            f.assert_idle()
    run(scenario())


def test_external_load_breaks_a_pin_outside_the_margin_only() -> None:
    async def scenario(margin: int | None) -> str | None:
        async with fleet(2, margin=margin, tie_break="first") as f:
            home, _ = f.router.table.servers
            assert (await f.complete("s")).backend == home
            f.stub_at(home).phantom_running = 3
            await f.router.monitor.scrape_loads()
            assert f.router.table.external(home) == 3
            reply = await f.complete("s")
            f.assert_idle()
            return reply.path
    assert run(scenario(None)) == "kept"
    assert run(scenario(3)) == "kept"  # 3 <= 0 + 3
    assert run(scenario(2)) == "broken"  # 3 > 0 + 2


def test_router_requests_seen_by_vllm_are_not_counted_twice() -> None:
    async def scenario() -> None:
        async with fleet(1, stub={"delay": 0.5}) as f:
            (backend,) = f.router.table.servers
            tasks = [asyncio.create_task(f.complete(f"k{i}")) for i in range(2)]
            await wait_until(lambda: f.stubs[0].running == 2, what="both running")
            await f.router.monitor.scrape_loads()
            # vLLM reports 2 running, and they are the router's own 2: no external load.
            assert f.router.table.inflight(backend) == 2
            assert f.router.table.external(backend) == 0
            f.stubs[0].phantom_running = 1
            await f.router.monitor.scrape_loads()
            assert f.router.table.external(backend) == 1
            await asyncio.gather(*tasks)
            # Releases move in-flight only; the external estimate waits for the next scrape.
            assert f.router.table.inflight(backend) == 0
            assert f.router.table.external(backend) == 1
            f.assert_idle()
    run(scenario())


def test_failed_scrape_keeps_the_last_estimate_and_does_not_remove() -> None:
    async def scenario() -> None:
        async with fleet(2, health_timeout=0.2) as f:
            sick, _ = f.router.table.servers
            f.stub_at(sick).phantom_running = 2
            await f.router.monitor.scrape_loads()
            assert f.router.table.external(sick) == 2
            await f.stub_at(sick).set_fault("hang")
            f.stub_at(sick).phantom_running = 0
            await f.router.monitor.scrape_loads()
            assert f.router.table.external(sick) == 2  # unchanged: nothing was observed
            assert f.router.table.is_active(sick)
            assert f.router.metrics.backend_errors.get(sick, "scrape") == 1
            await f.stub_at(sick).set_fault("none")
    run(scenario())


def test_scraped_kv_usage_and_queue_gauges_are_reported() -> None:
    async def scenario() -> None:
        async with fleet(1, stub={"delay": 0.3, "max_num_seqs": 1}) as f:
            (backend,) = f.router.table.servers
            tasks = [asyncio.create_task(f.complete(f"k{i}")) for i in range(3)]
            await wait_until(lambda: f.stubs[0].waiting == 2, what="queue")
            await f.router.monitor.scrape_loads()
            text = await f.metrics_text()
            assert f'affinity_router_backend_num_requests_running{{backend="{backend}"}} 1' in text
            assert f'affinity_router_backend_num_requests_waiting{{backend="{backend}"}} 2' in text
            assert f'affinity_router_backend_kv_cache_usage_ratio{{backend="{backend}"}}' in text
            assert f.router.table.external(backend) == 0  # 1 + 2 == the router's 3
            await asyncio.gather(*tasks)
            f.assert_idle()
    run(scenario())
