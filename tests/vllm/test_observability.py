"""/metrics (Prometheus text), /status (get_status's view) and /health of the router."""

from __future__ import annotations

import asyncio

from affinity_vllm.metrics import Registry, parse_samples, sum_samples

from affinity_engine import VERL_STATUS_KEYS

from .fleet import fleet, run, wait_until


def _value(text: str, name: str, **labels: str) -> float:
    matches = [v for n, lab, v in parse_samples(text) if n == name and lab == labels]
    assert len(matches) == 1, (name, labels, matches)
    return matches[0]


def test_metrics_report_kept_broken_decisions_inflight_errors_and_overhead() -> None:
    async def scenario() -> None:
        async with fleet(2, margin=0, tie_break="first", stub={"delay": 0.2}) as f:
            a, b = f.router.table.servers
            f.stubs[0].options.delay = 0.0
            await f.complete("x")  # new -> a
            await f.complete("y")  # new -> a (tie, first)
            await f.complete(None)  # unkeyed -> a
            f.stubs[0].options.delay = 0.2
            slow = asyncio.create_task(f.complete("x"))  # kept on a, in flight
            await wait_until(lambda: f.router.table.inflight(a) == 1)
            text = await f.metrics_text()
            assert _value(text, "affinity_router_inflight", backend=a) == 1
            assert _value(text, "affinity_router_inflight", backend=b) == 0
            moved = await f.complete("y")  # a busier than b by 1 > margin 0: broken
            assert moved.path == "broken"
            await slow
            await f.stub_at(a).set_fault("refuse")
            retried = await f.complete(None)  # tie -> a (first), refused, retried on b
            assert (retried.status, retried.backend) == (200, b)
            text = await f.metrics_text()
            assert _value(text, "affinity_router_sticky_kept_total") == 1
            assert _value(text, "affinity_router_sticky_broken_total") == 1
            decisions = {o: _value(text, "affinity_router_decisions_total", outcome=o)
                         for o in ("new", "kept", "broken", "reselected", "unkeyed", "rejected")}
            assert decisions == {"new": 2, "kept": 1, "broken": 1, "reselected": 0,
                                 "unkeyed": 3, "rejected": 0}
            assert _value(text, "affinity_router_backend_errors_total",
                          backend=a, kind="refused") == 1
            assert _value(text, "affinity_router_retries_total") == 1
            assert _value(text, "affinity_router_pool_changes_total", change="removed") == 1
            assert _value(text, "affinity_router_inflight", backend=b) == 0
            assert _value(text, "affinity_router_backend_up", backend=a) == 0
            assert _value(text, "affinity_router_backend_up", backend=b) == 1
            requests = _value(text, "affinity_router_requests_total",
                              route="/v1/completions", code="200")
            assert requests == 6
            count = _value(text, "affinity_router_routing_overhead_seconds_count")
            assert count == 6  # one observation per proxied request, retried or not
            assert _value(text, "affinity_router_routing_overhead_seconds_bucket", le="+Inf") \
                == count
            assert 0 < _value(text, "affinity_router_routing_overhead_seconds_sum") < count * 0.05
            assert "# TYPE affinity_router_routing_overhead_seconds histogram" in text
    run(scenario())


def test_status_is_get_status_view_plus_backends() -> None:
    async def scenario() -> None:
        async with fleet(2, margin=2) as f:
            await f.complete("s")
            status = await f.get_json("/status")
            for key in VERL_STATUS_KEYS:
                assert key in status
            assert status["affinity_break_margin"] == 2 and status["policy"] == "margin"
            assert status["total_inflight"] == 0 and status["active_servers"] == 2
            assert set(status["backends"]) == set(f.router.table.servers)
            assert all(b["active"] for b in status["backends"].values())
            assert status == f.router.metrics.status()
    run(scenario())


def test_health_reflects_the_pool() -> None:
    async def scenario() -> None:
        async with fleet(1) as f:
            async with f.client.get(f.url + "/health") as resp:
                assert resp.status == 200
                assert (await resp.json())["active_backends"] == 1
            f.router.table.remove(f.router.table.servers[0])
            async with f.client.get(f.url + "/health") as resp:
                assert resp.status == 503
    run(scenario())


def test_registry_renders_and_parser_reads_it_back() -> None:
    registry = Registry()
    counter = registry.counter("c_total", "a counter", ["k"])
    counter.inc('we"ird\\label\n', amount=2)
    gauge = registry.gauge("g", "a gauge")
    gauge.set(value=0.25)
    hist = registry.histogram("h_seconds", "hist", [0.1, 1.0])
    for v in (0.05, 0.5, 5.0):
        hist.observe(v)
    samples = parse_samples(registry.render())
    assert ("c_total", {"k": 'we"ird\\label\n'}, 2.0) in samples
    assert ("g", {}, 0.25) in samples
    assert ("h_seconds_bucket", {"le": "0.1"}, 1.0) in samples
    assert ("h_seconds_bucket", {"le": "1"}, 2.0) in samples
    assert ("h_seconds_bucket", {"le": "+Inf"}, 3.0) in samples
    assert sum_samples(samples, "h_seconds_count") == 3
    assert sum_samples(samples, "missing") is None


def test_parser_tolerates_odd_lines_and_sums_label_sets() -> None:
    text = "\n".join([
        "# HELP vllm:num_requests_running x", "garbage line {", 'x{a="1"} notanumber',
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
        'vllm:num_requests_running{engine="1",model_name="m"} 2 1700000000000',
        "vllm:num_requests_waiting 1e1", "",
    ])
    samples = parse_samples(text)
    assert sum_samples(samples, "vllm:num_requests_running") == 5
    assert sum_samples(samples, "vllm:num_requests_waiting") == 10
    assert len(samples) == 3
