"""The adapters' estimate of each server's prefix cache: which prompt blocks were routed there.

Theory of operation
-------------------
Prefix-aware placement (SPEC §8.1) needs, for each acquire, how many of the prompt's
tokens each server already holds in its prefix cache (the event's ``cached_prefix``,
R-PFX-7). A router cannot see a backend's cache, but it sees every prompt it sends, so
it keeps what it sent: a :class:`PrefixIndex` holds, per server, the blocks of the prompts
routed there, and answers with the longest run of leading blocks of a new prompt that
the server has been sent.

Blocks follow vLLM's automatic prefix cache (and the stub's model of it,
``affinity_vllm.prefix_cache``): a prompt is cut into full blocks of ``block_size``
units, and block ``i`` is identified by a digest chained over blocks ``0..i``, so a block
matches only behind an identical prefix and a partial last block never matches. The
digest is BLAKE2b (keyless, 16 bytes): deterministic across processes and restarts,
unlike the builtin ``hash()``, and collision-free for practical purposes. A *unit* is a
token id when the caller has them (verl's ``prompt_ids``) or a byte of the UTF-8 prompt
text (an HTTP router that does not tokenise, ``BYTES_PER_TOKEN`` bytes a token, the
estimate the context band uses too); :func:`chain_of_ids` and :func:`chain_of_text` make
the chain, both with blocks of ``block_size`` tokens, so :meth:`PrefixIndex.estimate`
reports matched blocks times ``block_size``.

Bounded memory. Each server's blocks live in an LRU of at most ``capacity_blocks``
digests: routing a prompt refreshes its blocks, and the least recently routed blocks are
forgotten first, as a cache under pressure evicts. :meth:`PrefixIndex.memory` reports the
blocks and bytes held per server. A server that leaves the pool is forgotten
(:meth:`PrefixIndex.forget`); a wrong estimate costs cache hits, never a load bound
(R-PFX-4), so the index may be approximate and starts empty after a restart.
"""

from __future__ import annotations

import array
import hashlib
import sys
from collections import OrderedDict
from collections.abc import Iterable, Sequence

__all__ = ["BYTES_PER_TOKEN", "PrefixIndex", "chain_of_ids", "chain_of_text"]

# Bytes of UTF-8 text per token for the estimate, as the context band's estimate counts.
BYTES_PER_TOKEN = 4
_DIGEST = 16
_ROOT = b"\0" * _DIGEST


def _chain(data: bytes, block_bytes: int) -> list[bytes]:
    view = memoryview(data)
    out: list[bytes] = []
    previous = _ROOT
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        previous = hashlib.blake2b(previous + view[start:start + block_bytes],
                                   digest_size=_DIGEST).digest()
        out.append(previous)
    return out


def chain_of_ids(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """The chained block digests of a prompt given as token ids (full blocks only)."""
    packed = array.array("q", token_ids).tobytes()  # 8 bytes an id, any vocabulary
    return _chain(packed, block_size * 8)


def chain_of_text(text: str, block_size: int) -> list[bytes]:
    """The chained block digests of a prompt given as text: its UTF-8 bytes are the units,
    ``block_size * BYTES_PER_TOKEN`` of them a block."""
    return _chain(text.encode("utf-8", "surrogatepass"), block_size * BYTES_PER_TOKEN)


class PrefixIndex:
    """Per server, the most recently routed prompt blocks (see the module docstring)."""

    def __init__(self, block_size: int, capacity_blocks: int) -> None:
        for name, value in (("block_size", block_size), ("capacity_blocks", capacity_blocks)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self._blocks: dict[str, OrderedDict[bytes, None]] = {}

    def estimate(self, chain: Sequence[bytes], servers: Iterable[str]
                 ) -> tuple[tuple[str, int], ...]:
        """``(server, cached tokens)`` for each of ``servers`` holding a leading block of
        ``chain``: the leading blocks it was sent, in tokens. Servers holding none are
        left out (the core counts them 0)."""
        out: list[tuple[str, int]] = []
        if not chain:
            return ()
        for server in servers:
            held = self._blocks.get(server)
            if not held or chain[0] not in held:
                continue
            matched = 1
            for block in chain[1:]:
                if block not in held:
                    break
                matched += 1
            out.append((server, matched * self.block_size))
        return tuple(out)

    def record(self, server: str, chain: Sequence[bytes]) -> None:
        """The prompt of ``chain`` was routed to ``server``: its blocks become the most
        recent, and the least recent beyond the capacity are forgotten."""
        held = self._blocks.get(server)
        if held is None:
            held = self._blocks[server] = OrderedDict()
        for block in chain:
            held[block] = None
            held.move_to_end(block)
        while len(held) > self.capacity_blocks:
            held.popitem(last=False)

    def forget(self, server: str) -> None:
        """Drop what ``server`` was sent (it left the pool)."""
        self._blocks.pop(server, None)

    def memory(self) -> dict[str, dict[str, int]]:
        """Per server: the blocks held and the bytes they take (the map and its keys)."""
        out: dict[str, dict[str, int]] = {}
        for server, held in self._blocks.items():
            keys = sum(sys.getsizeof(block) for block in held)
            out[server] = {"blocks": len(held), "bytes": sys.getsizeof(held) + keys}
        return out
