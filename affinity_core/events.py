"""Events: the inputs of :func:`affinity_core.machine.step`.

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

Configuration is the remaining event: :func:`affinity_core.state.initial_state` builds
the first state from a :class:`~affinity_core.config.Config` and a server list.

Field validation happens at construction (R-EV-2): an event that exists is well formed,
so the machine only has to reject events that do not fit the configuration or state.
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
    "is_valid_id",
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


def _non_negative_int(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise EventError(f"{attr.name} must be an integer >= 0, got {value!r}")


def _optional_int(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise EventError(f"{attr.name} must be an integer or null, got {value!r}")


# Acquire and Release are built once per request, so each checks its fields in one
# __attrs_post_init__ (one call) instead of one attrs validator per field; the checks and
# messages are those of the validators above.


@attrs.frozen(kw_only=True)
class Acquire:
    request_id: str | None
    tie_draw: int = 0
    request_hash: int | None = None
    context_tokens: int | None = None

    def __attrs_post_init__(self) -> None:
        rid: object = self.request_id
        if rid is not None and not is_valid_id(rid):
            _id("request_id", rid)
        draw: object = self.tie_draw
        if type(draw) is not int or draw < 0:  # anything unusual: the validator decides
            _non_negative_int(self, _ACQUIRE_FIELDS.tie_draw, draw)
        given: object = self.request_hash
        if given is not None and type(given) is not int:
            _optional_int(self, _ACQUIRE_FIELDS.request_hash, given)
        context: object = self.context_tokens
        if context is not None and (type(context) is not int or context < 0):
            raise EventError(
                f"context_tokens must be null or an integer >= 0, got {context!r}"
            )


@attrs.frozen(kw_only=True)
class Release:
    server_id: str
    request_id: str | None = None

    def __attrs_post_init__(self) -> None:
        sid: object = self.server_id
        if not is_valid_id(sid):
            _id("server_id", sid)
        rid: object = self.request_id
        if rid is not None and not is_valid_id(rid):
            _id("request_id", rid)


_ACQUIRE_FIELDS = attrs.fields(Acquire)


@attrs.frozen(kw_only=True)
class AddServers:
    server_ids: tuple[str, ...] = attrs.field(converter=_server_tuple)

    @server_ids.validator
    def _unique(self, _a: object, value: tuple[str, ...]) -> None:
        # verl takes a dict, whose keys are unique.
        if len(set(value)) != len(value):
            raise EventError(f"server_ids must be unique, got {list(value)!r}")


@attrs.frozen(kw_only=True)
class RemoveServers:
    server_ids: tuple[str, ...] = attrs.field(converter=_server_tuple)


@attrs.frozen
class ClearStickyCache:
    pass


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


@attrs.frozen(kw_only=True)
class ObserveLoads:
    observed: tuple[tuple[str, int], ...] = attrs.field(converter=_observations)


Event = Acquire | Release | AddServers | RemoveServers | ClearStickyCache | ObserveLoads
