"""Multi-turn session workloads for the real test tier and the router benchmark.

Theory of operation
-------------------
A :class:`Session` is a conversation: a random prefix (its "system prompt and history")
that grows by ``grow`` new tokens every turn, plus ``query`` fresh tokens per request,
as an agent loop or an RL rollout re-sends its whole history each turn. Turns of one
session are sequential; different sessions run concurrently, at most ``concurrency``
requests in flight. Everything is derived from a seed, so two contenders in a benchmark
see byte-identical requests.

:func:`skewed_sessions` makes the benchmark's shape: a few *long* sessions (many turns,
long prefixes) among many *short* ones -- the load pattern under which a pin that never
moves leaves one server busy while another idles.

Prompts are token ids (what verl sends) or, for routers that only take text, a text
rendering of the same ids supplied by the caller (the benchmark asks vLLM's
``/detokenize``; :func:`spell` is a model-free fallback). A rendering that maps a
longer id list to an extension of the shorter one's text keeps prefixes identical turn
after turn, so prefix caching still sees them.

:func:`drive` runs the sessions against one base URL and returns one
:class:`RequestResult` per request with its latency and the backend the router reported
(``x-affinity-backend``, when the router sets it).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import attrs

__all__ = ["RequestResult", "Session", "drive", "skewed_sessions", "spell"]


@attrs.frozen
class Session:
    key: str
    prefix: tuple[int, ...]
    turns: int
    grow: int
    query: int
    seed: int

    def prompt(self, turn: int) -> list[int]:
        """Token ids sent on ``turn`` (0-based): prefix + history growth + fresh query."""
        rng = random.Random(f"{self.seed}:{self.key}")
        history = [rng.randrange(3, 1000) for _ in range(self.grow * turn)]
        query = random.Random(f"{self.seed}:{self.key}:{turn}")
        return [*self.prefix, *history, *(query.randrange(3, 1000) for _ in range(self.query))]


def spell(tokens: Sequence[int]) -> str:
    """The text form of a token-id prompt (one short word per id)."""
    return " ".join(f"w{t}" for t in tokens)


def skewed_sessions(*, seed: int = 0, long_sessions: int = 2, short_sessions: int = 14,
                    long_turns: int = 10, short_turns: int = 2, long_prefix: int = 512,
                    short_prefix: int = 256, grow: int = 32, query: int = 8) -> list[Session]:
    """A few long sessions among many short ones, interleaved deterministically."""
    rng = random.Random(seed)
    sessions = [
        Session(f"long-{i}", tuple(rng.randrange(3, 1000) for _ in range(long_prefix)),
                long_turns, grow, query, seed)
        for i in range(long_sessions)
    ] + [
        Session(f"short-{i}", tuple(rng.randrange(3, 1000) for _ in range(short_prefix)),
                short_turns, grow, query, seed)
        for i in range(short_sessions)
    ]
    rng.shuffle(sessions)
    return sessions


@attrs.frozen
class RequestResult:
    session: str
    turn: int
    status: int
    latency: float
    backend: str | None
    path: str | None
    started: float
    error: str | None = None


Render = Callable[[list[int]], str]


async def _one_session(client: aiohttp.ClientSession, url: str, session: Session,
                       slots: asyncio.Semaphore, max_tokens: int, text: Render | None,
                       session_headers: Sequence[str], model: str,
                       results: list[RequestResult]) -> None:
    for turn in range(session.turns):
        tokens = session.prompt(turn)
        prompt: str | list[int] = tokens if text is None else text(tokens)
        body: dict[str, Any] = {"model": model, "prompt": prompt,
                                "max_tokens": max_tokens, "temperature": 0,
                                "ignore_eos": True}
        headers = dict.fromkeys(session_headers, session.key)
        async with slots:
            started = time.perf_counter()
            try:
                async with client.post(url + "/v1/completions", json=body,
                                       headers=headers) as resp:
                    await resp.read()
                    status, error = resp.status, None
                    backend = resp.headers.get("x-affinity-backend")
                    path = resp.headers.get("x-affinity-path")
            except aiohttp.ClientError as exc:
                status, error, backend, path = 0, repr(exc), None, None
            results.append(RequestResult(session.key, turn, status,
                                         time.perf_counter() - started, backend, path,
                                         started, error))


async def drive(url: str, sessions: Sequence[Session], *, concurrency: int = 8,
                max_tokens: int = 16, text: Render | None = None,
                session_headers: Sequence[str] = ("x-session-id",), model: str = "tiny",
                timeout: float = 600.0) -> list[RequestResult]:
    """Run every session through ``url`` (text prompts if ``text`` renders them)."""
    results: list[RequestResult] = []
    slots = asyncio.Semaphore(concurrency)
    limits = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=limits,
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as client:
        await asyncio.gather(*(
            _one_session(client, url, s, slots, max_tokens, text, session_headers, model,
                         results)
            for s in sessions))
    return results
