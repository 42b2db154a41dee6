"""Environments for the BFS checker: which events the callers can send, and what is
really in flight.

Theory of operation
-------------------
:class:`FreeEnv` is the adversary: any acquire (every request id, every tie draw, unkeyed
requests), any release (known, unknown or idle servers; in lease mode with every request
id), any add/remove of a server of the universe, and clears. It carries no state. Every
named predicate of ``affinity_conformance.invariants`` must hold under it.

:class:`InFlightEnv` (obligation 9) tracks, per server, the requests the callers really
have in flight: ``current`` (started in the server's current stay in the pool) and
``stale`` (started before its last removal). It issues only *matched* releases. By
default it produces well-formed traces only -- adds of inactive servers, removals of idle
ones -- and then every active server's count must equal its ``current`` requests. Each of
the two flags admits one hazard of upstream-verl.md section 6 (add-on-active reset; a
busy removal followed by a late release), and the BFS must then *find* the documented
exception.

:class:`LeaseEnv` (obligation 14) tracks every grant ``(request_id, server, age)``, where
age 0 means "granted in the server's current stay". It sends genuine releases of
outstanding grants and bogus ones (double or phantom: no grant of that request on that
server is outstanding). A release names only ``(request_id, server)``, so the core settles a pair's
leases oldest stay first (R-LEASE-3: a conversation's turns are sequential). With
``attributable_only`` the environment keeps to what that rule can attribute: a pair's
grants are released oldest stay first, and a bogus release names a pair with no grant
outstanding. Without it (any grant released in any order, duplicates of a pair that has
a request in flight), the BFS must find the miscount that the ambiguity allows.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

import attrs

from affinity_engine import (
    Acquire,
    Acquired,
    AddServers,
    ClearStickyCache,
    Config,
    Event,
    HashMode,
    ObserveLoads,
    Release,
    RemoveServers,
    State,
    TieBreak,
    Transition,
)

__all__ = ["FreeEnv", "InFlightEnv", "LeaseEnv", "Universe", "acquires", "contexts",
           "pool_changes"]

Move = tuple[Event, Hashable]


@attrs.frozen
class Universe:
    servers: tuple[str, ...]
    initial_pool: tuple[str, ...]
    request_ids: tuple[str, ...]
    unkeyed: bool = True
    observe_max: int = 0  # > 0: ObserveLoads of one active server, values 0..observe_max


def contexts(config: Config) -> tuple[int | None, ...]:
    """The ``context_tokens`` values an acquire carries: none, unless the context band is
    configured; then absent, 0, T - 1, T, 2T and a huge one (every side of the first two
    steps of ``c // T``, and far past the cap)."""
    t = config.affinity_break_tokens
    if t is None:
        return (None,)
    return tuple(dict.fromkeys((None, 0, t - 1, t, 2 * t, 10**9)))


def acquires(config: Config, state: State, universe: Universe) -> Iterable[Move]:
    """Every acquire: each request id (and unkeyed), each distinct tie draw, and with the
    context band each context of :func:`contexts`."""
    draws = range(max(len(state.pool), 1)) if config.tie_break is not TieBreak.FIRST else (0,)
    contexts_sent = contexts(config)
    caller_hash = config.full_determinism and config.hash_mode is HashMode.CALLER
    rids: list[str | None] = list(universe.request_ids)
    if universe.unkeyed:
        rids.append(None)
    for i, rid in enumerate(rids):
        hashed_keyed = config.tie_break is TieBreak.HASHED and rid is not None
        # verl's hash(request_id) is fixed per id within a process; the checker also sends
        # a negative one (R-DET-2's floored mod; huge ones are the decision table's), and
        # acquires without a hash (refused in caller mode, accepted in stable mode: R-ACQ-9).
        hashes: tuple[int | None, ...] = (None,)
        if config.full_determinism:
            hashes = (7 * i + 1, -(7 * i + 2), None) if caller_hash else (None, -(7 * i + 2))
        for draw in (0,) if hashed_keyed else draws:
            for request_hash in hashes:
                for context in contexts_sent:
                    yield Acquire(request_id=rid, tie_draw=draw, request_hash=request_hash,
                                  context_tokens=context), "acquire"


def pool_changes(universe: Universe, state: State, *, add_active: bool = True,
                 remove_busy: bool = True) -> Iterable[Move]:
    for sid in universe.servers:
        if add_active or sid not in state.pool:
            yield AddServers(server_ids=(sid,)), "add"
        if remove_busy or state.pool.load(sid) == 0:
            yield RemoveServers(server_ids=(sid,)), "remove"
    yield ClearStickyCache(), "clear"


@attrs.frozen
class FreeEnv:
    universe: Universe

    def initial(self, config: Config, state: State) -> Hashable:
        return ()

    def moves(self, config: Config, state: State, env: Hashable) -> Iterable[Move]:
        yield from acquires(config, state, self.universe)
        rids: list[str | None] = [None]
        if config.lease_accounting:
            rids.extend(self.universe.request_ids)
        for sid in self.universe.servers:
            for rid in rids:
                yield Release(server_id=sid, request_id=rid), "release"
        yield from pool_changes(self.universe, state)
        if self.universe.observe_max:
            for sid in state.pool.servers:
                for value in range(self.universe.observe_max + 1):
                    yield ObserveLoads(observed=((sid, value),)), "observe"

    def advance(self, config: Config, pre: State, env: Hashable, label: Hashable,
                event: Event, t: Transition) -> Hashable | None:
        return ()

    def rename(self, env: Hashable, mapping: dict[str, str]) -> Hashable:
        return env


# InFlightEnv state: per server of the universe, (current, stale) in-flight requests.
Counts = tuple[tuple[int, int], ...]


@attrs.frozen
class InFlightEnv:
    universe: Universe
    cap: int
    add_active: bool = False  # hazard 3: add-on-active reset
    remove_busy: bool = False  # hazard 2: busy removal, then late releases

    def initial(self, config: Config, state: State) -> Hashable:
        return tuple((0, 0) for _ in self.universe.servers)

    def moves(self, config: Config, state: State, env: Hashable) -> Iterable[Move]:
        counts: Counts = env  # type: ignore[assignment]
        yield from acquires(config, state, self.universe)
        for sid, (current, stale) in zip(self.universe.servers, counts, strict=True):
            if current:
                yield Release(server_id=sid), "matched release"
            if stale:
                yield Release(server_id=sid), "late release"
        for sid, (current, stale) in zip(self.universe.servers, counts, strict=True):
            if self.add_active or sid not in state.pool:
                yield AddServers(server_ids=(sid,)), "add"
            if sid in state.pool and (self.remove_busy or current == stale == 0):
                yield RemoveServers(server_ids=(sid,)), "remove"
        yield ClearStickyCache(), "clear"

    def advance(self, config: Config, pre: State, env: Hashable, label: Hashable,
                event: Event, t: Transition) -> Hashable | None:
        counts = list(env)  # type: ignore[call-overload]
        index = {s: i for i, s in enumerate(self.universe.servers)}
        if isinstance(t.outcome, Acquired):
            i = index[t.outcome.server_id]
            counts[i] = (counts[i][0] + 1, counts[i][1])
        elif isinstance(event, Release):
            i = index[event.server_id]
            current, stale = counts[i]
            counts[i] = (current - 1, stale) if label == "matched release" else (current,
                                                                                 stale - 1)
        elif isinstance(event, RemoveServers):
            for sid in event.server_ids:
                if sid in pre.pool:
                    i = index[sid]
                    counts[i] = (0, counts[i][0] + counts[i][1])
        if any(c > self.cap or s > self.cap for c, s in counts):
            return None
        return tuple(counts)

    def rename(self, env: Hashable, mapping: dict[str, str]) -> Hashable:
        counts: Counts = env  # type: ignore[assignment]
        by_name = dict(zip(self.universe.servers, counts, strict=True))
        inverse = {v: k for k, v in mapping.items()}
        return tuple(by_name[inverse[s]] for s in self.universe.servers)


# LeaseEnv state: sorted multiset of outstanding grants (request id or "", server, age).
Grant = tuple[str, str, int]


def _rid(name: str) -> str | None:
    return name or None


@attrs.frozen
class LeaseEnv:
    universe: Universe
    cap: int  # at most this many outstanding grants
    attributable_only: bool = True

    def initial(self, config: Config, state: State) -> Hashable:
        return ()

    def _rids(self) -> Sequence[str]:
        return ("", *self.universe.request_ids) if self.universe.unkeyed else \
            self.universe.request_ids

    def moves(self, config: Config, state: State, env: Hashable) -> Iterable[Move]:
        grants: tuple[Grant, ...] = env  # type: ignore[assignment]
        yield from acquires(config, state, self.universe)
        for grant in sorted(set(grants)):
            rid, sid, age = grant
            oldest = max(a for r, s, a in grants if (r, s) == (rid, sid))
            if not self.attributable_only or age == oldest:
                yield Release(server_id=sid, request_id=_rid(rid)), ("genuine", grant)
        for sid in self.universe.servers:
            for rid in self._rids():
                held = any((r, s) == (rid, sid) for r, s, _ in grants)
                if not held or not self.attributable_only:
                    yield Release(server_id=sid, request_id=_rid(rid)), ("bogus",)
        yield from pool_changes(self.universe, state)

    def advance(self, config: Config, pre: State, env: Hashable, label: Hashable,
                event: Event, t: Transition) -> Hashable | None:
        grants: list[Grant] = list(env)  # type: ignore[call-overload]
        if isinstance(t.outcome, Acquired):
            assert isinstance(event, Acquire)
            grants.append((event.request_id or "", t.outcome.server_id, 0))
        elif isinstance(label, tuple) and label[0] == "genuine":
            grants.remove(label[1])
        elif isinstance(event, RemoveServers):
            gone = {s for s in event.server_ids if s in pre.pool}
            grants = [(r, s, a + 1 if s in gone else a) for r, s, a in grants]
        if len(grants) > self.cap or any(a > 2 for _, _, a in grants):
            return None
        return tuple(sorted(grants))

    def rename(self, env: Hashable, mapping: dict[str, str]) -> Hashable:
        grants: tuple[Grant, ...] = env  # type: ignore[assignment]
        return tuple(sorted((r, mapping[s], a) for r, s, a in grants))
