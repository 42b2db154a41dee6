"""Prefix-aware placement for ``affinity serve``: each request's ``cached_prefix`` estimate.

Theory of operation
-------------------
With ``--placement-margin M`` the core places a conversation (new, broken, or joining no
group pin) on the backend within ``min + M`` that caches the most of its prompt (SPEC
§8.1, R-PFX-3). The core is pure, so the estimate arrives on the acquire (R-PFX-7); this
module computes it from the request body, which the router parses anyway:

* **the prompt's block chain** (:func:`prompt_chain`): token ids where the request
  carries them (a completions ``prompt`` list of ids; a chat request's
  ``kv_transfer_params.prompt_token_ids``), cut into blocks of ``--prefix-block-size``
  tokens; otherwise the prompt text (a completions ``prompt`` string, or the chat
  messages' roles and text in order), in blocks of ``block_size * BYTES_PER_TOKEN``
  UTF-8 bytes, the estimate the context band uses too. A conversation's next turn
  extends its earlier text, so the chains share their leading blocks, as vLLM's prefix
  cache does. A batch of prompts, or a body with no prompt the router can read, has no
  chain: its estimate is empty and placement falls back to the least loaded;
* **what was routed where** (:class:`affinity_runtime.prefix_index.PrefixIndex`, the
  same index the verl adapter keeps): per backend, the blocks of the prompts routed
  there, at most ``--prefix-index-blocks`` per backend, least recently routed forgotten
  first. A placement is recorded at once, so samples of one prompt sent together follow
  one another within the band; a backend that leaves the pool is forgotten.

The estimate changes which admissible backend is chosen, never the set: the load bound
holds whatever it says (R-PFX-4). It is a router's memory, not the backend's cache: it
starts empty after a restart and does not see evictions. Memory is bounded by the block
cap and reported per backend under ``/status`` (``prefix_index``) and ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from affinity_runtime.prefix_index import PrefixIndex, chain_of_ids, chain_of_text

__all__ = ["PrefixPlacement", "prompt_chain"]


def _token_ids(value: object) -> list[int] | None:
    if isinstance(value, list) and value and all(
            type(v) is int for v in value):
        return value
    return None


def _message_text(messages: object) -> str | None:
    """The chat messages as one text, role and content in order (None: not readable)."""
    if not isinstance(messages, list) or not messages:
        return None
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            return None
        content = message.get("content")
        if isinstance(content, list):  # content parts: their text, in order
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"{message.get('role', '')}\n{content if isinstance(content, str) else ''}\n")
    return "".join(parts)


def prompt_chain(payload: dict[str, Any], chat: bool, block_size: int) -> list[bytes]:
    """The request's prompt as chained block digests ([] where none can be read)."""
    if chat:
        params = payload.get("kv_transfer_params")
        ids = _token_ids(params.get("prompt_token_ids")) if isinstance(params, dict) else None
        if ids is not None:
            return chain_of_ids(ids, block_size)
        text = _message_text(payload.get("messages"))
        return chain_of_text(text, block_size) if text is not None else []
    prompt = payload.get("prompt")
    ids = _token_ids(prompt)
    if ids is not None:
        return chain_of_ids(ids, block_size)
    if isinstance(prompt, str):
        return chain_of_text(prompt, block_size)
    return []  # a batch, or no prompt: no estimate


class PrefixPlacement:
    """The router's prefix index and the estimates it sends (see the module docstring)."""

    def __init__(self, block_size: int, index_blocks: int) -> None:
        self.index = PrefixIndex(block_size, index_blocks)
        self.requests = 0  # requests with a readable prompt
        self.estimated = 0  # of those, requests some backend was estimated to hold

    def estimate(self, payload: dict[str, Any], chat: bool, servers: Iterable[str]
                 ) -> tuple[list[bytes], tuple[tuple[str, int], ...]]:
        """The request's chain and its ``cached_prefix`` over ``servers``."""
        chain = prompt_chain(payload, chat, self.index.block_size)
        if not chain:
            return chain, ()
        self.requests += 1
        estimate = self.index.estimate(chain, servers)
        if estimate:
            self.estimated += 1
        return chain, estimate

    def placed(self, server_id: str, chain: Sequence[bytes]) -> None:
        """The request went to ``server_id``: its prompt's blocks are now there."""
        if chain:
            self.index.record(server_id, chain)

    def forget(self, server_id: str) -> None:
        self.index.forget(server_id)

    def status(self) -> dict[str, Any]:
        return {"block_size": self.index.block_size,
                "index_blocks": self.index.capacity_blocks,
                "requests": self.requests, "estimated": self.estimated,
                "memory": self.index.memory()}
