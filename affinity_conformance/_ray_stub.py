"""A minimal in-process stand-in for ``ray``, used only when real Ray is not installed.

verl 0.9.1's ``router.py`` touches exactly three Ray names:

* ``ray.actor.ActorHandle``: in annotations, evaluated when the class body runs;
* ``ray.actor.ActorClass``: ``isinstance`` check in the YAML plug-in factory;
* ``ray.remote(cls).remote(...)``: in ``get_router_handle``.

This stub provides those (plus ``ray.get``) with *synchronous, in-process* semantics:
``ray.remote(cls).remote(*a, **kw)`` constructs ``cls(*a, **kw)`` right away and returns a
handle whose ``handle.method.remote(*a, **kw)`` calls the method immediately and returns its
plain result (there are no ObjectRefs; ``ray.get`` is the identity). That is enough to
exercise ``get_router_handle``'s wiring without a cluster. It is **not** a model of Ray's
concurrency, ordering or failure behaviour.

The stub is installed into ``sys.modules`` only when no real ``ray`` can be imported; it
never shadows a real Ray.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any, Final

STUB_MARKER: Final = "__affinity_ray_stub__"


class ActorClass:
    """Stand-in for ``ray.actor.ActorClass``: wraps a plain class."""

    def __init__(self, cls: type, options: dict[str, Any] | None = None) -> None:
        self._cls = cls
        self._options: dict[str, Any] = dict(options or {})

    @property
    def wrapped_class(self) -> type:
        return self._cls

    def options(self, **options: Any) -> ActorClass:
        merged = dict(self._options)
        merged.update(options)
        return ActorClass(self._cls, merged)

    def remote(self, *args: Any, **kwargs: Any) -> ActorHandle:
        return ActorHandle(self._cls(*args, **kwargs))

    def __repr__(self) -> str:
        return f"<stub ActorClass {self._cls.__qualname__}>"


class _ActorMethod:
    def __init__(self, bound: Callable[..., Any]) -> None:
        self._bound = bound

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._bound(*args, **kwargs)


class ActorHandle:
    """Stand-in for ``ray.actor.ActorHandle``: calls run synchronously in-process."""

    def __init__(self, instance: object) -> None:
        self._instance = instance

    @property
    def wrapped_instance(self) -> object:
        """The underlying object (stub-only; real Ray has no such accessor)."""
        return self._instance

    def __getattr__(self, name: str) -> _ActorMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        attr = getattr(self._instance, name)
        if not callable(attr):
            raise AttributeError(f"stub actor attribute {name!r} is not a method")
        return _ActorMethod(attr)

    def __repr__(self) -> str:
        return f"<stub ActorHandle {type(self._instance).__qualname__}>"


def remote(*args: Any, **options: Any) -> Any:
    """``ray.remote(cls)`` or ``ray.remote(**options)(cls)``; functions are not supported."""
    if len(args) == 1 and not options and isinstance(args[0], type):
        return ActorClass(args[0])
    if not args:

        def decorate(cls: type) -> ActorClass:
            if not isinstance(cls, type):
                raise TypeError("ray stub: only classes can be made remote")
            return ActorClass(cls, options)

        return decorate
    raise TypeError("ray stub: ray.remote supports only a class or keyword options")


def get(value: Any, **_kwargs: Any) -> Any:
    """Identity: stub ``.remote()`` calls already return plain values."""
    return value


def build_stub_modules() -> tuple[types.ModuleType, types.ModuleType]:
    """Return fresh ``(ray, ray.actor)`` stub modules (not yet in ``sys.modules``)."""
    ray_mod = types.ModuleType("ray", "Stub ray (affinity_conformance): real Ray not installed.")
    actor_mod = types.ModuleType("ray.actor", "Stub ray.actor (affinity_conformance).")
    actor_mod.__dict__.update(ActorClass=ActorClass, ActorHandle=ActorHandle)
    actor_mod.__dict__[STUB_MARKER] = True
    ray_mod.__dict__.update(actor=actor_mod, remote=remote, get=get, __path__=[])
    ray_mod.__dict__[STUB_MARKER] = True
    return ray_mod, actor_mod


def install() -> types.ModuleType:
    """Put the stub into ``sys.modules`` unless some ``ray`` is already there."""
    existing = sys.modules.get("ray")
    if existing is not None:
        return existing
    ray_mod, actor_mod = build_stub_modules()
    sys.modules["ray"] = ray_mod
    sys.modules["ray.actor"] = actor_mod
    return ray_mod


def is_stub(module: types.ModuleType) -> bool:
    return bool(module.__dict__.get(STUB_MARKER, False))
