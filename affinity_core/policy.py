"""Routing policy: the keep rule, the tie set and deterministic placement (SPEC §7-§9).

Theory of operation
-------------------
Three pure functions decide every acquire; :mod:`affinity_core.machine` only sequences
them. Loads are read *before* the acquiring request is counted (R-KEEP-2).

:func:`keep_pin` (R-KEEP-1, R-BAND-1, R-GATE-1, R-DET-4), on a sticky hit on an active
pin ``p``:

* ``full_determinism`` or the legacy policy: always keep;
* margin ``m``: keep iff ``L[p] <= min(L) + band``, where ``band`` is ``m``, or with the
  context band ``min(m + c // T, cap)`` for the acquire's ``context_tokens`` ``c``
  (absent counts as 0). The minimum includes ``p`` and the bound is inclusive;
* dual threshold ``(abs, rel)``: keep iff ``L[p] == min(L)`` or the pool is not
  imbalanced: ``abs > 0 and max - min > abs and max > min * rel`` (integers only).

:func:`keep_group_pin` (R-GRP-3) is the same decision for a group's pin, with
``group_break_margin`` in place of the policy when it is set.

:func:`placement_key` (R-GRP-6) is the id a placement hashes: the group id of a grouped
acquire, so that under ``full_determinism`` every sibling lands where its group does, and
the request id otherwise.

:func:`least_loaded` (R-TIE-1..4) returns ``T[k]``, the ``k``-th of the servers tied at the
minimum load in pool order: ``k = 0`` (``first``), ``tie_draw mod t`` (``draw``) or
``stable_hash(key) mod t`` (``hashed``, ``key`` the placement key; an unkeyed request
falls back to the draw).

With prefix-aware placement (R-PFX-2..4) the servers it picks among are
:func:`candidates` instead of ``T``: of the *admissible* servers, ``L[s] <= min(L) +
m_place`` and not the pin being broken, those with the most cached prefix tokens (the
acquire's ``cached_prefix``, absent counting 0), and of those the least loaded. The
tie-break then picks among them exactly as among ``T``. With ``m_place`` null the
candidates are ``T`` itself, and the estimate is never read.

:func:`deterministic_server` (R-DET-2, R-DET-3) ignores load: ``pool[request_hash mod n]``
(``caller``) or ``sorted(pool)[stable_hash(key) mod n]`` (``stable``).

:func:`needs_draw` (R-TIE-5) and :func:`needs_request_hash` (R-DET-5) say, from the
configuration alone, whether ``step`` can read an acquire's ``tie_draw`` and
``request_hash``. Where it cannot, every value gives the same transition, so a caller
makes no draw and computes no hash there.
"""

from __future__ import annotations

from .config import Config, HashMode, TieBreak
from .events import Acquire
from .hashing import stable_hash
from .state import State, load, loads

__all__ = ["admissible", "candidates", "deterministic_server", "is_grouped", "keep_band",
           "keep_group_pin", "keep_pin", "least_loaded", "needs_draw", "needs_request_hash",
           "placement_key", "tie_index", "tie_set"]


def keep_band(config: Config, context_tokens: int | None) -> int | None:
    """The skew a sticky hit tolerates: the margin, widened by the context band (R-BAND-1)."""
    margin, tokens, cap = (config.affinity_break_margin, config.affinity_break_tokens,
                           config.affinity_break_band_cap)
    if margin is None or tokens is None or cap is None:
        return margin
    return min(margin + (context_tokens or 0) // tokens, cap)


def keep_pin(config: Config, state: State, pinned: str, context_tokens: int | None) -> bool:
    """Whether a sticky hit on the active server ``pinned`` keeps its pin."""
    if config.full_determinism:
        return True
    low = min(loads(state))
    band = keep_band(config, context_tokens)
    if band is not None:
        return load(state, pinned) <= low + band
    gate = config.dual_threshold
    if gate is None:
        return True  # the legacy policy never reconsiders a pin
    high = max(loads(state))
    rel = gate.balance_rel_threshold
    imbalanced = (gate.balance_abs_threshold > 0
                  and high - low > gate.balance_abs_threshold
                  and high * rel.denominator > low * rel.numerator)
    return load(state, pinned) == low or not imbalanced


def is_grouped(config: Config, event: Acquire) -> bool:
    """Whether the acquire's group is read: group stickiness on, a group id, and a request
    id (an unkeyed acquire is never pinned, R-GRP-2)."""
    return config.groups and event.group_id is not None and event.request_id is not None


def keep_group_pin(config: Config, state: State, pinned: str, context_tokens: int | None
                   ) -> bool:
    """Whether a group hit on the active server ``pinned`` keeps the group's pin (R-GRP-3)."""
    margin = config.group_break_margin
    if margin is None or config.full_determinism:
        return keep_pin(config, state, pinned, context_tokens)
    return load(state, pinned) <= min(loads(state)) + margin


def placement_key(config: Config, event: Acquire) -> str | None:
    """The id a placement hashes (R-GRP-6): the group's for a grouped acquire."""
    if is_grouped(config, event):
        return event.group_id
    return event.request_id


def tie_set(state: State) -> tuple[str, ...]:
    """The active servers at the minimum load, in pool order (R-TIE-1)."""
    low = min(loads(state))
    return tuple(server_id for server_id in state.pool if load(state, server_id) == low)


def tie_index(config: Config, ties: int, event: Acquire) -> int:
    """Which of the ``ties`` least-loaded servers the tie-break takes."""
    if config.tie_break is TieBreak.FIRST:
        return 0
    key = placement_key(config, event)
    if config.tie_break is TieBreak.HASHED and key is not None:
        return stable_hash(key) % ties
    return event.tie_draw % ties


def admissible(config: Config, state: State, moving_from: str | None) -> tuple[str, ...]:
    """R-PFX-2: the active servers with ``L[s] <= min(L) + m_place``, in pool order, less
    ``moving_from``, the pin a break moves the request off (so a re-pin always moves)."""
    assert config.placement_margin is not None
    bound = min(loads(state)) + config.placement_margin
    return tuple(server_id for server_id in state.pool
                 if load(state, server_id) <= bound and server_id != moving_from)


def candidates(config: Config, state: State, event: Acquire,
               moving_from: str | None = None) -> tuple[str, ...]:
    """The servers a load-aware placement picks among, in pool order: the tie set
    (R-TIE-1), or with prefix-aware placement the admissible servers with the most cached
    prefix tokens and, among those, the least load (R-PFX-3)."""
    if not config.prefix_placement:
        return tie_set(state)
    estimate = dict(event.cached_prefix)
    servers = admissible(config, state, moving_from)
    most = max(estimate.get(server_id, 0) for server_id in servers)
    cached = tuple(s for s in servers if estimate.get(s, 0) == most)
    lightest = min(load(state, server_id) for server_id in cached)
    return tuple(server_id for server_id in cached if load(state, server_id) == lightest)


def least_loaded(config: Config, state: State, event: Acquire,
                 moving_from: str | None = None) -> str:
    """The load-aware placement: the tie-break's pick among :func:`candidates`."""
    ties = candidates(config, state, event, moving_from)
    return ties[tie_index(config, len(ties), event)]


def deterministic_server(config: Config, state: State, event: Acquire) -> str:
    """The load-blind placement of ``full_determinism``; the caller checked the inputs."""
    if config.hash_mode is HashMode.STABLE:
        key = placement_key(config, event)
        assert key is not None
        ordered = sorted(state.pool)
        return ordered[stable_hash(key) % len(ordered)]
    assert event.request_hash is not None
    return state.pool[event.request_hash % len(state.pool)]


def needs_draw(config: Config, request_id: str | None) -> bool:
    """Whether ``step`` can read the ``tie_draw`` of an acquire keyed by ``request_id``
    (R-TIE-5): only a least-loaded choice reads it, never under ``full_determinism``,
    and only under ``draw``, or ``hashed`` for an unkeyed request."""
    if config.full_determinism:
        return False
    return config.tie_break is TieBreak.DRAW or (
        config.tie_break is TieBreak.HASHED and request_id is None)


def needs_request_hash(config: Config) -> bool:
    """Whether ``step`` can read an acquire's ``request_hash`` (R-DET-5): only
    ``full_determinism`` with ``hash_mode = "caller"`` does."""
    return config.full_determinism and config.hash_mode is HashMode.CALLER
