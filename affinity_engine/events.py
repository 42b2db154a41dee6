"""Events: the inputs of :func:`affinity_engine.machine.step`.

Theory of operation
-------------------
An event is one call on verl's balancer API, as an immutable value (R-EV-1):

* :class:`Acquire` -- ``acquire_server(request_id)``. ``request_id=None`` is an unkeyed
  request (an HTTP request without a session key): placed least-loaded, never pinned.
  ``tie_draw`` carries the randomness of the ``draw`` tie-break and ``request_hash`` the
  caller's builtin hash of the request id for the ``caller`` hash mode, so the core never draws or
  hashes by itself. ``context_tokens`` is the request's prompt length in tokens as the
  caller knows it at acquire time; only the context band reads it (R-BAND-1), and an
  acquire without it counts as zero context there (the band never widens on a guess).
* :class:`Release` -- ``release_server(server_id, request_id=None)``.
* :class:`AddServers` / :class:`RemoveServers` -- pool changes, in the given order.
* :class:`ClearStickyCache` -- ``clear_sticky_cache()``.
* :class:`ObserveLoads` -- a reconciliation from the backends' own metrics (e.g. vLLM's
  ``num_requests_running + num_requests_waiting``): the observed outstanding requests
  per server. It lets an HTTP router see load it did not send (R-OBS-1).

Configuration is the remaining event: :func:`affinity_engine.state.initial_state` builds
the first state from a :class:`~affinity_engine.config.Config` and a server list.

Field validation happens at construction (R-EV-2): an event that exists is well formed,
so the machine only has to reject events that do not fit the configuration or state.
"""

from __future__ import annotations

from typing import final

from .values import Value, register

__all__ = [
    "Acquire",
    "AddServers",
    "ClearStickyCache",
    "Event",
    "EventError",
    "ObserveLoads",
    "Release",
    "RemoveServers",
    "acquire_event",
    "is_valid_id",
    "release_event",
]


class EventError(ValueError):
    """An event field is outside its accepted range."""


def is_valid_id(value: object) -> bool:
    """A non-empty string of Unicode scalar values (no lone surrogates), so that every id
    has a UTF-8 encoding for stable_hash and the JSON codec."""
    if not isinstance(value, str) or value == "":
        return False
    if value.isascii():  # the common case, without building the encoding
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _id(kind: str, value: object) -> None:
    if not is_valid_id(value):
        raise EventError(
            f"{kind} must be a non-empty string of Unicode scalar values, got {value!r}"
        )


def _server_tuple(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (tuple, list)):
        raise EventError(f"server_ids must be a list of server ids, got {value!r}")
    for item in value:
        _id("server id", item)
    return tuple(value)


def _non_negative_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise EventError(f"{name} must be an integer >= 0, got {value!r}")


def _optional_int(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise EventError(f"{name} must be an integer or null, got {value!r}")


# Events are native values (values.py). Acquire and Release are built once per request,
# so their __init__ tests the common case first (exact ints, ASCII ids) and leaves
# anything unusual to the general checks above, with the same rules and messages.
# Their constructors are keyword-only, as before. Constructors take ``object``: they are
# the validators of untrusted input (R-EV-2), so a wrong type must reach the checks and
# get an EventError naming the field -- a compiled build would otherwise refuse it at
# the call with a bare TypeError. The fields themselves are precisely typed.


@final
class Acquire(Value):
    __slots__ = ("context_tokens", "request_hash", "request_id", "tie_draw")
    __match_args__ = ("request_id", "tie_draw", "request_hash", "context_tokens")
    request_id: str | None
    tie_draw: int
    request_hash: int | None
    context_tokens: int | None

    def __init__(self, *, request_id: object, tie_draw: object = 0,
                 request_hash: object = None, context_tokens: object = None) -> None:
        if request_id is not None and not is_valid_id(request_id):
            _id("request_id", request_id)
        if type(tie_draw) is not int or tie_draw < 0:
            _non_negative_int("tie_draw", tie_draw)
        if request_hash is not None and type(request_hash) is not int:
            _optional_int("request_hash", request_hash)
        if context_tokens is not None and (
                isinstance(context_tokens, bool) or not isinstance(context_tokens, int)
                or context_tokens < 0):
            raise EventError(
                f"context_tokens must be null or an integer >= 0, got {context_tokens!r}"
            )
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "tie_draw", tie_draw)
        object.__setattr__(self, "request_hash", request_hash)
        object.__setattr__(self, "context_tokens", context_tokens)


@final
class Release(Value):
    __slots__ = ("request_id", "server_id")
    __match_args__ = ("server_id", "request_id")
    server_id: str
    request_id: str | None

    def __init__(self, *, server_id: object, request_id: object = None) -> None:
        if not is_valid_id(server_id):
            _id("server_id", server_id)
        if request_id is not None and not is_valid_id(request_id):
            _id("request_id", request_id)
        object.__setattr__(self, "server_id", server_id)
        object.__setattr__(self, "request_id", request_id)


@final
class AddServers(Value):
    __slots__ = ("server_ids",)
    __match_args__ = ("server_ids",)
    server_ids: tuple[str, ...]

    def __init__(self, *, server_ids: object) -> None:
        ids = _server_tuple(server_ids)
        # verl takes a dict, whose keys are unique.
        if len(set(ids)) != len(ids):
            raise EventError(f"server_ids must be unique, got {list(ids)!r}")
        object.__setattr__(self, "server_ids", ids)


@final
class RemoveServers(Value):
    __slots__ = ("server_ids",)
    __match_args__ = ("server_ids",)
    server_ids: tuple[str, ...]

    def __init__(self, *, server_ids: object) -> None:
        object.__setattr__(self, "server_ids", _server_tuple(server_ids))


@final
class ClearStickyCache(Value):
    __slots__ = ()
    __match_args__ = ()


def _observations(value: object) -> tuple[tuple[str, int], ...]:
    pairs = list(value.items()) if isinstance(value, dict) else value
    if isinstance(pairs, str) or not isinstance(pairs, (tuple, list)):
        raise EventError(f"observed must be (server_id, load) pairs, got {value!r}")
    out: list[tuple[str, int]] = []
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise EventError(f"observed must be (server_id, load) pairs, got {pair!r}")
        sid, load = pair
        _id("server id", sid)
        if isinstance(load, bool) or not isinstance(load, int) or load < 0:
            raise EventError(f"observed load of {sid!r} must be an integer >= 0, got {load!r}")
        out.append((sid, load))
    if len({s for s, _ in out}) != len(out):
        raise EventError(f"observed server ids must be unique, got {[s for s, _ in out]!r}")
    return tuple(out)


@final
class ObserveLoads(Value):
    __slots__ = ("observed",)
    __match_args__ = ("observed",)
    observed: tuple[tuple[str, int], ...]

    def __init__(self, *, observed: object) -> None:
        object.__setattr__(self, "observed", _observations(observed))


register(Acquire, Release, AddServers, RemoveServers, ClearStickyCache, ObserveLoads)


# Positional builders of the two per-request events, for callers that build one per
# request (the verl adapter, embedders, bench_core's core row). They validate exactly as
# the constructors do -- they *are* the constructors, called from compiled code -- so
# nothing is trusted. What they save is the keyword call: a compiled class called from
# Python with keywords parses them at run time (about 100-200 ns here), while a compiled
# function called positionally reaches the native constructor directly.


def acquire_event(request_id: object, tie_draw: object = 0, request_hash: object = None,
                  context_tokens: object = None) -> Acquire:
    """``Acquire(request_id=..., tie_draw=..., request_hash=..., context_tokens=...)``."""
    return Acquire(request_id=request_id, tie_draw=tie_draw, request_hash=request_hash,
                   context_tokens=context_tokens)


def release_event(server_id: object, request_id: object = None) -> Release:
    """``Release(server_id=..., request_id=...)``."""
    return Release(server_id=server_id, request_id=request_id)


Event = Acquire | Release | AddServers | RemoveServers | ClearStickyCache | ObserveLoads
