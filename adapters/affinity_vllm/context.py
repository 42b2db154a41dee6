"""The context band's ``c`` for ``affinity serve``: a request's prompt length in tokens.

Theory of operation
-------------------
With ``--affinity-break-tokens T`` the keep band widens with the acquire's
``context_tokens`` (SPEC §7.5, R-BAND-1). The router knows a request only as JSON, so
:class:`ContextCounter` derives ``c`` in this order:

1. **Token ids the request carries** (exact, every mode but ``off``): a completions
   ``prompt`` that is a list of ids (``c`` = its length) or a batch of such lists (the
   sum: every prompt of the batch is prefilled on the chosen backend); a chat request's
   ``kv_transfer_params.prompt_token_ids``, the pre-tokenized prompt vLLM 0.32's chat
   endpoint accepts. The first element's type decides the form, and only lengths are
   read: the backend validates the ids, and scanning 100K of them here would cost more
   than routing the request.
2. ``--context-tokens tokenize``: vLLM's ``POST /tokenize`` on one active backend (round
   robin), with the completions ``prompt`` or the chat ``messages``; ``c`` is the
   answer's ``count``. It waits at most ``--health-timeout``. A failure of any kind (no
   backend, refused, timeout, non-200, a body without an integer ``count``) falls back to
   the estimate and is counted (``context_sources_total{source="tokenize_fallback"}``);
   it never fails the request.
3. ``--context-tokens estimate`` (the default): **UTF-8 bytes of the prompt text / 4**
   (integer division). Why bytes and 4: BPE tokenizers of current LLMs average about 4
   bytes of English text per token, and counting bytes rather than characters keeps the
   estimate in range for other scripts too (a CJK character is 3 bytes and about one
   token, where ``characters / 4`` would be 3x low). Code and non-English text have fewer
   bytes per token, so the estimate is usually *low*, which errs toward the plain
   margin: a low ``c`` narrows the band, and skew stays bounded by the cap either way.
   The text is the completions ``prompt`` (a string or a batch of strings, summed) or
   every chat message's ``content`` (a string, or the ``text`` of its text parts); chat
   template tokens and non-text parts (images, audio) count 0, again erring low.

``off`` never computes ``c`` (the band then equals the margin). Requests without a
session key and routers without the band skip all of this: their acquires cannot be
sticky hits, or ``c`` is ignored (R-BAND-3), so they carry no ``context_tokens``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp

from .options import CONTEXT_MODES

__all__ = [
    "BYTES_PER_TOKEN",
    "CONTEXT_MODES",
    "ContextCounter",
    "estimate_tokens",
    "token_ids_length",
]

BYTES_PER_TOKEN = 4
SOURCES = ("ids", "estimate", "tokenize", "tokenize_fallback")


def _ids_length(value: object) -> int | None:
    """Length of a list of ids, or summed lengths of a batch of them; None otherwise."""
    if not isinstance(value, list) or not value:
        return None
    first = value[0]
    if isinstance(first, int) and not isinstance(first, bool):
        return len(value)
    if isinstance(first, list) and (not first or isinstance(first[0], int)):
        return sum(len(item) for item in value if isinstance(item, list))
    return None


def token_ids_length(payload: dict[str, Any], chat: bool) -> int | None:
    """The number of token ids the request carries, or None when it carries text."""
    if not chat:
        return _ids_length(payload.get("prompt"))
    transfer = payload.get("kv_transfer_params")
    if isinstance(transfer, dict):
        return _ids_length(transfer.get("prompt_token_ids"))
    return None


def _text_bytes(value: object) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, list):  # a batch of prompts, or a message's content parts
        total = 0
        for item in value:
            if isinstance(item, str):
                total += _text_bytes(item)
            elif isinstance(item, dict) and item.get("type", "text") == "text":
                total += _text_bytes(item.get("text"))
        return total
    return 0


def estimate_tokens(payload: dict[str, Any], chat: bool) -> int:
    """UTF-8 bytes of the prompt text // :data:`BYTES_PER_TOKEN` (see the module doc)."""
    if not chat:
        return _text_bytes(payload.get("prompt")) // BYTES_PER_TOKEN
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return 0
    total = sum(_text_bytes(m.get("content")) for m in messages if isinstance(m, dict))
    return total // BYTES_PER_TOKEN


class ContextCounter:
    """Computes ``c`` for keyed requests and counts where each value came from."""

    def __init__(self, mode: str, timeout: float, backends: Callable[[], tuple[str, ...]],
                 session: Callable[[], aiohttp.ClientSession]) -> None:
        if mode not in CONTEXT_MODES:
            raise ValueError(f"context_tokens must be one of {CONTEXT_MODES}, got {mode!r}")
        self.mode = mode
        self.timeout = timeout
        self._backends = backends  # the active pool, read at each call
        self._session = session
        self._next = 0
        self.sources: dict[str, int] = dict.fromkeys(SOURCES, 0)

    async def context_tokens(self, payload: dict[str, Any], chat: bool) -> int | None:
        """``c`` for one request (see the module docstring); never raises for bad input."""
        if self.mode == "off":
            return None
        exact = token_ids_length(payload, chat)
        if exact is not None:
            self.sources["ids"] += 1
            return exact
        if self.mode == "tokenize":
            counted = await self._tokenize(payload, chat)
            if counted is not None:
                self.sources["tokenize"] += 1
                return counted
            self.sources["tokenize_fallback"] += 1
        else:
            self.sources["estimate"] += 1
        return estimate_tokens(payload, chat)

    def _tokenize_body(self, payload: dict[str, Any], chat: bool) -> dict[str, Any] | None:
        body: dict[str, Any] = {}
        if isinstance(payload.get("model"), str):
            body["model"] = payload["model"]
        if chat:
            if not isinstance(payload.get("messages"), list):
                return None
            body["messages"] = payload["messages"]
        else:
            if not isinstance(payload.get("prompt"), str):
                return None  # /tokenize takes one string; a batch of texts is estimated
            body["prompt"] = payload["prompt"]
        return body

    async def _tokenize(self, payload: dict[str, Any], chat: bool) -> int | None:
        body = self._tokenize_body(payload, chat)
        backends = self._backends()
        if body is None or not backends:
            return None
        backend = backends[self._next % len(backends)]
        self._next += 1
        try:
            async with self._session().post(
                    backend + "/tokenize", data=json.dumps(body),
                    headers={"content-type": "application/json"},
                    timeout=aiohttp.ClientTimeout(total=self.timeout)) as response:
                if response.status != 200:
                    return None
                answer = await response.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, RuntimeError):
            return None  # RuntimeError: the router's session is not (or no longer) open
        count = answer.get("count") if isinstance(answer, dict) else None
        if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
            return count
        return None
