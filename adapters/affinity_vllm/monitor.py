"""Background checks: backend health (pool membership) and vLLM load scraping.

Theory of operation
-------------------
Two periodic tasks run beside the HTTP server; each round visits every backend
concurrently, with its own timeout, so one hung backend cannot delay the others.

**Health** (once as the router starts, then every ``health_interval``): ``GET
/health`` on every *configured* backend (the router's own ``/health`` says
``starting`` until the first round has completed);
a 200 within ``health_timeout`` passes, anything else (refused, timeout, an error status
such as 503 while vLLM starts) fails. Each result goes to the router's health book
(:mod:`affinity_vllm.health`), which decides the pool change: a failing backend in the
pool is removed (``RemoveServers``); a passing one that is out -- after a failed check,
or ejected and past its back-off -- is re-added (``AddServers``). Sessions pinned to a
removed server re-pin on their next turn (the core's ``reselected`` path).

**Load** (every ``scrape_interval``, only with ``scrape_metrics``): ``GET /metrics`` on
every *active* backend, reading ``vllm:num_requests_running + vllm:num_requests_waiting``
(summed over label sets) and ``vllm:kv_cache_usage_perc`` (reported only). The round's
readings become one ``ObserveLoads`` event: for each listed backend that is still active
the core sets its external load to ``max(0, observed - in-flight)`` and routes on
in-flight + external (R-OBS-1/2). Backends whose page fails or lacks the gauges are left
out of the event, so their external load keeps its last value until a good scrape;
a scrape failure never removes a backend -- that is the health check's job.

Readings are taken at slightly different moments from the router's in-flight counts;
that is why the core clamps at 0 and why the bound that survives an observation is the
per-decision band, not the arrivals-only induction (R-OBS-3).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable

import aiohttp

from .metrics import parse_samples, sum_samples
from .observability import RouterMetrics
from .options import RouterOptions
from .routing import RoutingTable

__all__ = ["Monitor"]

log = logging.getLogger("affinity_vllm.monitor")

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"


class Monitor:
    def __init__(
        self,
        options: RouterOptions,
        table: RoutingTable,
        metrics: RouterMetrics,
        session: Callable[[], aiohttp.ClientSession],
        probed: Callable[[str, bool], None],
    ) -> None:
        self.options = options
        self.table = table
        self.metrics = metrics
        self._session = session
        self._probed = probed
        self._tasks: list[asyncio.Task[None]] = []
        self.health_rounds = 0
        self.scrape_rounds = 0

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(
            self._loop(self.options.health_interval, self.check_health), name="health"))
        if self.options.scrape_metrics:
            self._tasks.append(asyncio.create_task(
                self._loop(self.options.scrape_interval, self.scrape_loads), name="scrape"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def _loop(self, interval: float, round_: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await round_()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one round must not stop the checks for good
                log.exception("monitor round failed")

    # ----------------------------------------------------------------- health
    async def _healthy(self, sid: str) -> bool:
        timeout = aiohttp.ClientTimeout(total=self.options.health_timeout)
        try:
            async with self._session().get(sid + "/health", timeout=timeout) as resp:
                await resp.read()
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

    async def check_health(self) -> None:
        servers = self.table.servers
        results = await asyncio.gather(*(self._healthy(s) for s in servers))
        for sid, healthy in zip(servers, results, strict=True):
            self._probed(sid, healthy)
        self.health_rounds += 1

    # ------------------------------------------------------------------- load
    async def _scrape(self, sid: str) -> int | None:
        timeout = aiohttp.ClientTimeout(total=self.options.health_timeout)
        try:
            async with self._session().get(sid + "/metrics", timeout=timeout) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise aiohttp.ClientResponseError(
                        resp.request_info, (), status=resp.status, message="bad status")
        except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError):
            self.metrics.backend_error(sid, "scrape")
            return None
        samples = parse_samples(text)
        running, waiting = sum_samples(samples, RUNNING), sum_samples(samples, WAITING)
        report = self.metrics.reports[sid]
        report.kv_cache_usage_perc = _mean(samples, KV_USAGE)
        report.prefix_cache_queries = sum_samples(samples, PREFIX_QUERIES)
        report.prefix_cache_hits = sum_samples(samples, PREFIX_HITS)
        if running is None or waiting is None:
            self.metrics.backend_error(sid, "scrape")
            return None
        report.running, report.waiting = running, waiting
        report.scraped_at = time.monotonic()
        total = running + waiting
        if not math.isfinite(total) or total < 0:
            return None
        return round(total)

    async def scrape_loads(self) -> None:
        servers = self.table.active
        results = await asyncio.gather(*(self._scrape(s) for s in servers))
        observed = [(s, n) for s, n in zip(servers, results, strict=True) if n is not None]
        if observed:
            self.table.observe(observed)
        self.scrape_rounds += 1


def _mean(samples: list[tuple[str, dict[str, str], float]], name: str) -> float | None:
    values = [v for n, _, v in samples if n == name]
    return math.fsum(values) / len(values) if values else None
