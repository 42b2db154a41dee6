"""The one mutable cell around ``step``, and verl's two hot calls on it, compiled.

Theory of operation
-------------------
``step`` is a pure function, so every runtime user keeps the current state somewhere and
replaces it after each event. :class:`Cursor` is that somewhere: a state and its
configuration, with :meth:`Cursor.apply` (``step``, then keep the successor). It lives in
the engine, not in :mod:`affinity_runtime`, for one reason: the engine is the package the
mypyc build compiles, and a request's trip through an interpreted holder (a frame for
the holder, one for building the event, one for the release) costs about as much as the
compiled ``step`` itself. Here those calls are native calls.

It adds nothing to the semantics. Each operation is ``apply`` of one event:

* :meth:`Cursor.acquire_keyed` is ``apply(acquire_event(request_id))``: a keyed acquire
  whose event carries the request id alone;
* :meth:`Cursor.release` is ``apply(release_event(server_id))``, with the event built
  once per server and reused (events are values). The cache holds only servers that
  were in the pool when first released, and :meth:`Cursor.forget` drops a removed one,
  so it is bounded by the servers ever configured.

:class:`KeyedBalancer` is verl's ``acquire_server`` / ``release_server`` over a cursor,
for the configuration whose acquire is the request id alone (no context band, group
pins, prefix placement, draw, caller hash or decision log: the adapter decides, see
``affinity_verl.AffinityLoadBalancer``). It maps an ``Acquired`` to ``(server_id,
handle)`` from the caller's own handle mapping and hands any other outcome to the
caller's ``refused`` function, which raises verl's error. Its extra arguments are
accepted and not read, as the adapter's own method ignores them in that configuration.

``affinity verify``'s refinement obligation steps a cursor in lockstep with ``step`` on
its wide traces (:func:`affinity_proofs.refinement.run_trace`), and
``tests/verl/test_verl_fast_path.py`` checks :class:`KeyedBalancer` against the
adapter's general path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final, final

from affinity_core.config import Config
from affinity_core.events import Event, Release
from affinity_core.outcomes import Acquired, Outcome

from .builders import acquire_event, release_event
from .machine import step
from .state import State

__all__ = ["Cursor", "KeyedBalancer"]

_ACQUIRED: Final = Acquired


@final
class Cursor:
    """A configuration and its current state; every change is one event through ``step``
    (see the module docstring). ``state`` may be replaced by its owner (a warm start, an
    undone acquire); the cursor never changes it otherwise."""

    config: Config
    state: State

    def __init__(self, config: Config, state: State) -> None:
        self.config = config
        self.state = state
        self._releases: dict[str, Release] = {}

    def apply(self, event: Event) -> Outcome:
        """``step(config, state, event)``; keeps the successor, returns the outcome."""
        transition = step(self.config, self.state, event)
        self.state = transition.state
        return transition.outcome

    def acquire_keyed(self, request_id: object) -> Outcome:
        """``apply(acquire_event(request_id))``: an acquire carrying its request id alone.
        Typed ``object``, as the builder is: a value that is not a valid id is the
        builder's to refuse (``EventError``), and ``None`` is an unkeyed acquire."""
        transition = step(self.config, self.state, acquire_event(request_id))
        self.state = transition.state  # a rejection may still drop a stale pin (R-ACQ-6)
        return transition.outcome

    def release_of(self, server_id: str) -> Release:
        """``release_event(server_id)``, built once per server of the pool."""
        event = self._releases.get(server_id)
        if event is None:
            event = release_event(server_id)
            if server_id in self.state.pool.position:  # bounded by the servers ever pooled
                self._releases[server_id] = event
        return event

    def release(self, server_id: str) -> Outcome:
        """``apply(release_event(server_id))``."""
        transition = step(self.config, self.state, self.release_of(server_id))
        self.state = transition.state
        return transition.outcome

    def forget(self, server_ids: Iterable[str]) -> None:
        """Drop the cached release events of servers that left the pool."""
        for server_id in server_ids:
            self._releases.pop(server_id, None)


@final
class KeyedBalancer:
    """verl's ``acquire_server`` / ``release_server`` over ``cursor`` for a configuration
    whose acquire is the request id alone (see the module docstring). ``handles`` is the
    caller's live ``server_id -> handle`` mapping; ``refused(request_id, outcome)`` raises
    the caller's error for an outcome that is not an ``Acquired``."""

    def __init__(self, cursor: Cursor, handles: dict[str, Any],
                 refused: Callable[[object, Outcome], Any]) -> None:
        self._cursor = cursor
        self._handles = handles
        self._refused = refused

    def acquire_server(self, request_id: object, request_group_id: object = None,
                       **extra: object) -> tuple[str, Any]:
        outcome = self._cursor.acquire_keyed(request_id)
        if type(outcome) is _ACQUIRED:
            server_id = outcome.server_id
            return server_id, self._handles.get(server_id)
        refused: tuple[str, Any] = self._refused(request_id, outcome)
        return refused  # the caller's function raises; never reached in verl's adapter

    def release_server(self, server_id: object, request_id: object = None) -> None:
        # Arguments are typed ``object`` so that the compiled build hands a malformed
        # value to the builders' own refusal, as the adapter's methods do, instead of
        # raising mypyc's TypeError at the call.
        if request_id is None and type(server_id) is str:
            self._cursor.release(server_id)
        else:
            self._cursor.apply(release_event(server_id, request_id))
