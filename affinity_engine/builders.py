"""Fast builders of the reference's hot events and outcomes.

Theory of operation
-------------------
The engine takes the reference's own values (:mod:`affinity_core.events`,
:mod:`affinity_core.outcomes`), so an engine outcome and a reference outcome compare with
``==``. Those are attrs frozen classes: readable, validated field by field, and about two
microseconds to build in CPython, which is more than a whole compiled ``step``. A caller
that routes every request builds an :class:`~affinity_core.events.Acquire` and a
:class:`~affinity_core.events.Release` per request, so the build cost would dominate.

The builders here make *the same classes* faster, for the common case only:

* a **fast path** accepts a strict subset of what the reference constructor accepts --
  ids that are non-empty ASCII ``str`` (always encodable, so valid under R-EV-2), counts
  that are plain non-negative ``int`` (never ``bool``) -- and writes the fields with
  ``object.__setattr__`` on a fresh instance, which is what attrs' generated ``__init__``
  does after its validators;
* **everything else** goes to the reference constructor, which accepts it or raises its
  own :class:`~affinity_core.events.EventError`, so a rejected event reads exactly as it
  does in the reference.

So a built event is either the reference's own construction or an instance of the same
class with the same field values, which the reference would have accepted. ``affinity
verify``'s refinement obligation checks both claims on a grid of good and bad fields
(:func:`affinity_proofs.refinement.builders_agree`), with a mutant builder as its control.

The outcome builder :func:`acquired` serves the engine's machine the same way; outcomes
carry no validators, so it only skips attrs' ``__init__`` indirection.
"""

from __future__ import annotations

from typing import Final

from affinity_core.events import Acquire, Release
from affinity_core.outcomes import Acquired, Path

__all__ = ["acquire_event", "acquired", "release_event"]

# Final aliases: the compiled build keeps each in a C static and calls it directly, where
# ``object.__new__(Acquire)`` is a builtins lookup, a globals lookup and a method lookup
# by name on every event, and ``value.isascii()`` a method lookup by name.
_NEW: Final = object.__new__
_ACQUIRE: Final = Acquire
_RELEASE: Final = Release
_ACQUIRED: Final = Acquired
_IS_ASCII: Final = str.isascii
_NO_PREFIX: Final[object] = ()


def _plain_id(value: object) -> bool:
    return type(value) is str and value != "" and _IS_ASCII(value)


def _plain_count(value: object) -> bool:
    return type(value) is int and value >= 0


def acquire_event(request_id: object, tie_draw: object = 0, request_hash: object = None,
                  context_tokens: object = None, group_id: object = None,
                  cached_prefix: object = ()) -> Acquire:
    """``Acquire(request_id=..., ...)``, positionally (see the module docstring)."""
    if ((request_id is None or _plain_id(request_id)) and _plain_count(tie_draw)
            and (request_hash is None or type(request_hash) is int)
            and (context_tokens is None or _plain_count(context_tokens))
            and (group_id is None or _plain_id(group_id))
            # No estimate (the default, by identity); an estimate, even an empty one of
            # another type, goes through the validating converter.
            and cached_prefix is _NO_PREFIX):
        event = _NEW(_ACQUIRE)
        object.__setattr__(event, "request_id", request_id)
        object.__setattr__(event, "tie_draw", tie_draw)
        object.__setattr__(event, "request_hash", request_hash)
        object.__setattr__(event, "context_tokens", context_tokens)
        object.__setattr__(event, "group_id", group_id)
        object.__setattr__(event, "cached_prefix", ())
        return event
    return Acquire(request_id=request_id, tie_draw=tie_draw,  # type: ignore[arg-type]
                   request_hash=request_hash, context_tokens=context_tokens,  # type: ignore[arg-type]
                   group_id=group_id, cached_prefix=cached_prefix)  # type: ignore[arg-type]


def release_event(server_id: object, request_id: object = None) -> Release:
    """``Release(server_id=..., request_id=...)``, positionally."""
    if _plain_id(server_id) and (request_id is None or _plain_id(request_id)):
        event = _NEW(_RELEASE)
        object.__setattr__(event, "server_id", server_id)
        object.__setattr__(event, "request_id", request_id)
        return event
    return Release(server_id=server_id, request_id=request_id)  # type: ignore[arg-type]


def acquired(server_id: str, path: Path, previous: str | None = None,
             evicted: str | None = None, evicted_group: str | None = None) -> Acquired:
    """``Acquired(server_id, path, previous, evicted, evicted_group)`` without attrs'
    ``__init__``."""
    outcome = _NEW(_ACQUIRED)
    object.__setattr__(outcome, "server_id", server_id)
    object.__setattr__(outcome, "path", path)
    object.__setattr__(outcome, "previous", previous)
    object.__setattr__(outcome, "evicted", evicted)
    object.__setattr__(outcome, "evicted_group", evicted_group)
    return outcome
