"""The base of the core's hot value classes: immutable, structural, attrs-compatible.

Theory of operation
-------------------
Every event the core steps through builds a handful of small values (the state, its
load table and sticky map, the transition, the event itself). They used to be attrs
frozen classes, whose generated ``__init__`` costs about half a microsecond each in
CPython and which mypyc cannot compile into native classes. They are now plain classes
deriving from :class:`Value`, written so that the *same source* is

* a ``__slots__`` class in CPython, and
* a native class under mypyc (``build_support/native_build.py``): each subclass is
  ``@final`` and its ``__init__`` writes its fields with ``object.__setattr__(self,
  "<field>", value)``, which mypyc compiles into a direct struct store.

What attrs gave, each subclass keeps, and tests/core/test_fast_paths.py checks it
against an attrs class with the same fields:

* **immutability**: ``__setattr__`` / ``__delattr__`` raise
  ``attrs.exceptions.FrozenInstanceError``, as attrs' frozen classes do;
* **structural equality**: equal iff the same class and equal fields in order;
  instances of other classes compare ``NotImplemented``;
* **hash** consistent with that equality (the field tuple's own ``__hash__``; it only
  keys dicts and sets, never a routing decision -- R-PURE-1);
* **repr** ``Name(field=value, ...)``, character for character attrs' format (decision
  logs and test messages show it);
* **pattern matching** (``__match_args__``) and **pickling** (``__reduce__``);
* **introspection**: ``__attrs_attrs__`` holds attrs ``Attribute`` records for the
  fields, so ``attrs.fields``, ``attrs.evolve`` and ``attrs.asdict`` keep working on
  them for the proofs, simulator and tests that use them. The core itself never calls
  them: it builds its values with their constructors.

A subclass lists its fields in ``__match_args__`` (the one list the methods here read)
and again, sorted, in ``__slots__`` (a literal: mypyc keeps no ``__slots__`` attribute
to refer to; a test checks the two name the same fields), writes an ``__init__`` that
stores each of them, and is passed to :func:`register` once defined.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

import attrs
from attrs.exceptions import FrozenInstanceError

__all__ = ["Value", "evolve", "register"]

_V = TypeVar("_V")


class Value:
    """An immutable value with structural equality (see the module docstring)."""

    __slots__ = ()
    __match_args__: ClassVar[tuple[str, ...]] = ()
    __attrs_attrs__: ClassVar[Any] = None  # set by register()

    def _values(self) -> tuple[Any, ...]:
        return tuple([getattr(self, name) for name in self.__match_args__])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Value)
        return self._values() == other._values()

    def __ne__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Value)
        return self._values() != other._values()

    def __hash__(self) -> int:
        # Keys dicts and sets only (the model checkers' ``seen`` sets); never a decision.
        return (self.__class__.__name__, *self._values()).__hash__()

    def __repr__(self) -> str:
        shown = ", ".join([f"{name}={getattr(self, name)!r}" for name in self.__match_args__])
        return f"{self.__class__.__name__}({shown})"

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError()

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError()

    def __reduce__(self) -> tuple[Any, ...]:
        fields = dict(zip(self.__match_args__, self._values(), strict=True))
        return _rebuild, (self.__class__, fields)


def register(*classes: type[Value]) -> None:
    """Give each class attrs ``Attribute`` records for its fields (``__attrs_attrs__``)."""
    for cls in classes:
        shadow = attrs.make_class(cls.__name__, list(cls.__match_args__), frozen=True)
        cls.__attrs_attrs__ = attrs.fields(shadow)


def _rebuild(cls: type[Any], fields: dict[str, Any]) -> Any:
    return cls(**fields)


def evolve(value: _V, **changes: Any) -> _V:
    """A copy of ``value`` with ``changes``: ``attrs.evolve`` for :class:`Value` classes
    (and for attrs classes, which it hands to ``attrs.evolve``), typed for mypy."""
    if not isinstance(value, Value):
        evolved: _V = attrs.evolve(value, **changes)  # type: ignore[misc]
        return evolved
    fields = value.__match_args__
    for name in changes:
        if name not in fields:
            raise TypeError(f"{value.__class__.__name__} has no field {name!r}; "
                            f"fields: {', '.join(fields)}")
    merged = {name: changes[name] if name in changes else getattr(value, name)
              for name in fields}
    copy: _V = value.__class__(**merged)
    return copy
