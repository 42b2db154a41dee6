"""Load verl 0.9.1's real ``GlobalRequestLoadBalancer`` without importing torch.

``verl/__init__.py`` imports ``verl.protocol`` (tensordict, torch) and more, so a plain
``import verl.workers.rollout.router`` needs a 1.4 GB environment. The router module itself
needs only ``cachetools``, ``omegaconf``, ``ray`` and ``verl.utils.import_utils`` (stdlib only).
This loader therefore:

1. locates the installed ``verl`` package with :func:`importlib.util.find_spec` (for a
   top-level name this does not execute the package);
2. puts bare package shells for ``verl``, ``verl.utils``, ``verl.workers`` and
   ``verl.workers.rollout`` into :data:`sys.modules` (``__path__`` set, no ``__init__`` run);
3. executes the real files ``verl/utils/import_utils.py`` and
   ``verl/workers/rollout/router.py`` under their real module names via
   :func:`importlib.util.spec_from_file_location`.

If a real ``verl`` package has already been imported (torch available), the router module
is imported normally instead. If ``ray`` cannot be imported, a minimal in-process stub is
installed (see :mod:`affinity_conformance._ray_stub`); a real Ray is never shadowed. With
real Ray, the two loaded modules are registered with ``ray.cloudpickle`` for pickling *by
value*, so ``ray.remote(GlobalRequestLoadBalancer)`` actors start in workers without torch.

Side effect to be aware of: the shells stay in ``sys.modules`` for the life of the process,
so a later ``import verl`` returns the shell (``verl.__init__`` is never run).

Tie-breaking: verl 0.9.1 breaks new-placement ties with ``random.choice(candidates)`` on the
*module-global* ``random``. Use :func:`seeded_upstream_random` (a private seeded
``random.Random`` swapped into the router module for the duration of a ``with`` block) or
:func:`patched_upstream_random` (any object with ``choice``, e.g. :class:`RecordingRandom`)
for reproducible in-process draws; :func:`upstream_random_module` returns the ``random``
reference the module actually uses, for callers who prefer ``random.seed``.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import random
import sys
import threading
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Final, Protocol, TypeVar

from affinity_conformance import _ray_stub

__all__ = [
    "EXPECTED_UPSTREAM_VERSION",
    "INSTALL_HINT",
    "RecordingRandom",
    "TieChooser",
    "UpstreamUnavailable",
    "load_upstream_balancer",
    "load_upstream_router_module",
    "patched_upstream_random",
    "ray_is_stub",
    "seeded_upstream_random",
    "upstream_package_dir",
    "upstream_random_module",
    "upstream_version",
]

EXPECTED_UPSTREAM_VERSION: Final = "0.9.1"
# Commands that work wherever Affinity is installed, from a wheel as from a checkout: the
# [verl] extra brings what verl's router module imports (cachetools, omegaconf, Ray).
INSTALL_HINT: Final = (
    "install with `pip install 'affinity-routing[verl]'`, then "
    "`pip install --no-deps verl==0.9.1` (--no-deps: no torch); in a checkout, "
    "scripts/test.sh does both"
)

_SHELL_MARKER: Final = "__affinity_verl_shell__"
_SHELL_PACKAGES: Final = ("verl", "verl.utils", "verl.workers", "verl.workers.rollout")
_IMPORT_UTILS: Final = "verl.utils.import_utils"
_ROUTER: Final = "verl.workers.rollout.router"
_BALANCER_NAME: Final = "GlobalRequestLoadBalancer"

_T = TypeVar("_T")

_lock = threading.RLock()
_router_module: types.ModuleType | None = None


class UpstreamUnavailable(RuntimeError):
    """verl (or one of the router module's light dependencies) is not installed."""


def upstream_version() -> str:
    """The installed ``verl`` distribution's version, e.g. ``"0.9.1"``."""
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError as exc:
        raise UpstreamUnavailable(f"verl is not installed; {INSTALL_HINT}") from exc


def upstream_package_dir() -> Path:
    """Directory of the ``verl`` package Python would import (not executed)."""
    existing = sys.modules.get("verl")
    if existing is not None:
        paths = list(getattr(existing, "__path__", []))
        if paths:
            return Path(paths[0]).resolve()
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError) as exc:
        raise UpstreamUnavailable(f"cannot locate verl ({exc}); {INSTALL_HINT}") from exc
    if spec is None or not spec.submodule_search_locations:
        raise UpstreamUnavailable(f"verl is not installed; {INSTALL_HINT}")
    for location in spec.submodule_search_locations:
        candidate = Path(location)
        if (candidate / "workers" / "rollout" / "router.py").is_file():
            return candidate.resolve()
    raise UpstreamUnavailable(
        "a `verl` package was found but it has no workers/rollout/router.py "
        f"(a stray folder named verl, or a verl older than 0.9?); {INSTALL_HINT}"
    )


def _is_shell(module: types.ModuleType) -> bool:
    return bool(module.__dict__.get(_SHELL_MARKER, False))


def _real_verl_imported() -> bool:
    existing = sys.modules.get("verl")
    return existing is not None and not _is_shell(existing)


def _ensure_ray() -> None:
    if "ray" in sys.modules:
        return
    try:
        spec = importlib.util.find_spec("ray")
    except (ImportError, ValueError):
        spec = None
    # A namespace package (e.g. a stray folder named `ray`) has no origin: not a real Ray.
    if spec is not None and spec.origin is not None and spec.loader is not None:
        importlib.import_module("ray")
        return
    _ray_stub.install()


def _install_shells(package_dir: Path) -> None:
    for name in _SHELL_PACKAGES:
        if name in sys.modules:
            continue
        parts = name.split(".")
        directory = package_dir.joinpath(*parts[1:])
        init_file = directory / "__init__.py"
        spec = importlib.machinery.ModuleSpec(name, None, origin=str(init_file), is_package=True)
        spec.submodule_search_locations = [str(directory)]
        shell = types.ModuleType(name, f"Bare package shell for {name} (affinity_conformance).")
        shell.__dict__.update(
            __spec__=spec,
            __path__=[str(directory)],
            __package__=name,
            # verl.utils.import_utils.resolve_config_path uses `verl.__file__` to find the
            # package root; point it at the real (never executed) __init__.py.
            __file__=str(init_file),
        )
        shell.__dict__[_SHELL_MARKER] = True
        sys.modules[name] = shell
        if len(parts) > 1:
            parent = sys.modules[".".join(parts[:-1])]
            parent.__dict__[parts[-1]] = shell


def _exec_file(name: str, path: Path) -> types.ModuleType:
    existing = sys.modules.get(name)
    if existing is not None:
        return existing
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UpstreamUnavailable(f"cannot build an import spec for {path}; {INSTALL_HINT}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        del sys.modules[name]
        raise UpstreamUnavailable(
            f"loading {path} failed: {exc}. The router needs cachetools and omegaconf; "
            f"{INSTALL_HINT}"
        ) from exc
    except BaseException:
        del sys.modules[name]
        raise
    parent_name, _, leaf = name.rpartition(".")
    sys.modules[parent_name].__dict__[leaf] = module
    return module


def _register_pickle_by_value(*modules: types.ModuleType) -> None:
    """Make real Ray ship these modules' classes by value.

    A Ray worker unpickling ``verl.workers.rollout.router.GlobalRequestLoadBalancer`` *by
    reference* would run ``import verl.workers.rollout.router`` and hence ``verl/__init__.py``
    (torch) in the worker. By value, the worker only needs cachetools (and ray).
    """
    ray_mod = sys.modules.get("ray")
    if ray_mod is None or _ray_stub.is_stub(ray_mod):
        return
    try:
        cloudpickle = importlib.import_module("ray.cloudpickle")
    except ImportError:
        return
    register = getattr(cloudpickle, "register_pickle_by_value", None)
    if register is None:
        return
    for module in modules:
        register(module)


def _load() -> types.ModuleType:
    if _real_verl_imported():
        return importlib.import_module(_ROUTER)
    package_dir = upstream_package_dir()
    _ensure_ray()
    _install_shells(package_dir)
    import_utils = _exec_file(_IMPORT_UTILS, package_dir / "utils" / "import_utils.py")
    router = _exec_file(_ROUTER, package_dir / "workers" / "rollout" / "router.py")
    _register_pickle_by_value(import_utils, router)
    return router


def load_upstream_router_module() -> types.ModuleType:
    """The real ``verl.workers.rollout.router`` module (loaded once, then cached)."""
    global _router_module
    with _lock:
        if _router_module is None:
            _router_module = _load()
        return _router_module


def load_upstream_balancer() -> type:
    """verl's real ``GlobalRequestLoadBalancer`` class."""
    cls = getattr(load_upstream_router_module(), _BALANCER_NAME, None)
    if not isinstance(cls, type):
        raise UpstreamUnavailable(
            f"{_ROUTER} has no class {_BALANCER_NAME} (verl {upstream_version()}; "
            f"expected {EXPECTED_UPSTREAM_VERSION})"
        )
    return cls


def ray_is_stub() -> bool:
    """True when the ``ray`` in ``sys.modules`` is this package's in-process stub."""
    module = sys.modules.get("ray")
    return module is not None and _ray_stub.is_stub(module)


# --- tie-breaking -------------------------------------------------------------------------


class TieChooser(Protocol):
    """Anything usable in place of the ``random`` module by ``random.choice(candidates)``."""

    def choice(self, seq: Sequence[_T]) -> _T: ...


class RecordingRandom(random.Random):
    """A seeded ``random.Random`` that records every ``choice`` call.

    ``draws`` holds ``(candidates, index)`` pairs in call order, so a conformance harness can
    replay the exact tie draw into a model that takes draws as inputs.
    """

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.draws: list[tuple[tuple[object, ...], int]] = []

    def choice(self, seq: Sequence[_T]) -> _T:  # type: ignore[override]
        items = tuple(seq)
        if not items:
            raise IndexError("Cannot choose from an empty sequence")
        index = self.randrange(len(items))  # same draw as Random.choice: _randbelow(n)
        self.draws.append((items, index))
        return items[index]


def upstream_random_module() -> object:
    """The object the router module calls ``.choice`` on (normally the global ``random``)."""
    return load_upstream_router_module().__dict__["random"]


@contextmanager
def patched_upstream_random(chooser: TieChooser) -> Iterator[TieChooser]:
    """Within the block, the router's ``random.choice`` calls go to ``chooser``.

    In-process only: an actor in a real Ray worker process has its own module copy.
    Not thread-safe with respect to other patches of the same module.
    """
    namespace = load_upstream_router_module().__dict__
    previous = namespace["random"]
    namespace["random"] = chooser
    try:
        yield chooser
    finally:
        namespace["random"] = previous


@contextmanager
def seeded_upstream_random(seed: int) -> Iterator[random.Random]:
    """Within the block, upstream ties are drawn from a private ``random.Random(seed)``.

    Equivalent to ``random.seed(seed)`` for the router's draws, without touching the
    process-wide generator.
    """
    rng = random.Random(seed)
    with patched_upstream_random(rng):
        yield rng
