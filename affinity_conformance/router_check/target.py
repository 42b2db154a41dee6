"""The router under test as the harness sees it: fresh state, settling, pool changes.

Theory of operation
-------------------
A :class:`Target` is either a router the harness starts from a command (a
:class:`~affinity_conformance.router_check.presets.RouterProcess`, restarted before every
run so each trace -- and each shrinking attempt -- meets a fresh router) or one it
attaches to with ``--url`` (never restarted: each run then uses fresh session keys and
correlation ids under a new namespace, and state the router keeps per backend, such as
vllm-router's session counts, carries over; the report says so).

Settling (timing discipline). After the harness completes a request, the client has
received the whole response; the router may still be about to lower its count. Before the
next event the harness therefore waits until the router has observed the completion:

1. where the router exposes its in-flight count (``status``: ``affinity serve``'s
   ``/status`` ``total_inflight``; ``smg``: sglang-router's ``smg_worker_requests_active``
   gauges), it polls until that count equals the requests the fleet still holds;
2. then, always, it sleeps the *settle delay*: ``max(50 ms, 10 x`` the router's median
   round trip measured at start``) x settle-factor`` unless ``--settle`` fixes it.

The settle delay is stated in every report, and a run with ``--settle-factor 2`` must
give the same verdict (the tests and docs/check-router.md do this).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import attrs

from affinity_engine import DEFAULT_MAX_CACHE_SIZE

from .fleet import MODEL, RecordingFleet
from .presets import Preset, PresetError, RouterExited, RouterProcess, expand, free_port

__all__ = ["SettlePlan", "Target"]

ATTACH_TIMEOUT = 60.0
ATTACH_GRACE = 0.5
MIN_SETTLE = 0.05
ROUND_TRIPS = 10.0
POLL_TIMEOUT = 5.0
START_ATTEMPTS = 3


@attrs.frozen
class SettlePlan:
    delay: float        # seconds slept after every completion and pool change
    factor: float
    mode: str           # status | smg | delay
    how: str            # how the delay was chosen, in words


class Target:
    """See the module docstring."""

    def __init__(self, preset: Preset, *, backends: list[str], routers: Path,
                 margin: int | None, extra: list[str], url: str | None, log_path: Path,
                 metrics_url: str | None = None, cache_size: int = 10000,
                 band: tuple[int, int] | None = None) -> None:
        self.preset, self.backends, self.url = preset, backends, url or ""
        self.attached = url is not None
        self.metrics_url = metrics_url
        self.process: RouterProcess | None = None
        self.log_path = log_path
        self.routers, self.margin, self.extra = routers, margin, extra
        self.cache_size = cache_size
        self.band = band  # the claimed context band's (T, cap), or None
        self.namespace = ""
        self.runs = 0
        self.round_trip = 0.0
        self.command: list[str] = []
        self.fleet: RecordingFleet | None = None  # set by the runner (attach mode needs it)
        self.admin_url = ""  # the pool API's address (pool "affinity-admin")
        self.removals = 0  # affinity-admin: even removals drain, odd ones remove
        self.pool_changes: dict[str, int] = {}  # pool changes made, by action, all runs
        self.restarts_after_exit = 0  # starts repeated because the router exited at once

    async def fresh(self, http: aiohttp.ClientSession) -> None:
        """A router with no state from earlier runs (see the module docstring)."""
        self.runs += 1
        if self.attached:
            self.namespace = f"r{self.runs}-{int(time.time() * 1000) % 10**8}-"
            if self.runs == 1:
                await self._attach(http)
                self.round_trip = await _round_trip(http, self.url)
            return
        self.stop()
        # A port picked free can be taken (by any outgoing connection) before the router
        # binds it; a router that exits before it answers is started again on new ports.
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                started = await self._start(http)
                break
            except RouterExited:
                self.process = None
                if attempt == START_ATTEMPTS:
                    raise
                self.restarts_after_exit += 1
        if self.runs == 1:
            self.round_trip = started.round_trip

    async def _start(self, http: aiohttp.ClientSession) -> RouterProcess:
        """Start the router once, on new ports."""
        ports: list[int] = []
        while len(ports) < 3:  # three distinct ports: the kernel may hand one out twice
            if (picked := free_port()) not in ports:
                ports.append(picked)
        port, metrics_port, admin_port = ports
        self.url = f"http://127.0.0.1:{port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}"
        self.admin_url = f"http://127.0.0.1:{admin_port}"
        self.removals = 0
        self.command = expand(self.preset.template, port=port, metrics_port=metrics_port,
                              backends=self.backends, routers=self.routers,
                              margin=self.margin, cache_size=self.cache_size, band=self.band,
                              admin_port=admin_port)
        if self.preset.cache_flag and self.cache_size != DEFAULT_MAX_CACHE_SIZE:
            self.command += [self.preset.cache_flag, str(self.cache_size)]
        if self.preset.band_flags and self.band is not None:
            tokens_flag, cap_flag = self.preset.band_flags
            self.command += [tokens_flag, str(self.band[0]), cap_flag, str(self.band[1])]
        self.command += self.extra
        self.process = RouterProcess(self.command, self.url, self.log_path)
        await self.process.start(http)
        return self.process

    async def _attach(self, http: aiohttp.ClientSession) -> None:
        """Wait until the running router has health-checked every fleet backend since the
        fleet came up, and answers; a router that found the ports closed before may take
        a back-off period to re-admit them."""
        assert self.fleet is not None
        deadline = time.monotonic() + ATTACH_TIMEOUT
        while time.monotonic() < deadline:
            if min(self.fleet.probed) >= 2 and await _answers(http, self.url):
                await asyncio.sleep(ATTACH_GRACE)
                return
            await asyncio.sleep(0.1)
        raise PresetError(f"the router at {self.url} did not probe every fleet backend and "
                          f"answer within {ATTACH_TIMEOUT:g} s (probes per backend: "
                          f"{self.fleet.probed}); are its backends the --fleet-ports?")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def settle_plan(self, factor: float, fixed: float | None) -> SettlePlan:
        if fixed is not None:
            base, how = fixed, f"fixed by --settle {fixed:g} s"
        else:
            base = max(MIN_SETTLE, ROUND_TRIPS * self.round_trip)
            how = (f"calibrated: max({MIN_SETTLE * 1000:.0f} ms, {ROUND_TRIPS:g} x median round "
                   f"trip {self.round_trip * 1000:.1f} ms)")
        mode = self.preset.settle if (self.metrics_url or self.preset.settle == "status") \
            else "delay"
        return SettlePlan(base * factor, factor, mode, how + f" x factor {factor:g}")

    async def settle(self, http: aiohttp.ClientSession, plan: SettlePlan, held: int) -> None:
        if plan.mode != "delay":
            deadline = time.monotonic() + POLL_TIMEOUT * plan.factor
            while time.monotonic() < deadline:
                seen = await self.inflight(http, plan.mode)
                if seen is None or seen == held:
                    break
                await asyncio.sleep(0.005)
        await asyncio.sleep(plan.delay)

    async def inflight(self, http: aiohttp.ClientSession, mode: str) -> int | None:
        """The router's own in-flight count, or None if it cannot be read."""
        try:
            if mode == "status":
                async with http.get(self.url + "/status") as resp:
                    data = await resp.json()
                return int(data["total_inflight"])
            assert self.metrics_url is not None
            async with http.get(self.metrics_url + "/metrics") as resp:
                text = await resp.text()
        except (aiohttp.ClientError, ValueError, KeyError, TypeError, asyncio.TimeoutError):
            return None
        total = 0.0
        for line in text.splitlines():
            if line.startswith("smg_worker_requests_active"):
                total += float(line.rsplit(" ", 1)[1])
        return int(total)

    async def change_pool(self, http: aiohttp.ClientSession, backend: str, add: bool) -> str:
        """Remove or re-add ``backend`` through the admin API; '' or an error in words."""
        if self.preset.pool == "affinity-admin":
            return await self._change_affinity_pool(http, backend, add)
        path = "/add_worker" if add else "/remove_worker"
        self._count("add" if add else "remove")
        try:
            async with http.post(self.url + path, params={"url": backend}) as resp:
                body = await resp.text()
                if resp.status != 200:
                    return f"POST {path} answered {resp.status}: {body[:200]}"
            deadline = time.monotonic() + POLL_TIMEOUT
            while time.monotonic() < deadline:
                async with http.get(self.url + "/list_workers") as resp:
                    urls = (await resp.json()).get("urls", [])
                if (backend in urls) == add:
                    return ""
                await asyncio.sleep(0.02)
        except (aiohttp.ClientError, ValueError, asyncio.TimeoutError) as exc:
            return f"{path}: {type(exc).__name__}: {exc}"
        return f"{path}: /list_workers did not reflect the change within {POLL_TIMEOUT:g} s"


    def _count(self, action: str) -> None:
        self.pool_changes[action] = self.pool_changes.get(action, 0) + 1

    async def _change_affinity_pool(self, http: aiohttp.ClientSession, backend: str,
                                    add: bool) -> str:
        """``affinity serve``'s pool API: add, or remove and drain in turn (both are
        ``RemoveServers`` to the spec; a drain lets running requests finish, and so
        does a remove). The answer is synchronous: the listing must agree at once."""
        action = "add" if add else ("drain" if self.removals % 2 == 0 else "remove")
        self.removals += not add
        self._count(action)
        path = f"/backends/{action}"
        try:
            async with http.post(self.admin_url + path, json={
                    "url": backend, "reason": "check-router trace"}) as resp:
                body = await resp.text()
                if resp.status != 200:
                    return f"POST {path} answered {resp.status}: {body[:200]}"
            async with http.get(self.admin_url + "/backends") as resp:
                urls = (await resp.json()).get("urls", [])
        except (aiohttp.ClientError, ValueError, asyncio.TimeoutError) as exc:
            return f"{path}: {type(exc).__name__}: {exc}"
        if (backend in urls) != add:
            return f"{path}: GET /backends does not show the change: {urls}"
        return ""


async def _answers(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.post(url + "/v1/completions", timeout=aiohttp.ClientTimeout(total=5),
                             json={"model": MODEL, "prompt": "ready?", "max_tokens": 1}) as resp:
            await resp.read()
            return resp.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return False


async def _round_trip(http: aiohttp.ClientSession, url: str) -> float:
    times = []
    for _ in range(5):
        started = time.perf_counter()
        async with http.post(url + "/v1/completions",
                             json={"model": MODEL, "prompt": "ready?", "max_tokens": 1}) as resp:
            await resp.read()
        times.append(time.perf_counter() - started)
    times.sort()
    return times[len(times) // 2]
