"""The router's own resources: file descriptors, request-body memory, and its errors.

Theory of operation
-------------------
When the router runs out of something of its own, that is the router's error, never a
backend's: a backend must not be ejected because the router could not open a socket to
it. This module keeps those resources and reports their exhaustion.

* :func:`fit_fd_limit` -- at start, every client connection and every proxied request's
  upstream connection needs a file descriptor. If ``RLIMIT_NOFILE``'s soft limit is
  below what ``--max-connections`` needs, the soft limit is raised (up to the hard
  limit, which any process may do); if that is still short, ``--max-connections`` is
  lowered to what fits, and the message says so and how to raise the limit. The usual
  soft limit is 1,024, below the default of 10,000 connections.
* :class:`BodyBudget` -- one budget for the request bodies all connections hold in
  memory at once (``--body-memory-budget``). A request reserves its declared
  Content-Length when its headers are complete (a chunked one reserves as its chunks
  arrive) and gives it back when its handler ends or its connection goes. A request
  that does not fit gets 503 (the router is out of memory for bodies, not the request
  too large: that is ``--max-body-bytes``' 413).
* :func:`descriptor_use` -- the descriptors this process has open and its soft limit.
  asyncio's own loop reports an accept that failed for want of descriptors (the HTTP
  server counts it), but uvloop's does not: libuv accepts the pending connection on a
  descriptor it keeps spare and closes it at once, telling nobody. So the HTTP server
  also looks at the descriptors in use once a second, and a second spent within
  :data:`FD_HEADROOM` of the limit is reported as an ``fd`` error: while it lasts, new
  clients may be dropped without a word.
* :class:`RouterErrors` -- ``affinity_router_router_errors_total{kind}`` (``fd`` for
  connects and accepts refused for want of descriptors and for each second spent at the
  limit, ``body_memory`` for bodies refused by the budget) and one log line per kind at
  most every :data:`LOG_EVERY` seconds, with the count since the last line, so an
  exhausted router cannot flood its own log.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .metrics import Registry

__all__ = ["FD_HEADROOM", "FD_RESERVE", "LOG_EVERY", "BodyBudget", "RouterErrors",
           "descriptor_use", "fit_fd_limit"]

log = logging.getLogger("affinity_vllm.limits")

# Descriptors kept for everything that is not a client or upstream connection: the
# listening socket, the decision log and its lock, health-check and scrape sessions,
# the event loop's own, stdio.
FD_RESERVE = 64
LOG_EVERY = 10.0
# Descriptors in use this close to the soft limit count as "at the limit": an accept or
# an upstream connect may fail, and the few left go to the loop's own needs.
FD_HEADROOM = 8


def fit_fd_limit(max_connections: int, max_concurrency: int, backends: int
                 ) -> tuple[int, str | None]:
    """``(max_connections that fit, a message or None)``. Each client connection needs
    a descriptor, and each proxied request (at most ``max_concurrency``, at most one per
    connection) one more for its upstream connection."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX: nothing to check
        return max_connections, None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    reserve = FD_RESERVE + 8 * backends
    needed = max_connections + min(max_concurrency, max_connections) + reserve
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return max_connections, None
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft >= needed:
        return max_connections, (f"raised the open-file limit (ulimit -n) to {soft} for "
                                 f"--max-connections {max_connections}")
    spare = soft - reserve
    fitted = max(1, spare - max_concurrency if spare - max_concurrency >= max_concurrency
                 else spare // 2)
    return fitted, (f"--max-connections {max_connections} needs about {needed} open files, "
                    f"but the limit (ulimit -n) is {soft} (hard limit {hard}); serving at "
                    f"most {fitted} client connections. Raise the limit (ulimit -n) or "
                    f"lower --max-connections to silence this")


def descriptor_use() -> tuple[int, int] | None:
    """``(open descriptors, soft RLIMIT_NOFILE)`` of this process; None where it cannot be
    known (no ``/proc/self/fd``, not POSIX) or there is no limit."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        in_use = len(os.listdir("/proc/self/fd")) - 1  # less the listing's own descriptor
    except OSError:
        return None
    return in_use, soft


class RouterErrors:
    """Counts the router's own resource errors by kind; logs each kind rate-limited."""

    def __init__(self, registry: Registry | None = None) -> None:
        self.counts: dict[str, int] = {}
        self._unlogged: dict[str, int] = {}
        self._logged_at: dict[str, float] = {}
        self._family = None if registry is None else registry.counter(
            "affinity_router_router_errors_total", "failures of the router's own resources "
            "by kind (fd: out of file descriptors on accept or connect, or a second spent "
            "at the descriptor limit; body_memory: a request body refused by "
            "--body-memory-budget); never counted against a backend", ["kind"])

    def error(self, kind: str, message: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self._family is not None:
            self._family.inc(kind)
        self._unlogged[kind] = self._unlogged.get(kind, 0) + 1
        now = time.monotonic()
        last = self._logged_at.get(kind)
        if last is None or now - last >= LOG_EVERY:
            count = self._unlogged.pop(kind)
            self._logged_at[kind] = now
            log.error("router resource error (%s): %s%s", kind, message,
                      f" [{count} such errors since the last line]" if count > 1 else "")


class BodyBudget:
    """Bytes of request bodies held in memory, against one global limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = 0

    def reserve(self, size: int) -> bool:
        if self.in_use + size > self.limit:
            return False
        self.in_use += size
        return True

    def give_back(self, size: int) -> None:
        self.in_use -= size
