"""Events: the inputs of :func:`affinity_core.machine.step` (SPEC §4).

Theory of operation
-------------------
An event is one call on verl's balancer API, as an immutable value (R-EV-1):

* :class:`Acquire` -- ``acquire_server(request_id)``. ``request_id=None`` is an unkeyed
  request (an HTTP request without a session key): placed least-loaded, never pinned.
  ``tie_draw`` carries the randomness of the ``draw`` tie-break and ``request_hash`` the
  caller's hash of the request id for the ``caller`` hash mode, so the core never draws or
  hashes by itself. ``context_tokens`` is the prompt length the caller knows at acquire
  time; only the context band reads it (R-BAND-1), and its absence counts as zero.
  ``group_id`` names the request's group (the samples of one prompt); only group
  stickiness reads it (R-GRP-1). ``cached_prefix`` is the caller's estimate of how many of
  the request's prompt tokens each server has cached, as ``(server_id, tokens)`` pairs;
  only prefix-aware placement reads it (R-PFX-3), and a server it does not name counts 0.
* :class:`Release` -- ``release_server(server_id, request_id=None)``.
* :class:`AddServers` / :class:`RemoveServers` -- pool changes, in the given order.
* :class:`ClearStickyCache` -- ``clear_sticky_cache()``.
* :class:`ObserveLoads` -- the backends' own count of outstanding requests per server, so
  that a router sees load it did not send (R-OBS-1).

The configuration event is :func:`affinity_core.state.initial_state`.

Fields are validated when the event is built (R-EV-2): an event that exists is well
formed, so the machine only rejects events that do not fit the configuration. The
constructors accept any object, because they are the validators of untrusted input; a
bad field raises :class:`EventError` naming the field and the accepted range.
"""

from __future__ import annotations

from typing import Any

import attrs

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
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # booleans are not counts


def _check_id(name: str, value: object) -> None:
    if not is_valid_id(value):
        raise EventError(f"{name} must be a non-empty string of Unicode scalar values, "
                         f"got {value!r}")


def _id(_: Any, field: attrs.Attribute[Any], value: object) -> None:
    _check_id(field.name, value)


def _optional_id(_: Any, field: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _check_id(field.name, value)


def _count(_: Any, field: attrs.Attribute[Any], value: object) -> None:
    if not _is_int(value) or value < 0:  # type: ignore[operator]
        raise EventError(f"{field.name} must be an integer >= 0, got {value!r}")


def _optional_count(_: Any, field: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (not _is_int(value) or value < 0):  # type: ignore[operator]
        raise EventError(f"{field.name} must be null or an integer >= 0, got {value!r}")


def _optional_int(_: Any, field: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not _is_int(value):
        raise EventError(f"{field.name} must be an integer or null, got {value!r}")


def _server_ids(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (tuple, list)):
        raise EventError(f"server_ids must be a list of server ids, got {value!r}")
    for item in value:
        _check_id("server id", item)
    return tuple(value)


def _distinct_server_ids(value: object) -> tuple[str, ...]:
    ids = _server_ids(value)
    if len(set(ids)) != len(ids):  # verl takes a dict, whose keys are unique
        raise EventError(f"server_ids must be unique, got {list(ids)!r}")
    return ids


def _server_counts(value: object, name: str, what: str) -> tuple[tuple[str, int], ...]:
    """``(server_id, n)`` pairs with distinct ids and ``n`` an integer >= 0 (a dict is
    taken as its items, in order)."""
    pairs = list(value.items()) if isinstance(value, dict) else value
    if isinstance(pairs, str) or not isinstance(pairs, (tuple, list)):
        raise EventError(f"{name} must be (server_id, {what}) pairs, got {value!r}")
    out: list[tuple[str, int]] = []
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise EventError(f"{name} must be (server_id, {what}) pairs, got {pair!r}")
        server_id, count = pair
        _check_id("server id", server_id)
        if not _is_int(count) or count < 0:
            raise EventError(
                f"{name} {what} of {server_id!r} must be an integer >= 0, got {count!r}")
        out.append((server_id, count))
    if len({s for s, _ in out}) != len(out):
        raise EventError(f"{name} server ids must be unique, got {[s for s, _ in out]!r}")
    return tuple(out)


def _observations(value: object) -> tuple[tuple[str, int], ...]:
    return _server_counts(value, "observed", "load")


def _prefix_estimates(value: object) -> tuple[tuple[str, int], ...]:
    return _server_counts(value, "cached_prefix", "tokens")


@attrs.frozen(kw_only=True)
class Acquire:
    request_id: str | None = attrs.field(validator=_optional_id)
    tie_draw: int = attrs.field(default=0, validator=_count)
    request_hash: int | None = attrs.field(default=None, validator=_optional_int)
    context_tokens: int | None = attrs.field(default=None, validator=_optional_count)
    group_id: str | None = attrs.field(default=None, validator=_optional_id)
    cached_prefix: tuple[tuple[str, int], ...] = attrs.field(default=(),
                                                             converter=_prefix_estimates)


@attrs.frozen(kw_only=True)
class Release:
    server_id: str = attrs.field(validator=_id)
    request_id: str | None = attrs.field(default=None, validator=_optional_id)


@attrs.frozen(kw_only=True)
class AddServers:
    server_ids: tuple[str, ...] = attrs.field(converter=_distinct_server_ids)


@attrs.frozen(kw_only=True)
class RemoveServers:
    server_ids: tuple[str, ...] = attrs.field(converter=_server_ids)  # repeats allowed


@attrs.frozen
class ClearStickyCache:
    pass


@attrs.frozen(kw_only=True)
class ObserveLoads:
    observed: tuple[tuple[str, int], ...] = attrs.field(converter=_observations)


def acquire_event(request_id: object, tie_draw: object = 0, request_hash: object = None,
                  context_tokens: object = None, group_id: object = None,
                  cached_prefix: object = ()) -> Acquire:
    """``Acquire(...)`` with positional arguments, for callers that build one per request."""
    return Acquire(request_id=request_id, tie_draw=tie_draw,  # type: ignore[arg-type]
                   request_hash=request_hash, context_tokens=context_tokens,  # type: ignore[arg-type]
                   group_id=group_id, cached_prefix=cached_prefix)  # type: ignore[arg-type]


def release_event(server_id: object, request_id: object = None) -> Release:
    """``Release(...)`` with positional arguments."""
    return Release(server_id=server_id, request_id=request_id)  # type: ignore[arg-type]


Event = Acquire | Release | AddServers | RemoveServers | ClearStickyCache | ObserveLoads
