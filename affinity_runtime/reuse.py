"""Observed prefix reuse per backend: the context band's ``c`` as what a break throws away.

Theory of operation
-------------------
The context band (SPEC §7.5) widens the keep band by one request per ``T`` tokens of
``context_tokens``. Its premise is that a break costs a re-prefill of the session's cached
context. The prompt length is only an upper bound on that: on a replica whose prefix cache
thrashes, the session's blocks are gone before its next turn is admitted, and a break
throws away nothing. The band then keeps pins that should break (sim/README.md, "Reuse-
scaled context", measured the cost: up to 1.6 points of step time on a thrashing workload).

A router can measure what survives. vLLM reports, with each response, how many of the
prompt's tokens it found in the prefix cache (``usage.prompt_tokens_details.cached_tokens``;
the server needs ``--enable-prompt-tokens-details``). :class:`ReuseMeter` sums, per backend,
the prompt tokens and the cached tokens of *continuing* turns -- turns kept on the backend
that served the session's previous turn (the core's ``kept`` path). Their ratio ``h`` is the
backend's reuse: near 0 where the cache thrashes, near 1 where it is warm.
:meth:`ReuseMeter.scaled` turns a prompt of ``c`` tokens for a session pinned to backend
``p`` into ``c * hits_p // lookups_p``: integer arithmetic, so the value the core receives is
exact and reproducible from a decision log. Before ``p`` has completed a continuing turn
there is no evidence, and the prompt length is sent (the plain band).

The meter is cumulative (no window, so no tuning knob): a replica's regime is a property of
its workload and pool, and the simulator's evidence was produced this way. It is runtime
state next to the core, never inside it: the core sees one integer per acquire and cannot
tell where it came from (R-BAND-3 still holds: without ``T`` the value is ignored).
Shared by ``affinity serve`` and the simulator (``context_source = "reuse"``).
"""

from __future__ import annotations

__all__ = ["MAX_TOKENS", "ReuseMeter"]

# The largest count a report may carry: vLLM's counters are 64-bit. A larger one is a
# corrupt report, and accepting it would outweigh every honest report for good (the sums
# are cumulative) and make the sums too long to print (/status once answered 500 after
# ten reports of 4,299 digits: Python refuses to format ints of more than 4,300 digits).
MAX_TOKENS = 2**63 - 1


class ReuseMeter:
    """Per-backend sums of looked-up and cached prompt tokens of continuing turns."""

    __slots__ = ("hits", "lookups")

    def __init__(self) -> None:
        self.lookups: dict[str, int] = {}
        self.hits: dict[str, int] = {}

    def record(self, server_id: str, prompt_tokens: int, cached_tokens: int) -> None:
        """A continuing turn on ``server_id`` completed with these usage numbers.

        Raises ``ValueError`` (and records nothing) unless ``0 <= cached_tokens <=
        prompt_tokens <= MAX_TOKENS``: a backend reporting more cached than prompt tokens
        is wrong, and one bad report must not skew every later decision."""
        if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) \
                or not 0 <= prompt_tokens <= MAX_TOKENS:
            raise ValueError(f"prompt_tokens must be an integer in [0, {MAX_TOKENS}], "
                             f"got {prompt_tokens!r}")
        if isinstance(cached_tokens, bool) or not isinstance(cached_tokens, int) \
                or not 0 <= cached_tokens <= prompt_tokens:
            raise ValueError(f"cached_tokens must be in [0, prompt_tokens={prompt_tokens}], "
                             f"got {cached_tokens!r}")
        self.lookups[server_id] = self.lookups.get(server_id, 0) + prompt_tokens
        self.hits[server_id] = self.hits.get(server_id, 0) + cached_tokens

    def scaled(self, server_id: str, prompt_tokens: int) -> int:
        """The context a session pinned to ``server_id`` sends for a ``prompt_tokens`` turn.

        Raises ``ValueError`` unless ``prompt_tokens`` is an integer >= 0: a negative one
        came out floored (-7 at half reuse gave -4) and a float came out a float, neither
        a context the core accepts."""
        if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) \
                or prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be an integer >= 0, got {prompt_tokens!r}")
        lookups = self.lookups.get(server_id, 0)
        if lookups == 0:
            return prompt_tokens
        return prompt_tokens * self.hits[server_id] // lookups

    def reuse(self, server_id: str) -> tuple[int, int]:
        """``(cached, looked_up)`` tokens recorded for ``server_id`` (for metrics)."""
        return self.hits.get(server_id, 0), self.lookups.get(server_id, 0)

    def forget(self, server_id: str) -> None:
        """Drop a backend's evidence (it left the pool; a returning one starts afresh)."""
        self.lookups.pop(server_id, None)
        self.hits.pop(server_id, None)
