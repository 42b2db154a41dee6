"""Run an implementation and the reference core side by side, event by event.

Theory of operation
-------------------
:class:`Lockstep` holds one fresh implementation instance and the core state for one
trace. For each event it calls the implementation's verl API, steps the core, and
compares what verl's API lets anyone observe:

* acquire: the returned server, or the exception (``no_servers`` must raise with verl's
  exact text, which verl's callers match);
* clear_sticky_cache: ``cleared_entries`` and ``server_loads`` (in pool order);
* after every event, ``get_status()``: ``servers`` (order included), ``total_inflight``,
  ``active_servers``, and -- where the implementation reports them --
  ``registered_handles``, ``affinity_kept``, ``affinity_broken``,
  ``affinity_break_margin``, ``sticky_entries``, the lease and external-load keys;
* release, add and remove must not raise.

Tie modes (R-REL-2):

* ``first`` -- exact: the core runs with ``tie_break="first"`` (or ``"hashed"`` when the
  case says so) and every choice must equal the core's;
* ``any`` -- refinement: the core runs with ``tie_break="draw"``; a choice must be in
  :func:`affinity_engine.allowed`, and the tie draw that picks it (what
  :func:`affinity_engine.draw_for` returns) is fed back, so the two states stay comparable
  after a random tie.

The acquire's ``context_tokens`` (the context band's ``c``) reaches the implementation
the way verl 0.9.1's client sends declared fields: only when the instance lists it in
``require_acquire_fields()`` and the event carries it. ``"prompt_ids"`` gets a sequence of
``c`` token ids (a list up to :data:`PROMPT_LIST_LIMIT` ids, beyond that a ``range``, so a
huge ``c`` costs no memory; only its length means anything), ``"context_tokens"`` the count.

An acquire that carries a ``group_id`` (SPEC section 7.6) reaches the implementation in PR
#6122's call shape, ``acquire_server(request_id=..., request_group_id=group_id)``; one
without is called exactly as before. An implementation whose ``acquire_server`` refuses
the keyword is told so in words (R-GRP-2), not with a traceback. An acquire that carries
a ``cached_prefix`` estimate (SPEC section 8.1) passes it as ``cached_prefix={server_id:
tokens}``; one without passes nothing.

Under ``full_determinism`` with ``hash_mode="caller"`` the core's ``request_hash`` is
``hash(placement key)`` -- ``hash(request_id)``, or a grouped acquire's ``hash(group_id)``
(R-GRP-6), computed in this process: the same process and the same salt the
implementation's own ``hash()`` uses (verl 0.9.1 and Affinity's adapter both hash this
way). The recorded ``request_hash`` of a vector is therefore ignored for implementations.

:meth:`Lockstep.feed` returns the events as fed to the core (tie draws and hashes made
explicit), so a failing trace can be written as a vector that replays exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from affinity_core.policy import placement_key
from affinity_engine import (
    NO_SERVERS_MESSAGE,
    Acquire,
    Acquired,
    AddServers,
    ClearStickyCache,
    Config,
    Event,
    HashMode,
    ObserveLoads,
    Rejected,
    RejectReason,
    Release,
    RemoveServers,
    State,
    StickyCacheCleared,
    TieBreak,
    allowed,
    initial_state,
    status,
    step,
)
from affinity_engine.values import evolve

from .diagnosis import (
    describe_event,
    explain_acquire,
    explain_counters,
    explain_state_change,
    note_repin,
)
from .impl_loader import GROUP_FIELD, PREFIX_FIELD, Impl, context_field
from .invariants import group_pins

__all__ = ["COMPARED_STATUS_KEYS", "PROMPT_LIST_LIMIT", "Divergence", "Lockstep",
           "acquire_extra", "oracle_config"]

PROMPT_LIST_LIMIT = 1 << 20  # token ids sent as a real list (8 MiB); longer: a range

COMPARED_STATUS_KEYS = ("servers", "total_inflight", "active_servers", "registered_handles",
                        "affinity_kept", "affinity_broken", "affinity_break_margin",
                        "sticky_entries", "unknown_leases", "stale_leases", "external_loads",
                        "group_entries", "group_kept", "group_broken")
_ALWAYS = ("servers", "total_inflight", "active_servers")
# The group map's status (R-GRP-5): compared where both the spec (group stickiness on) and
# the implementation report it.
_GROUP_STATUS = ("group_entries", "group_kept", "group_broken")


@attrs.frozen
class Divergence:
    """The first step at which the implementation and the spec disagree."""

    index: int  # 0-based position of the event in the trace
    event: str  # the event in words
    words: str
    requirements: tuple[str, ...]
    context: tuple[str, ...]  # the previous events in words (at most two)

    def render(self) -> str:
        before = f" (after {'; '.join(self.context)})" if self.context else ""
        ids = ", ".join(self.requirements)
        return f"step {self.index + 1} {self.event}{before}: {self.words} [{ids}]"


def oracle_config(config: Config, tie_mode: str) -> Config:
    """The core configuration that judges an implementation in ``tie_mode``."""
    if config.tie_break is TieBreak.HASHED:
        return config
    wanted = TieBreak.FIRST if tie_mode == "first" else TieBreak.DRAW
    return attrs.evolve(config, tie_break=wanted)


def impl_tie_option(config: Config, tie_mode: str) -> str | None:
    """The ``tie_break`` option to pass the implementation (if it takes one)."""
    if config.tie_break is TieBreak.HASHED:
        return "hashed"
    return "first" if tie_mode == "first" else None


def _server_of(result: Any) -> Any:
    return result[0] if isinstance(result, tuple) and result else result


def _as_pairs(value: Any) -> Any:
    if isinstance(value, Mapping):
        return [[k, v] for k, v in value.items()]
    return value


class Lockstep:
    """One implementation instance and the core, fed the same events."""

    def __init__(self, impl: Impl, instance: Any, config: Config, servers: Sequence[str],
                 tie_mode: str, state: State | None = None) -> None:
        self.impl, self.instance, self.config, self.tie_mode = impl, instance, config, tie_mode
        self.state = state if state is not None else initial_state(config, servers)
        self.fed: list[Event] = []
        self.current: Event | None = None  # the event being applied, as the core sees it
        self._descriptions: list[str] = []
        self._evicted: dict[str, tuple[int, str]] = {}
        self._repinned: dict[str, tuple[str, str]] = {}  # id -> (step, pin before its break)
        self._pre: State = self.state  # the state before the current event
        self.random_ties = 0  # acquires where IMPL took another allowed server (fed back)
        self._context_field = context_field(instance)  # read once, as verl's client does

    def _divergence(self, words: str, reqs: Sequence[str]) -> Divergence:
        index = len(self._descriptions) - 1
        return Divergence(index, self._descriptions[-1], words,
                          tuple(dict.fromkeys(reqs)), tuple(self._descriptions[-3:-1]))

    def feed(self, events: Sequence[Event]) -> Divergence | None:
        for event in events:
            found = self.apply(event)
            if found is not None:
                return found
        return None

    def apply(self, event: Event) -> Divergence | None:
        self._descriptions.append(describe_event(event))
        self.current = event
        self._pre = self.state
        found = self._acquire(event) if isinstance(event, Acquire) else self._other(event)
        if found is not None:
            return found
        return self._compare_status(event)

    # ----------------------------------------------------------------- acquire
    def _acquire(self, event: Acquire) -> Divergence | None:
        config, pre = self.config, self.state
        if (config.full_determinism and config.hash_mode is HashMode.CALLER
                and event.request_id is not None):
            event = evolve(event, request_hash=hash(placement_key(config, event)))
        if config.tie_break is not TieBreak.DRAW:
            event = evolve(event, tie_draw=0)
        self.current = event
        permitted_set = allowed(config, pre, event)
        permitted = [s for s, _ in pre.pool.items() if s in permitted_set]
        try:
            extra = acquire_extra(self._context_field, event.context_tokens)
            if event.group_id is not None:
                extra[GROUP_FIELD] = event.group_id
            if event.cached_prefix:
                extra[PREFIX_FIELD] = dict(event.cached_prefix)
            result: Any = self.instance.acquire_server(request_id=event.request_id, **extra)
            chosen, raised = _server_of(result), None
        except Exception as exc:
            chosen, raised = None, exc
        if not permitted:
            t = step(config, pre, event)
            assert isinstance(t.outcome, Rejected)
            if raised is None:
                return self._divergence(
                    f"IMPL returned {chosen!r}, the spec rejects it ({t.outcome.reason.value}: "
                    f"{t.outcome.message})",
                    ["R-ACQ-5"] if t.outcome.reason is RejectReason.NO_SERVERS else ["R-ACQ-9"])
            if (t.outcome.reason is RejectReason.NO_SERVERS
                    and NO_SERVERS_MESSAGE not in str(raised)):
                return self._divergence(
                    f"IMPL raised {type(raised).__name__}({str(raised)!r}); the spec's "
                    f"rejection carries verl's exact text {NO_SERVERS_MESSAGE!r}", ["R-ACQ-5"])
            return self._advance(event, t.state, t.outcome)
        random_tie = config.tie_break is TieBreak.DRAW or (
            config.tie_break is TieBreak.HASHED and event.request_id is None)
        exact = self.tie_mode == "first" or not random_tie
        # Everything read from ``pre`` is read before ``pre`` is stepped: a stepped state's
        # sticky map is no longer its log's tip, and the next read of it re-derives the
        # whole map (StickyLru, "a non-tip version"), once per acquire here.
        victim = _victim(pre, event)
        fed = event if exact or raised is not None else _with_choice(permitted, event, chosen)
        t = step(config, pre, event)
        assert isinstance(t.outcome, Acquired)
        reference = t.outcome.server_id
        ok = chosen == reference if exact else chosen in permitted_set
        if raised is not None or not ok:
            # A divergence ends the run: this one re-derivation of pre's map is paid once.
            words, reqs = explain_acquire(config, pre, event, chosen if raised is None else None,
                                          permitted, reference if exact else None,
                                          self._evicted, self._repinned)
            if _reads_group(config, pre, event):
                words, reqs = _explain_group(pre, event, t.outcome, words, reqs)
            if raised is not None:
                words += f" (IMPL raised {type(raised).__name__}: {raised})"
                if event.group_id is not None and _refused_group_field(raised):
                    words = (f"acquire_server does not take {GROUP_FIELD} (PR #6122's call "
                             f"shape, acquire_server(request_id, {GROUP_FIELD}=...)), so the "
                             f"group id {event.group_id!r} cannot reach it: "
                             f"{type(raised).__name__}: {raised}")
                    reqs = ["R-GRP-2"]
            return self._divergence(words, reqs)
        if not exact:
            self.random_ties += chosen != reference
            if chosen != reference:  # IMPL took another tied server: step the draw for it
                t = step(config, pre, fed)  # the one re-derivation such an acquire costs
            # else the draw only changes which tie would be taken, and the same server was:
            # the transition (state and outcome) is the reference's, so it is kept as is.
            event = fed
        return self._advance(event, t.state, t.outcome, victim)

    def _advance(self, event: Event, state: State, outcome: object,
                 victim: tuple[str, str] | None = None) -> Divergence | None:
        """Commit the step; never diverges (returns None so callers can return it).

        ``victim`` is the entry an acquire's write would evict, read before stepping."""
        if isinstance(outcome, Acquired) and outcome.evicted is not None:
            if victim is None or victim[0] != outcome.evicted:
                old = self.state.lru.peek(outcome.evicted)  # not expected: read it late
                victim = None if old is None else (outcome.evicted, old)
            if victim is not None:
                self._evicted[victim[0]] = (len(self._descriptions) - 1, victim[1])
        note_repin(self._repinned, event, outcome, f"step {len(self._descriptions)}")
        self.fed.append(event)
        self.state = state
        return None

    # ------------------------------------------------------------------ others
    def _other(self, event: Event) -> Divergence | None:
        inst = self.instance
        op = describe_event(event).split("(", 1)[0]
        try:
            result: Any = None
            if isinstance(event, Release):
                if event.request_id is not None and self.impl.release_takes_request_id:
                    inst.release_server(event.server_id, request_id=event.request_id)
                else:
                    inst.release_server(event.server_id)
            elif isinstance(event, AddServers):
                inst.add_servers(dict.fromkeys(event.server_ids))
            elif isinstance(event, RemoveServers):
                inst.remove_servers(list(event.server_ids))
            elif isinstance(event, ObserveLoads):
                inst.observe_loads(dict(event.observed))
            elif isinstance(event, ClearStickyCache):
                result = inst.clear_sticky_cache()
        except Exception as exc:
            return self._divergence(f"IMPL raised {type(exc).__name__}: {exc}; the spec "
                                    "accepts every such event", _requirements_for(op))
        t = step(self.config, self.state, event)
        if isinstance(t.outcome, StickyCacheCleared):
            expected: dict[str, Any] = {
                "cleared_entries": t.outcome.cleared_entries,
                "server_loads": [list(p) for p in t.outcome.server_loads]}
            if isinstance(result, Mapping) and "cleared_groups" in result:  # R-GRP-5
                expected["cleared_groups"] = t.outcome.cleared_groups
            if not isinstance(result, Mapping):
                return self._divergence(f"clear_sticky_cache returned {result!r}, expected a "
                                        f"dict like {expected}", ["R-CLR-1"])
            for key, want in expected.items():
                got = _as_pairs(result.get(key))
                if got != want:
                    words, reqs = explain_state_change(op, key, want, got)
                    return self._divergence(words, reqs)
        return self._advance(event, t.state, t.outcome)

    # ------------------------------------------------------------------ status
    def _compare_status(self, event: Event) -> Divergence | None:
        try:
            observed = self.instance.get_status()
        except Exception as exc:
            return self._divergence(f"get_status raised {type(exc).__name__}: {exc}",
                                    ["R-STAT-1"])
        if not isinstance(observed, Mapping):
            return self._divergence(f"get_status returned {observed!r}, not a dict", ["R-STAT-1"])
        spec = status(self.config, self.state)
        op = describe_event(event).split("(", 1)[0]
        for key in COMPARED_STATUS_KEYS:
            if key not in observed and key not in _ALWAYS:
                continue
            if key == "external_loads" and key not in spec and not observed.get(key):
                continue
            if key in _GROUP_STATUS and key not in spec:
                continue
            got, want = _as_pairs(observed.get(key)), _as_pairs(spec.get(key))
            if got == want:
                continue
            current = self.current
            if (isinstance(current, Acquire) and key in ("affinity_kept", "affinity_broken",
                                                         "sticky_entries")
                    and isinstance(got, int) and isinstance(want, int)):
                words, reqs = explain_counters(self.config, self._pre, current, key, spec,
                                               observed, self._evicted, self._repinned)
            else:
                words, reqs = explain_state_change(op, key, want, got)
            return self._divergence(words, reqs)
        return None


def acquire_extra(field: str | None, context_tokens: int | None) -> dict[str, Any]:
    """The declared acquire field carrying ``context_tokens`` (none when not declared or
    not set: verl's client sends only declared fields that are present)."""
    if field is None or context_tokens is None:
        return {}
    if field == "context_tokens":
        return {"context_tokens": context_tokens}
    ids: Sequence[int] = ([0] * context_tokens if context_tokens <= PROMPT_LIST_LIMIT
                          else range(context_tokens))
    return {field: ids}


def _reads_group(config: Config, pre: State, event: Acquire) -> bool:
    """Whether the spec decided ``event`` by the group map (R-GRP-2)."""
    if not (config.groups and event.group_id is not None and event.request_id is not None):
        return False
    return config.group_stickiness.value == "only" or pre.lru.peek(event.request_id) is None


def _explain_group(pre: State, event: Acquire, outcome: Acquired, words: str,
                   reqs: Sequence[str]) -> tuple[str, list[str]]:
    """The group's side of a diverging grouped acquire: its pin and the spec's path."""
    pins = dict(group_pins(pre))
    pin = pins.get(str(event.group_id))
    where = (f"group {event.group_id!r} is pinned to {pin}" if pin is not None
             else f"group {event.group_id!r} has no group pin")
    if pin is not None and pin not in pre.pool:
        where += " (a removed server: the entry is deleted and the sibling re-placed)"
    order = ", ".join(pins) or "empty"
    head = words.split(": ", 1)[0]
    return (f"{head}: {where}; the spec's path is {outcome.path.value} (group map, least "
            f"recent first: {order}; loads {dict(pre.pool.items())})",
            ["R-GRP-2", "R-GRP-4", *reqs])


def _refused_group_field(raised: BaseException) -> bool:
    return isinstance(raised, TypeError) and GROUP_FIELD in str(raised)


def _with_choice(permitted: list[str], event: Acquire, chosen: object) -> Acquire:
    """The event whose tie draw makes the core pick ``chosen`` (refinement, R-REL-2).

    ``permitted`` is :func:`affinity_engine.allowed` in pool order, which for a choice
    among ties is exactly the list the draw indexes (the tie set, or with prefix-aware
    placement the candidates of R-PFX-3), and ``chosen`` is one of them (checked by the
    caller): this is :func:`draw_for` without re-reading the state. Under ``hashed``
    (unkeyed) the draw decides as it does under ``draw``.
    """
    if len(permitted) > 1 and chosen in permitted:
        return evolve(event, tie_draw=permitted.index(chosen))
    return event


def _victim(pre: State, event: Acquire) -> tuple[str, str] | None:
    """The entry (key, server) of ``pre``'s sticky map that ``event``'s write would evict."""
    if event.request_id is None:
        return None
    key = pre.lru.evicts_on_put(event.request_id)
    server = None if key is None else pre.lru.peek(key)
    return None if key is None or server is None else (key, server)


def _requirements_for(op: str) -> list[str]:
    return {"release": ["R-RLS-1"], "add_servers": ["R-POOL-1"],
            "remove_servers": ["R-POOL-3"], "clear_sticky_cache": ["R-CLR-1"],
            "observe_loads": ["R-OBS-1"]}.get(op, ["R-OUT-1"])
