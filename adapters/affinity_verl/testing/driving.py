"""Synchronous helpers for driving a balancer actor from a test or script.

Theory of operation
-------------------
:func:`call` is ``ray.get(handle.method.remote(...))``. :func:`set_loads` brings the
in-flight counts to given values using only the public API, because a Ray actor's
counters cannot be set directly (verl's own tests poke the dict). It acquires fresh
filler ids until every server sits at a common level -- each goes to a least-loaded
server, so the pool fills evenly and no server passes the level -- then releases each
server down to its target. The fillers stay in the sticky map; they are never reused.
:func:`wait_until` polls a condition (e.g. "every replica holds its request") with a
deadline, because fire-and-forget releases and actor calls land asynchronously.
This works for any tie-break, but not under ``full_determinism`` (placements ignore
load there) nor with ``lease_accounting`` (its releases carry no request id). Calls are
pipelined: Ray runs one submitter's calls in order.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping
from typing import Any

import ray

__all__ = ["call", "loads", "set_loads", "wait_until"]

_fillers = itertools.count()


def call(handle: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    return ray.get(getattr(handle, method).remote(*args, **kwargs))


def loads(handle: Any) -> dict[str, int]:
    servers: dict[str, int] = call(handle, "get_status")["servers"]
    return servers


def set_loads(handle: Any, targets: Mapping[str, int]) -> None:
    """Make ``loads(handle) == targets`` (every active server must be listed)."""
    current = loads(handle)
    if set(current) != set(targets):
        raise ValueError(f"targets {dict(targets)} must name exactly the pool {list(current)}")
    level = max([*targets.values(), *current.values()])
    fill = sum(level - n for n in current.values())
    ray.get([handle.acquire_server.remote(request_id=f"filler-{next(_fillers)}")
             for _ in range(fill)])
    releases = [handle.release_server.remote(server_id=sid)
                for sid, target in targets.items() for _ in range(level - target)]
    ray.get(releases)
    reached = loads(handle)
    if reached != dict(targets):
        raise AssertionError(f"set_loads reached {reached}, wanted {dict(targets)}")


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Poll ``condition`` every 20 ms; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.02)
