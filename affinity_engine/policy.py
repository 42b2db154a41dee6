"""Routing policy: the keep rule, least-loaded selection and deterministic placement.

Theory of operation
-------------------
Three pure functions decide every acquire; :mod:`affinity_engine.machine` only sequences
them. Loads are read *before* the acquiring request is counted (R-KEEP-2).

``keep_pin`` (R-KEEP-1, R-GATE-1): on a sticky hit whose server is active,

* legacy policy or ``full_determinism``: always keep;
* margin ``m``: keep iff ``load[pin] <= min(load over the active pool) + m``. The
  minimum includes the pinned server and the bound is inclusive, so margin 0 means
  "move unless already on a least-loaded server";
* context band (``affinity_break_tokens`` T set): the same comparison with ``m`` replaced
  by :func:`keep_band`, ``min(m + c // T, cap)`` for the acquire's ``context_tokens`` c
  (absent counts as 0). A long conversation, whose re-prefill costs more, tolerates more
  skew before it moves, but never more than ``cap`` (R-BAND-1, R-BAND-2);
* dual threshold: keep iff ``load[pin] == min`` or the pool is not imbalanced, where
  imbalanced means ``abs > 0 and max - min > abs and max > min * rel``.

A pin that is not kept is never on a minimum, so the least-loaded choice that replaces
it is always a different server (R-BREAK-1).

``least_loaded`` (R-TIE-1..4) picks the ``k``-th of the ``t`` servers tied at the minimum,
in pool order: ``k = 0`` (``first``), ``k = tie_draw mod t`` (``draw``) or
``k = stable_hash(request_id) mod t`` (``hashed``; unkeyed requests fall back to the
draw).

``prefix_candidates`` (R-PFX-2..4): with prefix-aware placement, one pass over the pool
keeps the servers within ``min + m_place`` (never the pin a break moves off) that have the
most cached prefix tokens and, among those, the least load; the tie-break then picks
among them as among the least-loaded servers. Off the hot path: it runs only when
``placement_margin`` is set.

``deterministic_server`` (R-DET-1..3), under ``full_determinism``, ignores load:
``pool[request_hash mod n]`` (``caller``) or ``sorted(pool)[stable_hash(rid) mod n]``
(``stable``).

``needs_draw`` (R-TIE-5) and ``needs_request_hash`` (R-DET-5): whether ``step`` can read
an acquire's ``tie_draw`` or ``request_hash`` at all, so a driver draws and hashes only
where it matters (the reference's rule, on the plan's fields).

The options these functions and the machine read on every event come from
:func:`plan_of`: a :class:`Plan` copies them from the ``Config`` into typed fields once
and is kept for the last configuration seen (by identity). It changes no decision, only
how an option is read (tests/core/test_fast_paths.py checks it field by field).
"""

from __future__ import annotations

from typing import Final, final

from affinity_core.config import Config, DualThreshold, GroupStickiness, HashMode, TieBreak
from affinity_core.events import Acquire
from affinity_core.hashing import stable_hash

from .loads import LoadTable

__all__ = ["Plan", "deterministic_server", "keep_band", "keep_group_pin", "keep_pin",
           "keyed_deterministic_server", "keyed_least_loaded", "least_loaded", "needs_draw",
           "needs_request_hash", "plan_of", "prefix_candidates", "prefix_placed", "tie_index"]

# The enum members compared on the hot path, read once: in the compiled build a member
# read on the (uncompiled) enum class is a generic attribute lookup on every call.
_FIRST: Final = TieBreak.FIRST
_DRAW: Final = TieBreak.DRAW
_HASHED: Final = TieBreak.HASHED
_STABLE: Final = HashMode.STABLE
_CALLER: Final = HashMode.CALLER
_OFF: Final = GroupStickiness.OFF
_ONLY: Final = GroupStickiness.ONLY


@final
class Plan:
    """The configuration options the hot path reads, as typed fields of a native class.

    ``Config`` is an attrs class outside the compiled build, so each of its attributes
    costs a generic attribute lookup there; an acquire+release pair read five or six.
    A plan copies them once per configuration. It is derived data, never changed after
    construction, and not a value of the model: it is neither in the state nor in any
    outcome.
    """

    __slots__ = ("cap", "config", "full_determinism", "gate", "group_cache", "group_margin",
                 "group_only", "groups", "hash_mode", "lease_accounting", "margin",
                 "placement", "placement_margin", "tie_break", "tokens")

    def __init__(self, config: Config) -> None:
        self.config = config  # the configuration this plan was made from (identity)
        self.full_determinism: bool = config.full_determinism
        self.margin: int | None = config.affinity_break_margin
        self.tokens: int | None = config.affinity_break_tokens
        self.cap: int | None = config.affinity_break_band_cap
        self.gate: DualThreshold | None = config.dual_threshold
        self.tie_break: TieBreak = config.tie_break
        self.hash_mode: HashMode = config.hash_mode
        self.lease_accounting: bool = config.lease_accounting
        # Group pins (R-GRP-1): ``groups`` is the one field the non-group path tests.
        self.groups: bool = config.group_stickiness is not _OFF
        self.group_only: bool = config.group_stickiness is _ONLY
        self.group_margin: int | None = config.group_break_margin
        self.group_cache: int = config.max_group_cache_size
        # Prefix-aware placement (R-PFX-1): ``placement`` is the one field the plain
        # placement path tests; it is false under full_determinism (R-PFX-5).
        self.placement_margin: int | None = config.placement_margin
        self.placement: bool = config.placement_margin is not None and not config.full_determinism


@final
class _LastPlan:
    __slots__ = ("plan",)

    def __init__(self) -> None:
        self.plan: Plan | None = None


# One entry, keyed by the configuration's identity: a balancer steps with one Config for
# its whole life. The entry holds the Config itself, so its identity cannot be reused by
# another object while it is cached; a different Config just replaces the entry. Which
# plan object serves a step is unobservable: its fields are the Config's.
_LAST: Final = _LastPlan()


def plan_of(config: Config) -> Plan:
    """The :class:`Plan` of ``config`` (cached for the last configuration seen)."""
    plan = _LAST.plan
    if plan is not None and plan.config is config:
        return plan
    plan = Plan(config)
    _LAST.plan = plan
    return plan


def keep_band(config: Config, context_tokens: int | None) -> int | None:
    """The skew a sticky hit tolerates: the margin, widened by the context band if set."""
    plan = plan_of(config)
    margin = plan.margin
    tokens = plan.tokens
    if margin is None or tokens is None:
        return margin
    cap = plan.cap
    assert cap is not None  # Config requires the cap with T
    return min(margin + (context_tokens or 0) // tokens, cap)


def keep_pin(
    config: Config, pool: LoadTable, pinned: str, context_tokens: int | None = None
) -> bool:
    """Whether a sticky hit on the active server ``pinned`` keeps its pin.

    ``context_tokens`` is the acquire's field; only the context band reads it.
    """
    plan = plan_of(config)
    if plan.full_determinism:
        return True
    band = keep_band(config, context_tokens)
    if band is not None:
        return pool.load(pinned) <= pool.min_load + band
    gate = plan.gate
    if gate is None:
        return True
    low, high = pool.min_load, pool.max_load
    if pool.load(pinned) == low or gate.balance_abs_threshold <= 0:
        return True
    rel = gate.balance_rel_threshold
    imbalanced = (
        high - low > gate.balance_abs_threshold
        and high * rel.denominator > low * rel.numerator
    )
    return not imbalanced


def keep_group_pin(
    config: Config, pool: LoadTable, pinned: str, context_tokens: int | None = None
) -> bool:
    """Whether a group hit on the active server ``pinned`` keeps the group's pin (R-GRP-3):
    the conversation's keep rule, or ``group_break_margin`` in its place when that is set
    (never under ``full_determinism``, which always keeps)."""
    plan = plan_of(config)
    margin = plan.group_margin
    if margin is None or plan.full_determinism:
        return keep_pin(config, pool, pinned, context_tokens)
    return pool.load(pinned) <= pool.min_load + margin


def keyed_least_loaded(config: Config, pool: LoadTable, event: Acquire, key: str) -> str:
    """:func:`least_loaded` hashing ``key`` (a grouped acquire's group id, R-GRP-6) instead
    of the request id under the ``hashed`` tie-break."""
    ties = pool.tie_count
    mode = plan_of(config).tie_break
    if mode is _FIRST:
        index = 0
    elif mode is _HASHED:
        index = stable_hash(key) % ties
    else:
        index = event.tie_draw % ties
    return pool.least_loaded(index)


def keyed_deterministic_server(
    config: Config, pool: LoadTable, sorted_servers: tuple[str, ...], event: Acquire, key: str
) -> str:
    """:func:`deterministic_server` hashing ``key`` in ``stable`` mode (R-GRP-6); in
    ``caller`` mode ``request_hash`` is already the caller's hash of the key."""
    if plan_of(config).hash_mode is _STABLE:
        return sorted_servers[stable_hash(key) % len(sorted_servers)]
    assert event.request_hash is not None
    return pool.servers[event.request_hash % len(pool.servers)]


def tie_index(config: Config, ties: int, event: Acquire) -> int:
    """Which of the ``ties`` least-loaded servers (pool order) to take."""
    mode = plan_of(config).tie_break
    if mode is _FIRST:
        return 0
    if mode is _HASHED and event.request_id is not None:
        return stable_hash(event.request_id) % ties
    return event.tie_draw % ties


def least_loaded(config: Config, pool: LoadTable, event: Acquire) -> str:
    """A least-loaded active server, chosen by the configured tie-break."""
    return pool.least_loaded(tie_index(config, pool.tie_count, event))


def prefix_candidates(config: Config, pool: LoadTable, event: Acquire,
                      moving_from: str | None) -> list[str]:
    """The servers a prefix-aware placement picks among, in pool order (R-PFX-2, R-PFX-3):
    within ``min + m_place``, not ``moving_from``, the most cached prefix tokens, then the
    least load."""
    margin = plan_of(config).placement_margin
    assert margin is not None
    bound = pool.min_load + margin
    estimate = dict(event.cached_prefix)
    best: list[str] = []
    best_cached = best_load = -1
    for server, load in pool.items():
        if load > bound or server == moving_from:
            continue
        cached = estimate.get(server, 0)
        if cached > best_cached or (cached == best_cached and load < best_load):
            best, best_cached, best_load = [server], cached, load
        elif cached == best_cached and load == best_load:
            best.append(server)
    return best


def prefix_placed(config: Config, pool: LoadTable, event: Acquire, moving_from: str | None,
                  key: str | None) -> str:
    """The tie-break's pick among :func:`prefix_candidates`; ``key`` is what ``hashed``
    hashes (the placement key: a grouped acquire's group id, else the request id)."""
    ties = prefix_candidates(config, pool, event, moving_from)
    mode = plan_of(config).tie_break
    if mode is _FIRST:
        return ties[0]
    if mode is _HASHED and key is not None:
        return ties[stable_hash(key) % len(ties)]
    return ties[event.tie_draw % len(ties)]


def deterministic_server(
    config: Config, pool: LoadTable, sorted_servers: tuple[str, ...], event: Acquire
) -> str:
    """The load-blind placement of ``full_determinism``; the caller checked the inputs."""
    if config.hash_mode is _STABLE:
        assert event.request_id is not None
        return sorted_servers[stable_hash(event.request_id) % len(sorted_servers)]
    assert event.request_hash is not None
    return pool.servers[event.request_hash % len(pool.servers)]


def needs_draw(config: Config, request_id: str | None) -> bool:
    """Whether ``step`` can read the ``tie_draw`` of an acquire keyed by ``request_id``."""
    plan = plan_of(config)
    if plan.full_determinism:
        return False
    mode = plan.tie_break
    return mode is _DRAW or (mode is _HASHED and request_id is None)


def needs_request_hash(config: Config) -> bool:
    """Whether ``step`` can read an acquire's ``request_hash``."""
    plan = plan_of(config)
    return plan.full_determinism and plan.hash_mode is _CALLER
