"""One driver of the routing core: the state, its events, the draws, leases and the log.

Theory of operation
-------------------
The core (:mod:`affinity_engine`) is a pure function, ``step(config, state, event)``.
Something has to hold the state between calls, turn a request into an event, supply the
two inputs the core may not make itself (a random tie draw and the caller's hash),
remember what is held, and write the decision log. :class:`RoutingDriver` does that, once,
for every runtime user: verl's balancer (``affinity_verl.AffinityLoadBalancer``), the vLLM
router's ``affinity_vllm.routing.RoutingTable`` and the simulator's
``affinity_sim.routing.Balancer`` are thin wrappers over it that add only their own face:
verl's return values and error texts, the router's counters and views, the simulator's
tallies.

* **State.** :attr:`RoutingDriver.state` is the only copy, held in the engine's
  :class:`~affinity_engine.cursor.Cursor` (:attr:`RoutingDriver.cursor`), which the
  compiled build compiles. Every change is one event through :meth:`~RoutingDriver.apply`.
  Each user calls from one thread (a Ray actor runs one call at a time, the router runs
  on its event loop, the simulator is a loop), and ``step`` neither blocks nor yields, so
  no lock is needed.
* **Acquire events.** :meth:`~RoutingDriver.acquire` builds ``Acquire(request_id,
  tie_draw, request_hash, context_tokens, group_id, cached_prefix)`` with the engine's
  fast builder. It
  calls the draw source only where the core can read the draw
  (:func:`affinity_engine.needs_draw`, SPEC R-TIE-5), passing the size of the tie set,
  and the hash source only where the core can read the hash
  (:func:`affinity_engine.needs_request_hash`, R-DET-5), and then only for a string id;
  what it hashes is the acquire's placement key
  (:func:`affinity_core.policy.placement_key`): the group id of a grouped acquire, so
  every sibling of a group lands on the same server (R-GRP-6), else the request id.
  Elsewhere the event carries ``0`` and ``None``. With prefix-aware placement the tie
  set is not what the draw picks from (the candidates of R-PFX-3 are, and only the core
  knows them), so the draw is made over :data:`PREFIX_DRAWS` values, whose residues are
  exactly uniform for every candidate count up to 16. Where a draw is made is therefore the
  core's rule, not each user's. How it is made is the user's choice: :func:`seeded_draw`
  mirrors verl 0.9.1's ``random.choice``, and the router and the simulator pass their
  own seeded sources, so their runs stay reproducible per seed.
* **Releases.** A release without a request id is one ``Release(server_id)`` value per
  active server, built once and reused by the cursor (events are values). The cache holds
  only servers that were in the pool and forgets a server when it is removed.
* **Leases.** :meth:`~RoutingDriver.lease` wraps an acquire in a :class:`Lease` and
  :meth:`~RoutingDriver.end` releases it at most once. A second end is a no-op here
  rather than an undercount in the core. :attr:`~RoutingDriver.held` counts the leases
  per server, including servers that left the pool with requests still running, which the
  core's in-flight count cannot show.
* **Decision log.** With a :class:`~affinity_runtime.decision_log.DecisionLogWriter`
  attached (:meth:`~RoutingDriver.attach_log`), every applied event is recorded with the
  state before it, its outcome and the state after it, and with a reason when the driver
  made the event itself. A write failure is reported by the writer
  (:meth:`~RoutingDriver.log_health`) and routing goes on. With ``required``, an acquire is
  refused while the log cannot be written, and an acquire whose record failed is undone
  (the state goes back to before it). Both raise :class:`DecisionLogUnavailable` and
  change nothing, so every server handed out is in the log. Each user words the refusal
  in its own terms.
* **Warm start.** Attaching a writer whose path already holds a log continues from it
  (R-LOG-3, :mod:`affinity_runtime.warm_start`). The sticky map and counters come back,
  the dead run's requests in flight are released as abandoned, and the pool is brought
  to the configured servers. Each of these is a logged event with its reason.
* **Hot path.** Without a log, an acquire whose event is the request id alone (no draw,
  no hash, no context) and a release without a request id are the cursor's compiled
  :meth:`~affinity_engine.cursor.Cursor.acquire_keyed` and
  :meth:`~affinity_engine.cursor.Cursor.release`, not :meth:`~RoutingDriver.apply`;
  :attr:`~RoutingDriver.plain` says when. verl's adapter then routes through
  :class:`~affinity_engine.cursor.KeyedBalancer` on the same cursor.
  ``tests/verl/test_verl_fast_path.py`` checks that the inline path equals the general one.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterable
from typing import Any, cast

import attrs

from affinity_core.policy import placement_key
from affinity_engine import (
    Acquire,
    Acquired,
    AddServers,
    ClearStickyCache,
    Config,
    Event,
    LoadsObserved,
    ObserveLoads,
    Outcome,
    PoolChanged,
    Rejected,
    Released,
    RemoveServers,
    State,
    StickyCacheCleared,
    acquire_event,
    initial_state,
    needs_draw,
    needs_request_hash,
    release_event,
    stable_hash,
    status,
    step,
)
from affinity_engine.cursor import Cursor

from .decision_log import DecisionLogWriter
from .warm_start import ABANDONED, start_log

__all__ = ["DecisionLogUnavailable", "Lease", "RequestHash", "RoutingDriver", "TieDraw",
           "seeded_draw"]

TieDraw = Callable[[int], int]
"""A source of tie draws: given the size of the tie set (0 for an empty pool), an integer
>= 0. The core takes it modulo the tie count (R-TIE-3)."""

RequestHash = Callable[[str], int]
"""The caller's hash of an acquire's placement key (its request id, or its group id when
it is grouped), for ``hash_mode = "caller"`` (R-DET-2, R-GRP-6)."""

# needs_draw asks only whether an acquire has a request id, not which one.
_KEYED = "keyed"
# lcm(1..16): a draw uniform over this many values is uniform modulo any candidate count
# up to 16 (the draw picks among R-PFX-3's candidates, which only the core computes).
PREFIX_DRAWS = 720720
# What step returns for an acquire (R-OUT-1); for a release it is always Released.
_AcquireOutcome = Acquired | Rejected


def seeded_draw(seed: int | None = None) -> TieDraw:
    """Draws the way verl 0.9.1's ``random.choice`` picks among tied servers: a uniform
    index, one ``randrange`` per draw among two or more ties and none for one. A seed of
    None seeds from ``os.urandom``."""
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "big")
    randrange = random.Random(seed).randrange

    def draw(ties: int) -> int:
        return randrange(ties) if ties > 1 else 0

    return draw


class DecisionLogUnavailable(RuntimeError):
    """An acquire refused because the required decision log cannot be written. Nothing
    changed: the acquire was never applied, or it was undone."""

    def __init__(self, problem: str | None) -> None:
        super().__init__(f"decision log unavailable ({problem})")
        self.problem = problem


@attrs.define
class Lease:
    """One acquired slot on a server, released at most once (:meth:`RoutingDriver.end`)."""

    server_id: str
    request_id: str | None
    path: str  # the acquire's Path value: kept, new, broken, reselected, unkeyed, group_*
    released: bool = False


class RoutingDriver:
    """Config, State and decision log: the single writer of routing state (see the
    module docstring). ``servers`` is the initial pool; ``draw`` the source of tie draws
    and ``request_hash`` the caller's hash (both called only where the core reads them).
    Raises :class:`~affinity_engine.ConfigError` for a pool the core refuses."""

    def __init__(self, config: Config, servers: Iterable[str], *, draw: TieDraw,
                 request_hash: RequestHash = stable_hash) -> None:
        pool = tuple(servers)
        self.config = config
        # The state lives in the engine's cursor, whose hot operations are compiled.
        self.cursor = Cursor(config, initial_state(config, pool))
        self._draw = draw
        self._hash = request_hash
        self._needs_hash = needs_request_hash(config)
        self._groups = config.groups  # whether an acquire's group id is read at all
        self._prefix = config.prefix_placement  # whether its cached_prefix is read
        self._log: DecisionLogWriter | None = None
        self._required = False
        # Leases held per server, counted by the driver (servers that left the pool
        # included); a server's entry stays at 0 once it has been seen.
        self.held: dict[str, int] = dict.fromkeys(pool, 0)
        # The hot path, decided once: no log to write, and a keyed acquire's event is its
        # request id alone (so no draw, no hash and no context band).
        self._plain_release = True
        self._plain_acquire = not (config.context_band or self._needs_hash
                                   or needs_draw(config, _KEYED))

    @property
    def state(self) -> State:
        """The current core state (the cursor's)."""
        return self.cursor.state

    @state.setter
    def state(self, state: State) -> None:
        self.cursor.state = state

    @property
    def plain(self) -> bool:
        """Whether a keyed acquire is the request id alone and nothing is logged, so the
        cursor's :meth:`~affinity_engine.cursor.Cursor.acquire_keyed` and
        :meth:`~affinity_engine.cursor.Cursor.release` are the whole of an acquire and a
        release without a request id."""
        return self._plain_acquire and self._plain_release

    # ------------------------------------------------------------------ the log
    def attach_log(self, writer: DecisionLogWriter, *, configured: Iterable[str],
                   required: bool = False, warm: bool = True) -> str:
        """Start writing the decision log; returns what the start did, for the caller's
        own log. Raises ``DecisionLogLocked`` (and changes nothing) when another writer
        holds the path.

        ``warm``: a log already at the path is replayed and the driver continues from
        its state, releasing the old run's requests in flight as abandoned and bringing
        the pool to the ``configured`` servers, each a logged event with its reason.
        ``required``: refuse acquires while the log cannot be written
        (:class:`DecisionLogUnavailable`)."""
        resumed = start_log(writer, self.config, self.state, warm=warm)
        self.state = resumed.state
        self._log = writer
        self._required = required
        self._plain_acquire = self._plain_release = False
        for release in resumed.abandoned:
            self.apply(release, ABANDONED)
        if resumed.warm:
            wanted = list(configured)
            known = set(wanted)
            gone = [s for s in self.state.pool.servers if s not in known]
            if gone:
                self.remove(gone, "restart: no longer configured")
            back = [s for s in wanted if s not in self.state.pool]
            if back:
                self.add(back, "restart: configured")
        return resumed.message

    @property
    def decision_log(self) -> DecisionLogWriter | None:
        return self._log

    def log_health(self) -> dict[str, Any] | None:
        """The decision log's health (None without a log): path, ok, errors by kind and
        the current problem. Looks for the live file deleted or replaced first."""
        if self._log is None:
            return None
        self._log.check()
        return self._log.health()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()

    # ------------------------------------------------------------------ events
    def apply(self, event: Event, reason: str | None = None) -> Outcome:
        """Step the core with ``event`` and log it (``reason``: why the caller made it).

        Raises :class:`DecisionLogUnavailable` for an acquire the required log cannot
        take; the state is then as before."""
        log = self._log
        if log is None:
            return self.cursor.apply(event)
        required = self._required and isinstance(event, Acquire)
        if required and not log.ready(self.config, self.state):
            raise DecisionLogUnavailable(log.problem)
        before = self.state
        transition = step(self.config, before, event)
        self.state = transition.state
        if not log.record(self.config, before, event, transition.outcome, transition.state,
                          reason=reason) and required:
            self.state = before  # the acquire the log did not take never happened
            raise DecisionLogUnavailable(log.problem)
        return transition.outcome

    def acquire(self, request_id: str | None, context_tokens: int | None = None,
                group_id: str | None = None,
                cached_prefix: Iterable[tuple[str, int]] = ()) -> Acquired | Rejected:
        """Route one request (``request_id`` None: unkeyed). ``context_tokens`` rides on
        the event as given; only the context band reads it. ``group_id`` rides on it with
        group stickiness on, and ``cached_prefix`` (``(server_id, tokens)`` pairs) with
        prefix-aware placement; where the core never reads one (R-GRP-1, R-PFX-1) it is
        left out: the event, its log record and the hot path are those of a caller that
        sends none. A malformed field raises the core's ``EventError`` before anything
        changes."""
        if not self._groups:
            group_id = None
        estimate = tuple(cached_prefix) if self._prefix else ()
        if (context_tokens is None and group_id is None and not estimate
                and request_id is not None):
            return cast(_AcquireOutcome, self.acquire_keyed(request_id))
        return cast(_AcquireOutcome,
                    self._acquire_event(request_id, context_tokens, group_id, estimate))

    def _acquire_event(self, request_id: str | None, context_tokens: int | None,
                       group_id: str | None = None,
                       cached_prefix: tuple[tuple[str, int], ...] = ()) -> Outcome:
        """An acquire with its draw, hash, context, group and estimate, through
        :meth:`apply`."""
        draw = 0
        # Whether the id is present, not the id itself: a malformed one is the builder's
        # to refuse below (EventError), in the compiled build as in the pure one.
        if needs_draw(self.config, None if request_id is None else _KEYED):
            pool = self.state.pool
            draw = self._draw(PREFIX_DRAWS if self._prefix
                              else pool.tie_count if len(pool) else 0)
        event = acquire_event(request_id, draw, None, context_tokens, group_id, cached_prefix)
        if self._needs_hash:
            key = placement_key(self.config, event)  # the group id of a grouped acquire
            if isinstance(key, str):
                event = acquire_event(request_id, draw, self._hash(key), context_tokens,
                                      group_id, cached_prefix)
        return self.apply(event)

    def acquire_keyed(self, request_id: str) -> Outcome:
        """:meth:`acquire` of a keyed request without a context: the hot path of verl's
        balancer (an ``Acquired`` or a ``Rejected``; typed wide, because
        narrowing with ``cast`` is a call per request)."""
        if self._plain_acquire:
            return self.cursor.acquire_keyed(request_id)
        return self._acquire_event(request_id, None)

    def release(self, server_id: str, request_id: str | None = None) -> Released:
        """End one request on ``server_id`` (``request_id`` for lease accounting)."""
        if request_id is None and type(server_id) is str:
            if self._plain_release:
                # A release's outcome is a Released; ``cast`` would be a call per request.
                return self.cursor.release(server_id)  # type: ignore[return-value]
            return cast(Released, self.apply(self.cursor.release_of(server_id)))
        return cast(Released, self.apply(release_event(server_id, request_id)))

    def lease(self, request_id: str | None, context_tokens: int | None = None,
              group_id: str | None = None,
              cached_prefix: Iterable[tuple[str, int]] = ()) -> Lease | Rejected:
        """:meth:`acquire`, held as a :class:`Lease` (counted in :attr:`held`)."""
        outcome = self.acquire(request_id, context_tokens, group_id, cached_prefix)
        if isinstance(outcome, Rejected):
            return outcome
        server_id = outcome.server_id
        self.held[server_id] = self.held.get(server_id, 0) + 1
        return Lease(server_id, request_id, outcome.path.value)

    def end(self, lease: Lease) -> Released | None:
        """Release ``lease`` once; a second call returns None and changes nothing."""
        if lease.released:
            return None
        lease.released = True
        self.held[lease.server_id] -= 1
        return self.release(lease.server_id, lease.request_id)

    def add(self, server_ids: Iterable[str], reason: str | None = None) -> PoolChanged:
        """``AddServers``: each joins with count 0 (R-POOL-2; kept with lease accounting)."""
        ids = list(server_ids)
        outcome = self.apply(AddServers(server_ids=ids), reason)
        assert isinstance(outcome, PoolChanged), outcome
        for server_id in ids:
            self.held.setdefault(server_id, 0)
        return outcome

    def remove(self, server_ids: Iterable[str], reason: str | None = None) -> PoolChanged:
        """``RemoveServers``: unknown ids are ignored; sticky entries are not purged."""
        ids = list(server_ids)
        outcome = self.apply(RemoveServers(server_ids=ids), reason)
        assert isinstance(outcome, PoolChanged), outcome
        self.cursor.forget(ids)
        return outcome

    def observe(self, observed: Iterable[tuple[str, int]]) -> LoadsObserved:
        """``ObserveLoads`` from scraped gauges (R-OBS-1)."""
        outcome = self.apply(ObserveLoads(observed=tuple(observed)))
        assert isinstance(outcome, LoadsObserved), outcome
        return outcome

    def clear_sticky_cache(self) -> StickyCacheCleared:
        """Empty the sticky map and the group map; counts and counters are kept."""
        outcome = self.apply(ClearStickyCache())
        assert isinstance(outcome, StickyCacheCleared), outcome
        return outcome

    # ------------------------------------------------------------------- views
    def inflight(self, server_id: str) -> int:
        """The core's in-flight count of ``server_id``; 0 for a server not in the pool."""
        state = self.state
        return state.inflight(server_id) if server_id in state.pool else 0

    def status(self) -> dict[str, Any]:
        """The core's status view, with the context band's two options when it is set."""
        config = self.config
        out = status(config, self.state)
        if config.affinity_break_tokens is not None:
            out.setdefault("affinity_break_tokens", config.affinity_break_tokens)
            out.setdefault("affinity_break_band_cap", config.affinity_break_band_cap)
        return out
