"""The stub's model of vLLM's automatic prefix cache, and how it tokenises prompts.

Theory of operation
-------------------
:class:`BlockPrefixCache` cuts a prompt into full blocks of ``block_size`` tokens; block
``i`` is identified by a hash chained over blocks ``0..i``, so a block only matches after
an identical prefix. A request hits the longest run of leading blocks present in the
cache -- at most ``(len - 1) // block_size`` blocks, because the last prompt token is
always computed, as in vLLM -- then all its full blocks are inserted or refreshed, and the
least recently used blocks beyond the capacity are evicted. ``queries`` counts prompt
tokens and ``hits`` hit tokens, like vLLM's ``prefix_cache_*`` counters.

Text is tokenised as its UTF-8 bytes; chat messages as ``role\\ncontent\\n`` each.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["BlockPrefixCache", "chat_tokens", "prompt_tokens"]


class BlockPrefixCache:
    """A block-granular LRU prefix cache with chained block hashes."""

    def __init__(self, block_size: int, capacity_blocks: int) -> None:
        if block_size < 1 or capacity_blocks < 1:
            raise ValueError(f"block_size and capacity_blocks must be >= 1, got "
                             f"{block_size}, {capacity_blocks}")
        self.block_size = block_size
        self.capacity = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queries = 0
        self.hits = 0

    def _chain(self, tokens: Sequence[int]) -> list[int]:
        hashes: list[int] = []
        previous = 0
        size = self.block_size
        for start in range(0, len(tokens) - size + 1, size):
            previous = hash((previous, *tokens[start:start + size]))
            hashes.append(previous)
        return hashes

    def admit(self, tokens: Sequence[int]) -> int:
        """Look the prompt up, count it, insert its blocks; returns the hit tokens."""
        chain = self._chain(tokens)
        usable = max(0, (len(tokens) - 1) // self.block_size)
        hit_blocks = 0
        for block in chain[:usable]:
            if block not in self._blocks:
                break
            hit_blocks += 1
        for block in chain:
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
        hit_tokens = hit_blocks * self.block_size
        self.queries += len(tokens)
        self.hits += hit_tokens
        return hit_tokens

    def __len__(self) -> int:
        return len(self._blocks)



def tokens_of_text(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def chat_tokens(messages: object) -> list[int]:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    text = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise ValueError("each message needs a string 'content'")
        text.append(f"{message.get('role', 'user')}\n{message['content']}\n")
    return tokens_of_text("".join(text))


def prompt_tokens(prompt: object) -> list[list[int]]:
    """A completion ``prompt``: text, token ids, or a batch of either."""
    if isinstance(prompt, str):
        return [tokens_of_text(prompt)]
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [list(prompt)]
    if isinstance(prompt, list) and prompt:
        return [p for item in prompt for p in prompt_tokens(item)]
    raise ValueError("prompt must be a string, a list of token ids, or a batch of those")
