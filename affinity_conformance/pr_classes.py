"""Load the balancer classes of verl's routing pull requests from files extracted at run time.

``docs/verl-routing.md`` gives ``affinity check``'s verdict on each routing PR's *real*
class. The classes are never copied into this repository: ``scripts/extract_verl_prs.sh
GITDIR OUT`` writes each PR's file(s) from a checkout of verl's public repository
(``git show refs/pull/N/head:PATH``) into ``OUT/<key>/PATH``, and this module loads them
from the directory named by :data:`ENV_VAR` (``AFFINITY_VERL_PRS``).

How a PR file is loaded
-----------------------
The PR files are whole verl modules (``llm_server.py``, ``agent_loop.py``) whose other
classes import torch, transformers, pydantic, hydra and half of verl. The balancer classes
need only ``cachetools``, ``ray`` (for ``ray.remote`` and annotations) and the standard
library. As :mod:`affinity_conformance.upstream` does for verl 0.9.1, the real file is
executed under its real module name, with these differences:

* ``verl`` and ``verl.*`` resolve *only* inside the PR's own extracted tree (a package
  folder without ``__init__.py`` becomes a bare shell); a ``verl`` module the PR did not
  ship, and any third-party module that is not installed here, is bound to a
  *placeholder*: a module whose every attribute is an inert stand-in class. The loader
  records each placeholder (:attr:`LoadedPr.absent`). A balancer that touched one would
  fail loudly at that point -- none of the classes checked here does.
* The file is executed one top-level statement at a time; a statement that fails (for
  example a class whose metaclass does not mix with a placeholder base) is skipped and
  recorded in :attr:`LoadedPr.skipped`. The balancer class's own statement must run.
* While the file runs, ``import ray`` returns a view of the real Ray (or of
  :mod:`affinity_conformance._ray_stub` when Ray is not installed) whose ``remote`` leaves
  a class unchanged: several PRs decorate the balancer with ``@ray.remote``, and the check
  drives the plain class in-process -- the logic a Ray actor runs one call at a time.
* ``sys.modules`` is restored afterwards: the PR's ``verl.*`` modules and the placeholders
  live only in the loaded module's globals, so several PRs (and verl 0.9.1 itself, loaded
  by :mod:`~affinity_conformance.upstream`) coexist in one process.

The factories
-------------
Each entry of :data:`PR_CLASSES` has a factory in this module that ``affinity check`` can
load as ``affinity_conformance.pr_classes:<key>``. It is called as verl calls a balancer,
``factory(servers={sid: handle}, max_cache_size=N, **options)``, and passes the options
through untouched, so an option the PR's constructor lacks raises ``TypeError`` there and
the feature is reported unsupported. A factory returns the PR class's own instance when
the class has verl's balancer API; otherwise an :class:`ApiShim` that translates *only the
call shape* and adds no routing behaviour -- each shim's translation is listed in its
entry's ``api`` note and in docs/verl-routing.md.
"""

from __future__ import annotations
import __future__

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import attrs

from affinity_conformance import _ray_stub

__all__ = [
    "ENV_VAR",
    "PR_CLASSES",
    "ApiShim",
    "LoadedPr",
    "PrClass",
    "PrClassesUnavailable",
    "head",
    "load_pr",
    "load_pr_class",
    "pr5399",
    "pr6122_group",
    "pr6122_group_no_group",
    "pr6122_group_per_request",
    "pr6122_request",
    "pr6533",
    "pr6712",
    "pr6940",
    "pr7435",
    "pr_root",
]

ENV_VAR: Final = "AFFINITY_VERL_PRS"
EXTRACT_HINT: Final = (
    "run `scripts/extract_verl_prs.sh GITDIR OUT` on a checkout of verl's public repository "
    f"(with refs/pull/N/head) and export {ENV_VAR}=OUT"
)


class PrClassesUnavailable(RuntimeError):
    """The extracted PR files are not there (or not loadable); the message says why."""


@attrs.frozen
class PrClass:
    """One routing PR's balancer class in the extracted tree."""

    key: str  # folder under the extracted root, e.g. "pr7435"
    pr: str  # "#7435", or "main" for verl main's head
    path: str  # the file inside the PR's tree
    class_name: str
    api: str  # how the factory reaches verl's balancer API


PR_CLASSES: Final[Mapping[str, PrClass]] = {
    entry.key: entry for entry in (
        PrClass("head", "main", "verl/workers/rollout/llm_server.py", "GlobalRequestLoadBalancer",
                "verl's balancer API as is"),
        PrClass("pr5399", "#5399", "verl/experimental/agent_loop/agent_loop.py",
                "GlobalRequestLoadBalancer",
                "shim: servers dict -> server_actor_ids list; acquire's str -> (sid, None); "
                "get_status read from _inflight_requests; no add/remove/clear (raise)"),
        PrClass("pr6122", "#6122", "verl/experimental/agent_loop/load_balance.py",
                "GroupStickyLoadBalancer",
                "shim as #5399; acquire passes request_group_id (the harness's group id, None, "
                "or the request id); group options accepted only as R-GRP-8's configuration"),
        PrClass("pr6533", "#6533", "verl/workers/rollout/llm_server.py",
                "GlobalRequestLoadBalancer",
                "balance_rel_threshold given as a float (verl's YAML type); no "
                "clear_sticky_cache (raises)"),
        PrClass("pr6712", "#6712", "verl/workers/rollout/router.py", "GlobalRequestLoadBalancer",
                "no clear_sticky_cache (raises)"),
        PrClass("pr6940", "#6940", "verl/workers/rollout/llm_router/balancer.py",
                "KVCAwareBalancer",
                "router_config = the PR's own default (kvc_aware strategy); no "
                "clear_sticky_cache (raises)"),
        PrClass("pr7435", "#7435", "verl/workers/rollout/llm_server.py",
                "GlobalRequestLoadBalancer", "verl's balancer API as is"),
    )
}

_lock = threading.RLock()
_loaded: dict[tuple[str, str], LoadedPr] = {}


def pr_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The extracted tree: ``root``, else ``$AFFINITY_VERL_PRS``."""
    raw = os.fspath(root) if root is not None else os.environ.get(ENV_VAR, "").strip()
    if not raw:
        raise PrClassesUnavailable(f"{ENV_VAR} is not set; {EXTRACT_HINT}")
    path = Path(raw)
    if not path.is_dir():
        raise PrClassesUnavailable(f"{ENV_VAR}={raw} is not a directory; {EXTRACT_HINT}")
    return path.resolve()


# --------------------------------------------------------------------- placeholders
class _AbsentMeta(type):
    """Metaclass of the stand-ins: attribute access, subscripts and calls all succeed."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _absent(f"{cls.__qualname__}.{name}")

    def __getitem__(cls, _item: object) -> Any:
        return cls

    def __iter__(cls) -> Iterator[Any]:  # else iteration would go through __getitem__
        return iter(())

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        # As a decorator (`@rollout_trace_op`) the stand-in leaves the function as it is.
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _absent(f"{cls.__qualname__}()")


def _absent(qualname: str) -> type:
    return _AbsentMeta(qualname.rpartition(".")[2] or qualname, (),
                       {"__qualname__": qualname, "__module__": "affinity_conformance.absent"})


class _PlaceholderModule(types.ModuleType):
    """A module that is not available here; every attribute is a stand-in."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _absent(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _PlaceholderLoader(importlib.abc.Loader):
    def __init__(self, absent: list[str]) -> None:
        self._absent = absent

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        self._absent.append(spec.name)
        module = _PlaceholderModule(spec.name, "Placeholder (affinity_conformance.pr_classes)")
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _ShellLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _VerlFinder(importlib.abc.MetaPathFinder):
    """``verl`` and ``verl.*`` from the PR's tree only; anything else missing: placeholder."""

    def __init__(self, tree: Path, absent: list[str], *, catch_all: bool) -> None:
        self._tree, self._absent, self._catch_all = tree, absent, catch_all

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "verl" and not fullname.startswith("verl."):
            # Only consulted after every other finder failed (this one is last). A missing
            # submodule of an installed package is left missing: packages probe optional
            # submodules (numpy) and must see the ImportError they expect.
            top = sys.modules.get(fullname.partition(".")[0])
            installed_parent = "." in fullname and not isinstance(top, _PlaceholderModule)
            if not self._catch_all or installed_parent:
                return None
            return self._placeholder(fullname)
        if self._catch_all:
            return None
        base = self._tree.joinpath(*fullname.split("."))
        if base.is_dir():
            init = base / "__init__.py"
            if init.is_file():
                return importlib.util.spec_from_file_location(
                    fullname, init, submodule_search_locations=[str(base)])
            spec = importlib.machinery.ModuleSpec(fullname, _ShellLoader(), is_package=True)
            spec.submodule_search_locations = [str(base)]
            return spec
        source = base.with_suffix(".py")
        if source.is_file():
            return importlib.util.spec_from_file_location(fullname, source)
        return self._placeholder(fullname)

    def _placeholder(self, fullname: str) -> importlib.machinery.ModuleSpec:
        spec = importlib.machinery.ModuleSpec(fullname, _PlaceholderLoader(self._absent),
                                              is_package=True)
        spec.submodule_search_locations = []
        return spec


# ---------------------------------------------------------------------- ray view
class _RayView(types.ModuleType):
    """Forwards every attribute to the real module (Ray loads submodules such as
    ``ray.actor`` lazily, through its own module ``__getattr__``)."""

    real: types.ModuleType

    def __getattr__(self, name: str) -> Any:
        if name == "real":
            raise AttributeError(name)
        return getattr(self.real, name)


def _real_ray() -> types.ModuleType:
    """The real ``ray`` (imported here if installed; it stays imported), else a fresh stub
    that is not put into ``sys.modules``."""
    existing = sys.modules.get("ray")
    if existing is not None and not isinstance(existing, _RayView):
        return existing
    try:
        spec = importlib.util.find_spec("ray")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin is not None and spec.loader is not None:
        return importlib.import_module("ray")
    return _ray_stub.build_stub_modules()[0]


def _ray_view(real: types.ModuleType) -> types.ModuleType:
    """``ray`` as the PR file sees it: ``real``, with ``remote`` on a class returning the
    class itself."""
    view = _RayView("ray", "Ray as seen by a verl PR file (affinity_conformance).")
    view.real = real
    view.__path__ = list(getattr(real, "__path__", []))
    real_remote = getattr(real, "remote", None)

    def remote(*args: Any, **options: Any) -> Any:
        if len(args) == 1 and not options and isinstance(args[0], type):
            return args[0]  # the plain class: its methods run in-process, one call at a time
        if not args and callable(real_remote):
            return lambda cls: cls if isinstance(cls, type) else real_remote(**options)(cls)
        if callable(real_remote):
            return real_remote(*args, **options)
        raise TypeError("ray.remote: unsupported use")

    view.remote = remote  # type: ignore[attr-defined]
    return view


# --------------------------------------------------------------------------- loading
@attrs.frozen
class LoadedPr:
    """A PR file executed by :func:`load_pr`."""

    entry: PrClass
    module: types.ModuleType
    absent: tuple[str, ...]  # modules replaced by placeholders
    skipped: tuple[str, ...]  # top-level statements that failed ("line N: Error: ...")

    @property
    def cls(self) -> type:
        value = self.module.__dict__.get(self.entry.class_name)
        if not isinstance(value, type):
            raise PrClassesUnavailable(
                f"{self.entry.key}: {self.entry.path} defines no class {self.entry.class_name}")
        return value


@contextmanager
def _isolated_imports(tree: Path, absent: list[str]) -> Iterator[None]:
    real_ray = _real_ray()
    saved = {name: mod for name, mod in sys.modules.items()
             if name == "verl" or name.startswith("verl.") or name == "ray"}
    before = set(sys.modules)
    for name in saved:
        if name != "ray":
            del sys.modules[name]
    sys.modules["ray"] = _ray_view(real_ray)
    front = _VerlFinder(tree, absent, catch_all=False)
    back = _VerlFinder(tree, absent, catch_all=True)
    sys.meta_path.insert(0, front)
    sys.meta_path.append(back)
    try:
        yield
    finally:
        sys.meta_path.remove(front)
        sys.meta_path.remove(back)
        for name in list(sys.modules):
            module = sys.modules[name]
            loaded_here = name not in before and (
                isinstance(module, _PlaceholderModule) or name == "verl"
                or name.startswith("verl."))
            if loaded_here or name == "ray":
                del sys.modules[name]
        sys.modules.update(saved)


def _exec_by_statement(module: types.ModuleType, source: str, path: Path,
                       skipped: list[str]) -> None:
    tree = ast.parse(source, filename=str(path))
    flags = 0
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            for alias in node.names:
                feature = getattr(__future__, alias.name, None)
                if feature is not None:
                    flags |= feature.compiler_flag
    for node in tree.body:
        code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec",
                       flags=flags, dont_inherit=True)
        try:
            exec(code, module.__dict__)
        except Exception as exc:
            skipped.append(f"line {node.lineno}: {type(exc).__name__}: {exc}")


def load_pr(key: str, root: str | os.PathLike[str] | None = None) -> LoadedPr:
    """Execute PR ``key``'s file from the extracted tree (cached per tree and key)."""
    entry = PR_CLASSES.get(key)
    if entry is None:
        raise PrClassesUnavailable(f"unknown PR key {key!r}; known: {', '.join(PR_CLASSES)}")
    tree = pr_root(root) / key
    path = tree / entry.path
    with _lock:
        cached = _loaded.get((str(tree), key))
        if cached is not None:
            return cached
        if not path.is_file():
            raise PrClassesUnavailable(f"{path} is missing (the checkout lacks {entry.pr}'s "
                                       f"ref?); {EXTRACT_HINT}")
        name = ".".join(Path(entry.path).with_suffix("").parts)
        absent: list[str] = []
        skipped: list[str] = []
        with _isolated_imports(tree, absent):
            parent = name.rpartition(".")[0]
            importlib.import_module(parent)  # the PR tree's packages (shells or real)
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None:
                raise PrClassesUnavailable(f"cannot build an import spec for {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            _exec_by_statement(module, path.read_text(encoding="utf-8"), path, skipped)
        loaded = LoadedPr(entry, module, tuple(dict.fromkeys(absent)), tuple(skipped))
        loaded.cls  # noqa: B018 -- fail here, naming the file, if the class is not there
        _loaded[(str(tree), key)] = loaded
        return loaded


def load_pr_class(key: str, root: str | os.PathLike[str] | None = None) -> type:
    """PR ``key``'s real balancer class (see :data:`PR_CLASSES`)."""
    return load_pr(key, root).cls


# ------------------------------------------------------------------------- the shims
_REQUIRED = ("acquire_server", "release_server", "add_servers", "remove_servers",
             "clear_sticky_cache", "get_status")


class ApiShim:
    """verl's balancer API over a PR class that lacks part of it.

    Calls the class has are passed through; a call it lacks raises
    ``NotImplementedError`` naming the PR, so ``affinity check`` reports the first step
    that needs it. ``ids_api`` classes (#5399, #6122) take ``server_actor_ids`` and return
    a bare server id; their ``get_status`` is read from their own ``_inflight_requests``.
    """

    def __init__(self, entry: PrClass, inner: Any, *, ids_api: bool = False,
                 group_of: Callable[[Any], Any] | None = None) -> None:
        self._entry, self._inner, self._ids_api, self._group_of = entry, inner, ids_api, group_of

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def _lacks(self, name: str) -> NotImplementedError:
        return NotImplementedError(f"{self._entry.pr}'s {self._entry.class_name} has no {name}")

    def acquire_server(self, request_id: Any, **extra: Any) -> Any:
        if self._group_of is not None:
            extra = {**extra, "request_group_id": self._group_of(request_id)}
        result = self._inner.acquire_server(request_id, **extra)
        return (result, None) if self._ids_api else result

    def release_server(self, server_id: Any) -> None:
        self._inner.release_server(server_id)

    def add_servers(self, servers: Mapping[str, Any]) -> None:
        method = getattr(self._inner, "add_servers", None)
        if method is None:
            raise self._lacks("add_servers")
        method(servers)

    def remove_servers(self, server_ids: list[str]) -> None:
        method = getattr(self._inner, "remove_servers", None)
        if method is None:
            raise self._lacks("remove_servers")
        method(server_ids)

    def clear_sticky_cache(self) -> Any:
        method = getattr(self._inner, "clear_sticky_cache", None)
        if method is None:
            raise self._lacks("clear_sticky_cache")
        return method()

    def get_status(self) -> Any:
        method = getattr(self._inner, "get_status", None)
        if method is not None:
            return method()
        loads = dict(self._inner._inflight_requests)
        return {"servers": loads, "total_inflight": sum(loads.values()),
                "active_servers": len(loads)}


def _complete(entry: PrClass, instance: Any) -> Any:
    """The instance itself when it has verl's API, else a shim raising for the rest."""
    if all(callable(getattr(instance, m, None)) for m in _REQUIRED):
        return instance
    return ApiShim(entry, instance)


def _build(key: str, servers: Mapping[str, Any], options: Mapping[str, Any]) -> Any:
    return load_pr_class(key)(servers=dict(servers), **options)


def head(servers: Mapping[str, Any], **options: Any) -> Any:
    """verl main's ``GlobalRequestLoadBalancer`` (``llm_server.py`` at the checkout's main)."""
    return _complete(PR_CLASSES["head"], _build("head", servers, options))


def pr7435(servers: Mapping[str, Any], **options: Any) -> Any:
    """PR #7435's ``GlobalRequestLoadBalancer`` (``affinity_break_margin``)."""
    return _complete(PR_CLASSES["pr7435"], _build("pr7435", servers, options))


def pr6712(servers: Mapping[str, Any], **options: Any) -> Any:
    """PR #6712's ``GlobalRequestLoadBalancer`` in its new ``router.py``."""
    return _complete(PR_CLASSES["pr6712"], _build("pr6712", servers, options))


def pr6533(servers: Mapping[str, Any], **options: Any) -> Any:
    """PR #6533's ``GlobalRequestLoadBalancer`` (the global dual-threshold gate).

    ``affinity check`` states the relative threshold as an exact decimal or fraction string;
    verl's YAML hands the class a float, so it is converted (exact for the dyadic values the
    vectors use, such as 3/2)."""
    rel = options.get("balance_rel_threshold")
    if isinstance(rel, str):
        options = {**options, "balance_rel_threshold": float(Fraction(rel))}
    return _complete(PR_CLASSES["pr6533"], _build("pr6533", servers, options))


def _ids_build(key: str, servers: Mapping[str, Any], options: Mapping[str, Any]) -> Any:
    return load_pr_class(key)(list(servers), **options)


def pr5399(servers: Mapping[str, Any], **options: Any) -> Any:
    """PR #5399's first ``GlobalRequestLoadBalancer`` (list of ids; acquire returns an id)."""
    entry = PR_CLASSES["pr5399"]
    return ApiShim(entry, _ids_build("pr5399", servers, options), ids_api=True)


def _pr6122(name: str, servers: Mapping[str, Any], options: Mapping[str, Any],
            group_of: Callable[[Any], Any] | None) -> Any:
    base = PR_CLASSES["pr6122"]
    entry = attrs.evolve(base, class_name=name)
    cls = load_pr("pr6122").module.__dict__.get(name)
    if not isinstance(cls, type):
        raise PrClassesUnavailable(f"pr6122: {base.path} defines no class {name}")
    return ApiShim(entry, cls(list(servers), **options), ids_api=True, group_of=group_of)


def pr6122_group(servers: Mapping[str, Any], **options: Any) -> Any:
    """PR #6122's ``GroupStickyLoadBalancer`` driven with group ids: ``affinity check``'s
    ``request_group_id`` is passed through as the PR's own callers pass it.

    The class takes no group option: it *is* one configuration, R-GRP-8's
    (``group_stickiness="only"``, ``max_group_cache_size = max_cache_size``, no
    ``group_break_margin``). Those options are therefore accepted exactly when they name
    that configuration and dropped before the class is called; any other value raises
    ``TypeError`` naming it, as an unknown keyword would, so the feature is reported
    unsupported."""
    rest = dict(options)
    stickiness = rest.pop("group_stickiness", "only")
    margin = rest.pop("group_break_margin", None)
    size = rest.pop("max_group_cache_size", rest.get("max_cache_size"))
    if stickiness != "only":
        raise TypeError(f"pr6122_group: group_stickiness={stickiness!r}: PR #6122's class "
                        "is group_stickiness 'only' (R-GRP-8)")
    if margin is not None:
        raise TypeError(f"pr6122_group: group_break_margin={margin!r}: PR #6122's class "
                        "never reconsiders a group pin (accepted: None)")
    if size is not None and size != rest.get("max_cache_size", size):
        raise TypeError(f"pr6122_group: max_group_cache_size={size!r}: PR #6122's group map "
                        f"is max_cache_size={rest.get('max_cache_size')!r} entries")
    if "max_cache_size" not in rest and size is not None:
        rest["max_cache_size"] = size
    return _pr6122("GroupStickyLoadBalancer", servers, rest, None)


def pr6122_request(servers: Mapping[str, Any], **options: Any) -> Any:
    """PR #6122's ``RequestStickyLoadBalancer`` (its request-level mode)."""
    return _pr6122("RequestStickyLoadBalancer", servers, options, None)


def pr6122_group_no_group(servers: Mapping[str, Any], **options: Any) -> Any:
    """PR #6122's ``GroupStickyLoadBalancer`` called without a group id, as verl's
    balancer API calls it."""
    return _pr6122("GroupStickyLoadBalancer", servers, options, lambda _rid: None)


def pr6122_group_per_request(servers: Mapping[str, Any], **options: Any) -> Any:
    """PR #6122's ``GroupStickyLoadBalancer`` with one group per request
    (``request_group_id = request_id``)."""
    return _pr6122("GroupStickyLoadBalancer", servers, options, lambda rid: rid)


def pr6940(servers: Mapping[str, Any], **options: Any) -> Any:
    """PR #6940's ``KVCAwareBalancer`` with the PR's own default ``router_config``
    (``LLMServerManager._init_global_load_balancer``: one kvc_aware strategy, alpha 0.5,
    load_threshold 0.8, polling collector)."""
    extra = {k: v for k, v in options.items() if k != "max_cache_size"}
    config = {
        "strategies": [{
            "_target_": "verl.workers.rollout.llm_router.config.strategy.KVCAwareStrategyConfig",
            "alpha": 0.5, "load_threshold": 0.8,
            "layer_weights": {"gpu": 0.7, "cpu": 0.2, "ssd": 0.1},
            "collector_names": ["vllm_polling"], "weight": 1.0,
        }],
        "sticky_max_size": options.get("max_cache_size", 10000),
    }
    cls = load_pr_class("pr6940")
    return _complete(PR_CLASSES["pr6940"], cls(servers=dict(servers), router_config=config,
                                               **extra))
