"""``AffinityLoadBalancer``: verl 0.9.1's ``RequestLoadBalancer`` on top of ``affinity_engine``.

Theory of operation
-------------------
The class is plain (verl wraps it with ``ray.remote``) and every method is synchronous,
so the actor runs one call at a time and each call is atomic, exactly like verl's own
``GlobalRequestLoadBalancer``. An ``async def`` here would turn it into an asyncio actor
and give up that atomicity (PR #7435 behaviour 7).

The adapter holds three things and decides nothing:

* ``_state``: the core :class:`~affinity_engine.State`. Each mutating method builds one
  event, calls :func:`affinity_engine.step`, stores the new state and maps the outcome to
  verl's return value or exception. No routing logic lives here.
* ``_handles``: ``server_id -> actor handle``. Handles are opaque to routing, so they are
  adapter data, not core state; ``add_servers`` / ``remove_servers`` keep them in step
  with the pool.
* the sources of the two inputs the pure core may not produce itself: a seeded
  ``random.Random`` for ``tie_break="draw"`` (verl 0.9.1 calls ``random.choice``), and
  Python's ``hash(request_id)`` for ``full_determinism`` with ``hash_mode="caller"``
  (verl's own hash; ``hash_mode="stable"`` lets the core use CRC-32 instead).

**Context band (SPEC §7.5).** With ``affinity_break_tokens`` set (and
``full_determinism`` off, where the band is ignored anyway, R-BAND-5),
:meth:`require_acquire_fields` declares ``["prompt_ids"]``, so verl 0.9.1's client sends
the prompt's token ids with each acquire and the event carries ``context_tokens =
len(prompt_ids)``. Only the length is read, never the ids. Without T it declares
nothing, as before, so the default path serialises no prompt (the cost per Ray call is
in benchmarks/README.md, "prompt_ids on the acquire").

Outcome mapping keeps verl's error contract: ``Rejected(no_servers)`` becomes
``RuntimeError("No available servers in load balancer")`` (callers match on the text),
``Rejected(invalid_for_config)`` a ``ValueError``. Malformed arguments (an empty request
id, a non-mapping ``servers``, ``prompt_ids`` that is not a sequence) raise
``ValueError`` / ``TypeError`` naming the value, before any state changes.

With ``decision_log`` set, every applied event is appended to an NDJSON decision log
(:class:`affinity_runtime.decision_log.DecisionLogWriter`) that ``affinity replay``
checks against the core: one written line per event, size-capped with rotation. The
writer locks the path at construction, so a second balancer on the same path fails
there (``DecisionLogLocked``, an ``OSError`` naming the path and the holder's PID) and
changes nothing. A write failure or the log deleted underneath is reported in
``get_status()`` (``decision_log_ok``, ``decision_log_errors``) and the actor's log, and
routing goes on; with ``decision_log_required`` an acquire is refused instead
(``RuntimeError`` naming the log's problem), and an acquire whose record failed is
undone, so every server handed out is in the log.

A balancer constructed where its decision log already exists (an actor restarted on the
same path) starts warm (R-LOG-3, :mod:`affinity_runtime.warm_start`): the old log is
replayed through the core and the balancer continues from its state -- sticky pins and
counters -- releasing the dead actor's in-flight requests as abandoned and bringing the
pool to the servers it was given, each a logged event with its reason. A log that cannot
be replayed, or a changed routing configuration, starts cold (logged). A new path starts
cold, as before.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

from affinity_engine import (
    NO_SERVERS_MESSAGE,
    Acquire,
    Acquired,
    AddServers,
    ClearStickyCache,
    ConfigError,
    Event,
    HashMode,
    Outcome,
    Rejected,
    RejectReason,
    Release,
    RemoveServers,
    StickyCacheCleared,
    TieBreak,
    acquire_event,
    initial_state,
    release_event,
    status,
    step,
)
from affinity_runtime.decision_log import DecisionLogWriter
from affinity_runtime.warm_start import ABANDONED, start_log

from .options import BalancerOptions, OptionError, parse_options

__all__ = ["AffinityLoadBalancer"]


def _handles(servers: object, where: str) -> dict[str, Any]:
    """verl passes ``{server_id: handle}``; a list of ids (handles None) is accepted too."""
    if servers is None:
        return {}
    if isinstance(servers, Mapping):
        return dict(servers)
    if isinstance(servers, Iterable) and not isinstance(servers, (str, bytes)):
        return dict.fromkeys(servers)
    raise TypeError(
        f"{where}: servers must be a mapping of server id to actor handle, "
        f"got {servers!r} ({type(servers).__name__})"
    )


def _prompt_length(request_id: object, prompt_ids: object) -> int | None:
    """``len(prompt_ids)``: the acquire's ``context_tokens`` (None when not sent).

    Any sized, indexable sequence of token ids counts (a list, a tuple, a 1-D numpy array
    or tensor); text, bytes and mappings are refused because their length is not a token
    count. The ids themselves are never read: iterating 100K of them would cost more
    than the routing decision.
    """
    if prompt_ids is None:
        return None
    sized = hasattr(prompt_ids, "__len__") and hasattr(prompt_ids, "__getitem__")
    if sized and not isinstance(prompt_ids, (str, bytes, bytearray, memoryview, Mapping)):
        try:
            return len(prompt_ids)  # type: ignore[arg-type]
        except TypeError:  # a 0-d array has __len__ but no length
            pass
    shown = repr(prompt_ids)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise TypeError(
        f"acquire_server(request_id={request_id!r}): prompt_ids must be a sequence of "
        f"token ids (e.g. a list of int) or None, got {shown} ({type(prompt_ids).__name__})"
    )


class AffinityLoadBalancer:
    """Sticky, load-aware request balancer for verl rollout (see the module docstring).

    Construct it the way verl does -- ``AffinityLoadBalancer(servers, yaml_dict)`` on the
    router plug-in path, ``AffinityLoadBalancer(servers=..., max_cache_size=...)`` on the
    ``load_balancer_cls`` path -- or with keyword options directly. Accepted options:
    :data:`affinity_verl.ACCEPTED_KEYS`. Every option is validated here, so a bad value
    fails when the actor is created, never on the first request.
    """

    def __init__(
        self,
        servers: Mapping[str, Any] | Iterable[str] | None = None,
        config: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        parsed = parse_options(config, options, source=type(self).__name__)
        handles = _handles(servers, type(self).__name__)
        try:
            state = initial_state(parsed.config, handles)
        except ConfigError as exc:
            raise OptionError(f"{type(self).__name__}: {exc}") from None
        self._options: BalancerOptions = parsed
        self._config = parsed.config
        self._state = state
        self._handles = handles
        seed = parsed.seed if parsed.seed is not None else int.from_bytes(os.urandom(8), "big")
        self._rng = random.Random(seed)
        # Hot path, decided once: does an acquire need a draw or the caller's hash at all
        # (otherwise its event is the request id alone), and one Release per server for
        # releases without a request id (events are values, so they can be reused).
        routing = parsed.config
        self._needs_draw = (not routing.full_determinism
                            and routing.tie_break is not TieBreak.FIRST)
        self._needs_hash = routing.full_determinism and routing.hash_mode is HashMode.CALLER
        self._band = routing.context_band  # acquires carry len(prompt_ids)
        self._releases: dict[str, Release] = {}
        self._log: DecisionLogWriter | None = None
        if parsed.decision_log is not None:
            self._log = DecisionLogWriter(
                parsed.decision_log,
                max_bytes=parsed.decision_log_max_bytes,
                backups=parsed.decision_log_backups,
            )
            # locks (DecisionLogLocked if held), then continues from an old log's state
            resumed = start_log(self._log, self._config, self._state)
            self._state = resumed.state
            for release in resumed.abandoned:
                self._apply(release, ABANDONED)
            if resumed.warm:
                self._join_pool_after_restart()
        # The common case, decided once: no log to write, and an acquire's event is the
        # request id alone. acquire_server / release_server then step the core inline
        # (what _apply does without a log) instead of through two more method calls.
        self._plain_release = self._log is None
        self._plain_acquire = self._plain_release and not (
            self._band or self._needs_draw or self._needs_hash)

    # ------------------------------------------------------------------ internals
    def _join_pool_after_restart(self) -> None:
        """After a warm start: the pool is the servers this balancer was given."""
        pool = self._state.pool
        gone = [s for s in pool.servers if s not in self._handles]
        if gone:
            self._apply(RemoveServers(server_ids=gone), "restart: no longer configured")
        back = [s for s in self._handles if s not in self._state.pool]
        if back:
            self._apply(AddServers(server_ids=back), "restart: configured")

    def _apply(self, event: Event, reason: str | None = None) -> Outcome:
        log = self._log
        if log is None:
            transition = step(self._config, self._state, event)
            self._state = transition.state
            return transition.outcome
        required = log is not None and self._options.decision_log_required and isinstance(
            event, Acquire)
        if required and log is not None and not log.ready(self._config, self._state):
            self._refuse_unlogged(log)
        before = self._state
        transition = step(self._config, before, event)
        self._state = transition.state
        if log is not None and not log.record(
                self._config, before, event, transition.outcome, transition.state,
                reason=reason) and required:
            self._state = before  # the acquire the log did not take never happened
            self._refuse_unlogged(log)
        return transition.outcome

    @staticmethod
    def _refuse_unlogged(log: DecisionLogWriter) -> NoReturn:
        raise RuntimeError(f"decision log unavailable ({log.problem}); "
                           "decision_log_required refuses to route without it")

    def _tie_draw(self, request_id: str | None) -> int:
        """The draw for ``tie_break="draw"`` (and unkeyed requests under ``"hashed"``)."""
        config = self._config
        if config.full_determinism or config.tie_break is TieBreak.FIRST:
            return 0
        if config.tie_break is TieBreak.HASHED and request_id is not None:
            return 0
        pool = self._state.pool
        ties = pool.tie_count if len(pool) else 0
        return self._rng.randrange(ties) if ties > 1 else 0

    def _request_hash(self, request_id: str | None) -> int | None:
        config = self._config
        if config.full_determinism and config.hash_mode is HashMode.CALLER:
            # verl 0.9.1 indexes its pool with the builtin hash (PYTHONHASHSEED-dependent).
            return hash(request_id) if isinstance(request_id, str) else None
        return None

    # ------------------------------------------------------- RequestLoadBalancer
    def acquire_server(self, request_id: str, **extra: Any) -> tuple[str, Any]:
        """Pick a server for ``request_id``; returns ``(server_id, handle)``.

        ``extra`` holds the fields of :meth:`require_acquire_fields`: ``prompt_ids`` with
        the context band (its length is the acquire's ``context_tokens``), else none and
        anything sent is ignored. Raises ``RuntimeError`` ("No available servers in load
        balancer") when the pool is empty, ``TypeError`` for ``prompt_ids`` that is not a
        sequence (nothing changes).
        """
        if self._plain_acquire:
            transition = step(self._config, self._state, acquire_event(request_id))
            self._state = transition.state  # a rejection may still drop a stale pin
            outcome = transition.outcome
            if type(outcome) is Acquired:
                return outcome.server_id, self._handles.get(outcome.server_id)
            return self._acquire_failed(request_id, outcome)
        if self._band:
            context = _prompt_length(request_id, extra.get("prompt_ids"))
            if context is not None:
                return self._acquire_event(request_id, context)
        if not (self._needs_draw or self._needs_hash):
            # The positional builder: the same validation without the keyword call.
            outcome = self._apply(acquire_event(request_id))
            if type(outcome) is Acquired:
                return outcome.server_id, self._handles.get(outcome.server_id)
            return self._acquire_failed(request_id, outcome)
        return self._acquire_event(request_id, None)

    def _acquire_event(self, request_id: str, context: int | None) -> tuple[str, Any]:
        event = acquire_event(
            request_id, self._tie_draw(request_id), self._request_hash(request_id), context
        )
        outcome = self._apply(event)
        if isinstance(outcome, Acquired):
            return outcome.server_id, self._handles.get(outcome.server_id)
        return self._acquire_failed(request_id, outcome)

    @staticmethod
    def _acquire_failed(request_id: str, outcome: Outcome) -> NoReturn:
        assert isinstance(outcome, Rejected)
        if outcome.reason is RejectReason.NO_SERVERS:
            raise RuntimeError(NO_SERVERS_MESSAGE)
        raise ValueError(f"acquire_server(request_id={request_id!r}): {outcome.message}")

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        """End one request on ``server_id``.

        Legacy semantics (default): an unknown server or a count at 0 is ignored and
        ``request_id`` is not used. With ``lease_accounting`` the release is matched to
        the acquire it ends (R-LEASE-3).
        """
        if request_id is None and type(server_id) is str:
            event = self._releases.get(server_id)
            if event is None:
                event = release_event(server_id)
                if server_id in self._handles:  # bounded by the pool, emptied on removal
                    self._releases[server_id] = event
            if self._plain_release:  # _apply without a log, inline
                self._state = step(self._config, self._state, event).state
            else:
                self._apply(event)
            return
        self._apply(release_event(server_id, request_id))

    def require_acquire_fields(self) -> list[str]:
        """``["prompt_ids"]`` with the context band (its length widens the keep band,
        R-BAND-1), else ``[]``: routing keys on ``request_id`` alone and verl's client
        serialises no prompt into the acquire."""
        return ["prompt_ids"] if self._band else []

    def require_release_fields(self) -> list[str]:
        """``["request_id"]`` with lease accounting (verl's client then passes it)."""
        return ["request_id"] if self._config.lease_accounting else []

    def add_servers(self, servers: Mapping[str, Any]) -> None:
        """Add servers (``{server_id: handle}``); each joins with count 0.

        As in verl, re-adding an active server resets its count to 0 (R-POOL-2), except
        with lease accounting, where its count and leases are kept (R-LEASE-4).
        """
        handles = _handles(servers, "add_servers")
        self._apply(AddServers(server_ids=list(handles)))
        self._handles.update(handles)

    def remove_servers(self, server_ids: list[str]) -> None:
        """Remove servers; unknown ids are ignored, sticky entries are not purged."""
        if isinstance(server_ids, (str, bytes)):
            raise TypeError(f"remove_servers: server_ids must be a list of ids, got {server_ids!r}")
        ids = list(server_ids)
        self._apply(RemoveServers(server_ids=ids))
        for sid in ids:
            self._handles.pop(sid, None)
            self._releases.pop(sid, None)

    def get_all_servers(self) -> list[str]:
        """Active server ids in pool order."""
        return list(self._state.pool.servers)

    def get_inflight_count(self, server_id: str) -> int:
        """In-flight count of ``server_id``; 0 for an unknown server."""
        pool = self._state.pool
        return pool.load(server_id) if server_id in pool else 0

    def get_total_inflight(self) -> int:
        return self._state.pool.total

    def clear_sticky_cache(self) -> dict[str, Any]:
        """Empty the sticky map; counts and the affinity counters are kept."""
        outcome = self._apply(ClearStickyCache())
        assert isinstance(outcome, StickyCacheCleared)
        return {
            "cleared_entries": outcome.cleared_entries,
            "server_loads": dict(outcome.server_loads),
        }

    def get_status(self) -> dict[str, Any]:
        """verl's keys plus ``affinity_break_margin`` (and the band's two options when
        set), the counters, policy and tie-break;
        with a decision log also whether it is being written (``decision_log_ok``), its
        failures so far (``decision_log_errors``) and the current one, if any."""
        out = status(self._config, self._state)
        if self._config.affinity_break_tokens is not None:
            out.setdefault("affinity_break_tokens", self._config.affinity_break_tokens)
            out.setdefault("affinity_break_band_cap", self._config.affinity_break_band_cap)
        log = self._log
        out["decision_log"] = None if log is None else str(log.path)
        if log is not None:
            log.check()  # notices a log deleted or replaced since the last record
            out["decision_log_ok"] = log.ok
            out["decision_log_errors"] = sum(log.errors.values())
            out["decision_log_problem"] = log.problem
        return out

    # ------------------------------------------------------------------- extras
    def decision_log_files(self) -> list[str]:
        """The decision log's files, oldest first (empty when the log is off)."""
        return [] if self._log is None else [str(p) for p in self._log.files()]
