"""What the router reports: the /metrics families and the /status view.

Theory of operation
-------------------
Counters that only the HTTP layer knows (requests by route and status code, backend
errors by kind, retries, client disconnects) are incremented where they happen. Values
that the routing state already holds -- kept and broken counts, decisions per outcome,
in-flight and external load per backend, pool membership -- are *read from the
:class:`~affinity_vllm.routing.RoutingTable` at render time*, so /metrics can never drift
from the state the core computed. The scraped vLLM gauges (running, waiting, KV-cache
usage) are stored per backend by the monitor and reported as they were last read.

Metric names: one prefix, ``affinity_router_``, then what is measured, without repeating
the project's name (``sticky_kept_total``, not ``affinity_kept_total``); counters end in
``_total``, durations in ``_seconds``, fractions in 0-1 in ``_ratio``:

* ``build_info{version}`` -- 1, with the installed package's version;
* ``sticky_kept_total``, ``sticky_broken_total`` -- the core's counters
  (``affinity_kept`` / ``affinity_broken`` in /status);
* ``group_kept_total``, ``group_broken_total`` -- with ``--group-stickiness``: the core's
  group counters (``group_kept`` / ``group_broken`` in /status, SPEC §7.6);
* ``decisions_total{outcome}`` -- acquires by path (new, kept, broken, reselected,
  unkeyed, and with group stickiness group_kept, group_broken) and rejections;
* ``inflight{backend}``, ``external_load{backend}``, ``backend_up{backend}``;
* ``backend_errors_total{backend,kind}`` -- refused, connect_timeout, 5xx, timeout,
  disconnected, mid_stream, health, scrape;
* ``backend_health{backend,state}`` -- 1 for the backend's health state (up, ejected,
  down; :mod:`affinity_vllm.health`), ``open_requests{backend}`` -- requests holding a
  lease, including on backends that left the pool while they ran;
* ``connections`` -- open client connections;
* ``decision_log_ok``, ``decision_log_errors_total{kind}`` -- with ``--decision-log``:
  whether the log is being written now, and its failures by kind (a write error, the
  live file deleted, moved or replaced underneath, a failed rotation or resumption);
* ``pool_changes_total{change}``, ``retries_total``, ``client_disconnects_total``;
* ``requests_total{route,code}`` -- code 499 when the client left before the response
  ended (counted once in ``client_disconnects_total`` too), never 500;
* ``context_sources_total{source}`` -- with the context band: keyed requests by where
  their prompt length came from (ids, estimate, tokenize, tokenize_fallback: a failed
  /tokenize call, estimated instead; :mod:`~affinity_vllm.context`);
* ``reuse_reports_total{backend,result}``, ``backend_prefix_reuse{backend}`` -- with
  ``--context-reuse``: kept 200 responses by what their usage gave the reuse meter, and
  each backend's cached / looked-up ratio (:mod:`~affinity_vllm.usage`, which registers
  and updates them itself);
* ``routing_overhead_seconds`` -- histogram, per proxied request, of the time from the
  request's first byte to the first byte written to the backend: HTTP parsing, body
  check, session key, the core step and the connection borrow;
* ``request_duration_seconds{backend}`` -- histogram of proxied requests from their first
  byte to the end of the response, by the backend that answered;
  ``time_to_first_byte_seconds{backend}`` -- from the request's first byte to the
  backend's response head (the first token, for a stream);
* ``backend_num_requests_running``/``_waiting``/``_kv_cache_usage_ratio{backend}`` --
  the last scrape of each backend's vLLM gauges (vLLM's ``kv_cache_usage_perc`` is a 0-1
  fraction; the name here says so).
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING, Any

import attrs

from affinity_runtime.decision_log import PROBLEM_KINDS

from .metrics import Family, Registry
from .routing import RoutingTable

if TYPE_CHECKING:
    from .context import ContextCounter
    from .health import BackendHealth
    from .prefix_placement import PrefixPlacement
    from .usage import ReuseFeed

__all__ = ["DURATION_BUCKETS", "BackendReport", "RouterMetrics"]


def _version() -> str:
    try:
        return metadata.version("affinity-routing")
    except metadata.PackageNotFoundError:  # run from a source tree without installing
        return "unknown"

OVERHEAD_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
)
# Generation takes milliseconds to minutes: 5 ms .. 10 min.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 120.0, 300.0, 600.0)
_DECISION_OUTCOMES = ("new", "kept", "broken", "reselected", "unkeyed", "rejected")
_GROUP_OUTCOMES = ("group_kept", "group_broken")


@attrs.define
class BackendReport:
    """The last scrape of one backend's vLLM gauges (None until scraped)."""

    running: float | None = None
    waiting: float | None = None
    kv_cache_usage_perc: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    scraped_at: float | None = None  # time.monotonic() of the last good scrape


class RouterMetrics:
    def __init__(self, table: RoutingTable) -> None:
        self.table = table
        self.reports: dict[str, BackendReport] = {s: BackendReport() for s in table.servers}
        r = self.registry = Registry()
        p = "affinity_router_"
        self._build = r.gauge(p + "build_info", "1, labelled with the version of "
                              "affinity-routing that is running", ["version"])
        self._build.set(_version(), value=1)
        self._kept = r.counter(p + "sticky_kept_total",
                               "sticky hits that kept their pin (core counter)")
        self._broken = r.counter(p + "sticky_broken_total",
                                 "sticky hits re-pinned by the margin rule (core counter)")
        self._group_kept: Family | None = None
        self._group_broken: Family | None = None
        self._outcomes: tuple[str, ...] = _DECISION_OUTCOMES
        if table.config.groups:  # absent without group pins, as the status fields are
            self._group_kept = r.counter(p + "group_kept_total",
                                         "group hits that kept the group's pin (core counter)")
            self._group_broken = r.counter(p + "group_broken_total",
                                           "group hits re-pinned by the group's keep rule "
                                           "(core counter)")
            self._outcomes = (*_DECISION_OUTCOMES, *_GROUP_OUTCOMES)
        self._decisions = r.counter(p + "decisions_total",
                                    "routing decisions by outcome", ["outcome"])
        self._inflight = r.gauge(p + "inflight",
                                 "requests this router has in flight per backend", ["backend"])
        self._external = r.gauge(p + "external_load",
                                 "load observed on a backend beyond this router's in-flight "
                                 "requests (ObserveLoads)", ["backend"])
        self._up = r.gauge(p + "backend_up", "1 if the backend is in the routing pool",
                           ["backend"])
        self.backend_errors = r.counter(p + "backend_errors_total",
                                        "backend failures by kind", ["backend", "kind"])
        self._pool_changes = r.counter(p + "pool_changes_total",
                                       "backends removed from or re-added to the pool",
                                       ["change"])
        self.retries = r.counter(p + "retries_total",
                                 "requests retried once after a connect error, a 5xx or a "
                                 "connection closed before any response byte")
        self.client_disconnects = r.counter(p + "client_disconnects_total",
                                            "clients that went away before the response ended")
        self.requests = r.counter(p + "requests_total", "HTTP requests by route and status",
                                  ["route", "code"])
        self.overhead = r.histogram(p + "routing_overhead_seconds",
                                    "time the router adds per proxied request (parse, key, "
                                    "core step, release), excluding the backend",
                                    OVERHEAD_BUCKETS)
        self.duration = r.labeled_histogram(
            p + "request_duration_seconds", "proxied requests from their first byte to the "
            "end of the response, by backend", "backend", DURATION_BUCKETS)
        self.first_byte = r.labeled_histogram(
            p + "time_to_first_byte_seconds", "proxied requests from their first byte to "
            "the backend's response head, by backend", "backend", DURATION_BUCKETS)
        self._running = r.gauge(p + "backend_num_requests_running",
                                "vllm:num_requests_running at the last scrape", ["backend"])
        self._waiting = r.gauge(p + "backend_num_requests_waiting",
                                "vllm:num_requests_waiting at the last scrape", ["backend"])
        self._kv = r.gauge(p + "backend_kv_cache_usage_ratio",
                           "vllm:kv_cache_usage_perc (a 0-1 fraction) at the last scrape",
                           ["backend"])
        self._health = r.gauge(p + "backend_health", "1 for the backend's health state "
                               "(up, ejected, down)", ["backend", "state"])
        self._open = r.gauge(p + "open_requests", "requests holding a lease on the backend, "
                             "in the pool or not", ["backend"])
        self._connections = r.gauge(p + "connections", "open client connections")
        self._log_ok = r.gauge(p + "decision_log_ok", "1 while the decision log is being "
                               "written, 0 after a failure until it resumes (absent "
                               "without --decision-log)")
        self._log_errors = r.counter(p + "decision_log_errors_total",
                                     "decision log failures by kind (write, rotate, deleted, "
                                     "moved, replaced, reopen)", ["kind"])
        self._context = r.counter(p + "context_sources_total", "keyed requests by the source "
                                  "of their prompt length for the context band (ids, "
                                  "estimate, tokenize, tokenize_fallback)", ["source"])
        self._index_blocks = r.gauge(p + "prefix_index_blocks", "prompt blocks the prefix "
                                     "index holds for the backend (--placement-margin)",
                                     ["backend"])
        self._index_bytes = r.gauge(p + "prefix_index_bytes", "bytes the prefix index takes "
                                    "for the backend (--placement-margin)", ["backend"])
        self.health: dict[str, BackendHealth] = {}
        self.context: ContextCounter | None = None  # set by the router with the band
        self.placement: PrefixPlacement | None = None  # set by the proxy with placement
        self.reuse: ReuseFeed | None = None  # set by the proxy with --context-reuse
        self.connections = 0
        self.retries.samples[()] = 0.0
        self.client_disconnects.samples[()] = 0.0

    def register(self, server_id: str) -> None:
        """A backend added at run time (admin API) gets its report slot."""
        self.reports.setdefault(server_id, BackendReport())

    def backend_error(self, backend: str, kind: str) -> None:
        self.backend_errors.inc(backend, kind)

    def _refresh(self) -> None:
        """Copy the routing state's values into the families (called at render time)."""
        table = self.table
        self._kept.set(value=table.state.affinity_kept)
        self._broken.set(value=table.state.affinity_broken)
        if self._group_kept is not None and self._group_broken is not None:
            groups = table.state.groups
            self._group_kept.set(value=groups.kept)
            self._group_broken.set(value=groups.broken)
        for outcome in self._outcomes:
            self._decisions.set(outcome, value=table.decisions.get(outcome, 0))
        for change, count in table.pool_changes.items():
            self._pool_changes.set(change, value=count)
        for sid in table.servers:
            self._inflight.set(sid, value=table.inflight(sid))
            self._external.set(sid, value=table.external(sid))
            self._up.set(sid, value=1 if table.is_active(sid) else 0)
            self._open.set(sid, value=table.open_requests.get(sid, 0))
            if sid in self.health:
                current = self.health[sid].state.value
                for state in ("up", "ejected", "down"):
                    self._health.set(sid, state, value=1 if state == current else 0)
            report = self.reports[sid]
            for family, value in ((self._running, report.running),
                                  (self._waiting, report.waiting),
                                  (self._kv, report.kv_cache_usage_perc)):
                if value is None:
                    family.remove(sid)
                else:
                    family.set(sid, value=value)

    def _refresh_log(self) -> None:
        health = self.table.log_health()
        if health is None:
            return
        self._log_ok.set(value=1 if health["ok"] else 0)
        for kind in PROBLEM_KINDS:
            self._log_errors.set(kind, value=health["errors"].get(kind, 0))

    def render(self) -> str:
        if self.context is not None:
            for source, count in self.context.sources.items():
                self._context.set(source, value=count)
        self._refresh()
        self._refresh_log()
        if self.placement is not None:
            for sid, held in self.placement.index.memory().items():
                self._index_blocks.set(sid, value=held["blocks"])
                self._index_bytes.set(sid, value=held["bytes"])
        self._connections.set(value=self.connections)
        return self.registry.render()

    def status(self) -> dict[str, Any]:
        """get_status's view (the core's ``status``) plus per-backend detail."""
        out = self.table.status()
        backends: dict[str, Any] = {}
        for sid in self.table.servers:
            report = self.reports[sid]
            backends[sid] = {
                "active": self.table.is_active(sid),
                # in the pool: the core's count; out of it: the requests still running there
                "inflight": self.table.inflight(sid) if self.table.is_active(sid)
                else self.table.open_requests.get(sid, 0),
                "open_requests": self.table.open_requests.get(sid, 0),
                "health": self.health[sid].state.value if sid in self.health else None,
                "external_load": self.table.external(sid),
                "num_requests_running": report.running,
                "num_requests_waiting": report.waiting,
                "kv_cache_usage_perc": report.kv_cache_usage_perc,
                "errors": {kind: int(n) for (b, kind), n in self.backend_errors.samples.items()
                           if b == sid},
            }
        out["backends"] = backends
        if self.context is not None:
            config = self.table.config
            out["context_band"] = {
                "affinity_break_tokens": config.affinity_break_tokens,
                "affinity_break_band_cap": config.affinity_break_band_cap,
                "context_tokens": self.context.mode, "sources": dict(self.context.sources)}
            if self.reuse is not None:
                out["context_band"]["reuse"] = self.reuse.status()
        if self.placement is not None:
            out["prefix_index"] = {"placement_margin": self.table.config.placement_margin,
                                   **self.placement.status()}
        return out
