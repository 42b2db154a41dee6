"""Load generators: verl-shaped session clients and a pool churner.

Theory of operation
-------------------
:class:`SessionClient` drives a balancer actor the way verl 0.9.1's ``LLMServerClient``
does: it asks ``require_release_fields`` once, then for each turn *awaits*
``acquire_server.remote(request_id=...)``, "generates" for a random short while, and sends
``release_server.remote(server_id=..., **declared fields)`` *without awaiting it*.
Several turn loops run concurrently per client; each loop owns its own sessions (as a
verl trajectory plays its turns one after another), picks one at random per turn, so
sticky hits, releases racing pool changes and stale stickiness after a re-add all
happen, while one request id never has two turns in flight. Its last call is an awaited
barrier: Ray runs the calls of one submitter in order, so when the barrier returns every
release of this client is applied.

:class:`PoolChurn` is the other side of verl's elasticity (``add_replicas`` /
``remove_replicas`` / ``rebalance_requests``): until stopped, it adds random server ids
(re-adding active ones too, which resets a count in legacy mode), removes random ones
(keeping at least ``min_active``), and clears the sticky cache.

Both return plain statistics; any exception propagates to the caller's ``ray.get``.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import ray

__all__ = ["PoolChurn", "PoolChurnImpl", "SessionClient", "SessionClientImpl"]


class SessionClientImpl:
    def __init__(self, load_balancer: Any, name: str, seed: int) -> None:
        self._lb = load_balancer
        self._name = name
        self._rng = random.Random(seed)

    async def run(
        self, pairs: int, sessions: int = 16, concurrency: int = 4, max_pause_s: float = 0.001,
        load_balancer: Any = None,
    ) -> dict[str, Any]:
        """``pairs`` acquire/release pairs over ``concurrency`` concurrent turn loops.

        ``load_balancer`` switches this client to another balancer actor first.
        """
        if load_balancer is not None:
            self._lb = load_balancer
        declared = set(await self._lb.require_release_fields.remote())
        remaining = pairs
        placements: dict[str, int] = {}

        async def turns(loop: int) -> None:
            nonlocal remaining
            owned = range(loop, max(sessions, concurrency), concurrency)
            while remaining > 0:
                remaining -= 1
                request_id = f"{self._name}-s{self._rng.choice(owned)}"
                server_id, _handle = await self._lb.acquire_server.remote(request_id=request_id)
                placements[server_id] = placements.get(server_id, 0) + 1
                await asyncio.sleep(self._rng.random() * max_pause_s)
                fields = {"request_id": request_id} if "request_id" in declared else {}
                self._lb.release_server.remote(server_id=server_id, **fields)  # not awaited

        started = time.perf_counter()
        await asyncio.gather(*(turns(k) for k in range(concurrency)))
        total_after = await self._lb.get_total_inflight.remote()  # barrier, see docstring
        return {
            "pairs": pairs,
            "placements": placements,
            "seconds": time.perf_counter() - started,
            "total_inflight_seen": total_after,
        }


class PoolChurnImpl:
    def __init__(self, load_balancer: Any, universe: list[str], seed: int) -> None:
        self._lb = load_balancer
        self._universe = list(universe)
        self._rng = random.Random(seed)
        self._stopped = asyncio.Event()

    async def run(
        self, min_active: int = 1, min_pause_s: float = 0.005, max_pause_s: float = 0.03
    ) -> dict[str, int]:
        """Random pool changes until :meth:`stop`; returns how many of each it made."""
        counts = {"add_servers": 0, "remove_servers": 0, "clear_sticky_cache": 0}
        rng = self._rng
        while not self._stopped.is_set():
            pause = min_pause_s + rng.random() * (max_pause_s - min_pause_s)
            try:
                await asyncio.wait_for(self._stopped.wait(), timeout=pause)
                break
            except asyncio.TimeoutError:
                pass
            op = rng.choice(("add_servers", "remove_servers", "clear_sticky_cache"))
            if op == "add_servers":
                ids = rng.sample(self._universe, rng.randint(1, 2))
                await self._lb.add_servers.remote(servers=dict.fromkeys(ids))
            elif op == "remove_servers":
                active = list(await self._lb.get_all_servers.remote())
                removable = max(0, len(active) - min_active)
                if removable == 0:
                    continue
                ids = rng.sample(active, rng.randint(1, min(2, removable)))
                await self._lb.remove_servers.remote(server_ids=ids)
            else:
                await self._lb.clear_sticky_cache.remote()
            counts[op] += 1
        return counts

    async def stop(self) -> None:
        self._stopped.set()


SessionClient: Any = ray.remote(num_cpus=0)(SessionClientImpl)
"""The Ray actor class of :class:`SessionClientImpl`."""


PoolChurn: Any = ray.remote(num_cpus=0)(PoolChurnImpl)
"""The Ray actor class of :class:`PoolChurnImpl`."""
