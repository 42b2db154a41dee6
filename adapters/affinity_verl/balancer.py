"""``AffinityLoadBalancer``: verl 0.9.1's ``RequestLoadBalancer`` on top of ``affinity_engine``.

Theory of operation
-------------------
The class is plain (verl wraps it with ``ray.remote``) and every method is synchronous,
so the actor runs one call at a time and each call is atomic, exactly like verl's own
``GlobalRequestLoadBalancer``. An ``async def`` here would turn it into an asyncio actor
and give up that atomicity (PR #7435 behaviour 7).

The adapter holds two things and decides nothing:

* ``_driver``: the :class:`affinity_runtime.RoutingDriver` that the vLLM router and the
  simulator run too. It owns the core :class:`~affinity_engine.State`, builds each event,
  steps the core and writes the decision log; each method here maps verl's arguments to
  a driver call and the outcome to verl's return value or exception. The driver is given
  the sources of the two inputs the pure core may not produce itself, and calls them only
  where the core reads them (SPEC R-TIE-5, R-DET-5): a seeded draw for
  ``tie_break="draw"`` that mirrors verl 0.9.1's ``random.choice``
  (:func:`affinity_runtime.seeded_draw`), and Python's ``hash(request_id)`` for
  ``full_determinism`` with ``hash_mode="caller"`` (verl's own hash;
  ``hash_mode="stable"`` lets the core use CRC-32 instead).
* ``_handles``: ``server_id -> actor handle``. Handles are opaque to routing, so they are
  adapter data, not core state; ``add_servers`` / ``remove_servers`` keep them in step
  with the pool.

**Context band (SPEC §7.5).** With ``affinity_break_tokens`` set (and
``full_determinism`` off, where the band is ignored anyway, R-BAND-5),
:meth:`require_acquire_fields` declares ``["prompt_ids"]``, so verl 0.9.1's client sends
the prompt's token ids with each acquire and the event carries ``context_tokens =
len(prompt_ids)``. Only the length is read, never the ids. Without T it declares
nothing, as before, so the default path serialises no prompt (the cost per Ray call is
in benchmarks/README.md, "prompt_ids on the acquire").

**Group pins (SPEC §7.6).** ``acquire_server(request_id, request_group_id=None)`` is PR
#6122's call shape: the caller sends the prompt's group (GRPO's ``uid``) with each
acquire. With ``group_stickiness`` ``"fallback"`` or ``"only"`` it rides on the event as
``group_id``; with ``"off"`` (the default) it is never read, so verl 0.9.1's
``acquire_server(request_id)`` and a caller that sends a group to a balancer without
group pins route exactly as before. A group id that is not a non-empty string raises
``ValueError`` naming it, before any state changes.

**Prefix-aware placement (SPEC §8.1).** With ``placement_margin`` set (and
``full_determinism`` off, where it is ignored, R-PFX-5) :meth:`require_acquire_fields`
declares ``["prompt_ids"]`` and the balancer keeps a
:class:`~affinity_runtime.prefix_index.PrefixIndex`: the chained block digests of the
prompts it routed to each server, bounded per server (``prefix_index_blocks``). Each
acquire's ``cached_prefix`` is that index's estimate for the prompt's blocks, and the
chosen server is then credited with them. A caller that knows better (a KV-event
feed, or ``affinity check`` replaying a vector) passes ``cached_prefix={server_id:
tokens}`` itself, which is used as given. ``get_status()`` reports the index's blocks and
bytes per server under ``prefix_index``.

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

from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

from affinity_engine import (
    NO_SERVERS_MESSAGE,
    Acquired,
    ConfigError,
    EventError,
    Outcome,
    Rejected,
    RejectReason,
)
from affinity_engine.cursor import KeyedBalancer
from affinity_runtime.decision_log import DecisionLogWriter
from affinity_runtime.driver import DecisionLogUnavailable, RoutingDriver, seeded_draw
from affinity_runtime.prefix_index import PrefixIndex, chain_of_ids

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


def _estimate_given(request_id: object, given: object) -> tuple[tuple[str, int], ...]:
    """A caller's own ``cached_prefix``: a mapping of server id to cached tokens (the
    core's event validation then checks ids and counts)."""
    if not isinstance(given, Mapping):
        raise TypeError(f"acquire_server(request_id={request_id!r}): cached_prefix must be "
                        f"a mapping of server id to cached tokens, got {given!r} "
                        f"({type(given).__name__})")
    return tuple(given.items())


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
            driver = RoutingDriver(parsed.config, handles, draw=seeded_draw(parsed.seed),
                                   request_hash=hash)
        except ConfigError as exc:
            raise OptionError(f"{type(self).__name__}: {exc}") from None
        self._options: BalancerOptions = parsed
        self._config = parsed.config
        self._driver = driver
        self._handles = handles
        self._band = parsed.config.context_band  # acquires carry len(prompt_ids)
        self._groups = parsed.config.groups  # acquires carry request_group_id
        # acquires carry cached_prefix, from prompt_ids through the index
        self._prefix = (PrefixIndex(parsed.prefix_block_size, parsed.prefix_index_blocks)
                        if parsed.config.prefix_placement else None)
        if parsed.decision_log is not None:
            # locks (DecisionLogLocked if held), then continues from an old log's state
            # and brings the pool to the servers this balancer was given
            driver.attach_log(
                DecisionLogWriter(parsed.decision_log,
                                  max_bytes=parsed.decision_log_max_bytes,
                                  backups=parsed.decision_log_backups),
                configured=list(handles), required=parsed.decision_log_required)
        # The hot path: the driver's bound methods, looked up once.
        self._acquire = driver.acquire
        self._acquire_keyed = driver.acquire_keyed
        self._release = driver.release
        cls = type(self)
        if (driver.plain and not (self._band or self._groups or self._prefix is not None)
                and cls.acquire_server is AffinityLoadBalancer.acquire_server
                and cls.release_server is AffinityLoadBalancer.release_server):
            # An acquire is the request id alone and nothing is logged: verl's two calls
            # are the engine's compiled KeyedBalancer on the driver's own cursor, which
            # does what the two methods below do in this configuration, without their
            # interpreted frames (tests/verl/test_verl_fast_path.py checks the two agree).
            # A subclass that overrides either keeps its own.
            keyed = KeyedBalancer(driver.cursor, handles, self._acquire_failed)
            self.acquire_server = keyed.acquire_server  # type: ignore[method-assign]
            self.release_server = keyed.release_server  # type: ignore[method-assign]

    # ------------------------------------------------------- RequestLoadBalancer
    def acquire_server(self, request_id: str, request_group_id: str | None = None,
                       **extra: Any) -> tuple[str, Any]:
        """Pick a server for ``request_id``; returns ``(server_id, handle)``.

        ``request_group_id`` is the request's group (PR #6122's argument), read only with
        group stickiness on. ``extra`` holds the fields of
        :meth:`require_acquire_fields`: ``prompt_ids`` with the context band (its length
        is the acquire's ``context_tokens``), else none and anything sent is ignored.
        Raises ``RuntimeError`` ("No available servers in load balancer") when the pool is
        empty, ``TypeError`` for ``prompt_ids`` that is not a sequence and ``ValueError``
        for a malformed group id (nothing changes).
        """
        outcome: Outcome
        try:
            if self._prefix is not None:
                outcome = self._acquire_placed(request_id, request_group_id, extra)
            elif self._groups and request_group_id is not None:
                outcome = self._acquire_grouped(request_id, request_group_id, extra)
            elif self._band:
                outcome = self._acquire(request_id,
                                        _prompt_length(request_id, extra.get("prompt_ids")))
            else:
                outcome = self._acquire_keyed(request_id)
        except DecisionLogUnavailable as exc:
            raise RuntimeError(f"{exc}; decision_log_required refuses to route "
                               "without it") from None
        if type(outcome) is Acquired:
            return outcome.server_id, self._handles.get(outcome.server_id)
        return self._acquire_failed(request_id, outcome)

    def _acquire_grouped(self, request_id: str, group_id: str, extra: Mapping[str, Any]
                         ) -> Outcome:
        context = (_prompt_length(request_id, extra.get("prompt_ids")) if self._band
                   else None)
        try:
            return self._acquire(request_id, context, group_id)
        except EventError as exc:
            raise ValueError(f"acquire_server(request_id={request_id!r}, "
                             f"request_group_id={group_id!r}): {exc}") from None

    def _acquire_placed(self, request_id: str, group_id: str | None,
                        extra: Mapping[str, Any]) -> Outcome:
        """An acquire with prefix-aware placement: the estimate from ``cached_prefix`` as
        given, else from the index over ``prompt_ids``; the chosen server is credited with
        the prompt's blocks."""
        index = self._prefix
        assert index is not None
        prompt_ids = extra.get("prompt_ids")
        context = _prompt_length(request_id, prompt_ids) if self._band else None
        chain: list[bytes] = []
        given = extra.get("cached_prefix")
        if given is not None:
            estimate = _estimate_given(request_id, given)
        else:
            if prompt_ids is not None:
                _prompt_length(request_id, prompt_ids)  # refuses what is not a sequence
                chain = chain_of_ids(prompt_ids, index.block_size)
            estimate = index.estimate(chain, self._driver.state.pool.servers)
        try:  # the driver drops the group id where group stickiness is off (R-GRP-1)
            outcome = self._acquire(request_id, context, group_id, estimate)
        except EventError as exc:
            raise ValueError(f"acquire_server(request_id={request_id!r}): {exc}") from None
        if chain and type(outcome) is Acquired:
            index.record(outcome.server_id, chain)
        return outcome

    @staticmethod
    def _acquire_failed(request_id: object, outcome: Outcome) -> NoReturn:
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
        self._release(server_id, request_id)

    def require_acquire_fields(self) -> list[str]:
        """``["prompt_ids"]`` with the context band (its length widens the keep band,
        R-BAND-1) or prefix-aware placement (its blocks are looked up in the index,
        R-PFX-7), else ``[]``: routing keys on ``request_id`` alone and verl's client
        serialises no prompt into the acquire."""
        return ["prompt_ids"] if self._band or self._prefix is not None else []

    def require_release_fields(self) -> list[str]:
        """``["request_id"]`` with lease accounting (verl's client then passes it)."""
        return ["request_id"] if self._config.lease_accounting else []

    def add_servers(self, servers: Mapping[str, Any]) -> None:
        """Add servers (``{server_id: handle}``); each joins with count 0.

        As in verl, re-adding an active server resets its count to 0 (R-POOL-2), except
        with lease accounting, where its count and leases are kept (R-LEASE-4).
        """
        handles = _handles(servers, "add_servers")
        self._driver.add(handles)
        self._handles.update(handles)

    def remove_servers(self, server_ids: list[str]) -> None:
        """Remove servers; unknown ids are ignored, sticky entries are not purged."""
        if isinstance(server_ids, (str, bytes)):
            raise TypeError(f"remove_servers: server_ids must be a list of ids, got {server_ids!r}")
        ids = list(server_ids)
        self._driver.remove(ids)
        for sid in ids:
            self._handles.pop(sid, None)
            if self._prefix is not None:
                self._prefix.forget(sid)

    def get_all_servers(self) -> list[str]:
        """Active server ids in pool order."""
        return list(self._driver.state.pool.servers)

    def get_inflight_count(self, server_id: str) -> int:
        """In-flight count of ``server_id``; 0 for an unknown server."""
        return self._driver.inflight(server_id)

    def get_total_inflight(self) -> int:
        return self._driver.state.inflight_total

    def clear_sticky_cache(self) -> dict[str, Any]:
        """Empty the sticky map (and the group map with group pins, whose size before
        clearing is ``cleared_groups``); counts and the counters are kept."""
        outcome = self._driver.clear_sticky_cache()
        out: dict[str, Any] = {
            "cleared_entries": outcome.cleared_entries,
            "server_loads": dict(outcome.server_loads),
        }
        if self._groups:
            out["cleared_groups"] = outcome.cleared_groups
        return out

    def get_status(self) -> dict[str, Any]:
        """verl's keys plus ``affinity_break_margin`` (and the band's two options when
        set), the counters, policy and tie-break, and with group pins
        ``group_stickiness``, ``group_entries``, ``group_kept`` and ``group_broken``;
        with a decision log also whether it is being written (``decision_log_ok``), its
        failures so far (``decision_log_errors``) and the current one, if any."""
        out = self._driver.status()
        health = self._driver.log_health()  # notices a log deleted or replaced
        if self._prefix is not None:
            out["prefix_index"] = self._prefix.memory()
        out["decision_log"] = None if health is None else health["path"]
        if health is not None:
            out["decision_log_ok"] = health["ok"]
            out["decision_log_errors"] = sum(health["errors"].values())
            out["decision_log_problem"] = health["problem"]
        return out

    # ------------------------------------------------------------------- extras
    def decision_log_files(self) -> list[str]:
        """The decision log's files, oldest first (empty when the log is off)."""
        log = self._driver.decision_log
        return [] if log is None else [str(p) for p in log.files()]
