"""Load an implementation under test (``module:Class`` or ``path.py:factory``) and learn
how to construct it and what it supports.

Theory of operation
-------------------
``affinity check IMPL`` accepts anything with verl's balancer API. Two questions have to be
answered before a single vector runs, and both are answered by *trying*, not by trusting
signatures:

1. **How are options passed?** (``--ctor``)

   * ``verl``: ``IMPL(servers={sid: None, ...}, max_cache_size=N[, full_determinism=b])``
     -- verl 0.9.1's ``GlobalRequestLoadBalancer`` convention; no other option is tried;
   * ``pr7435``: the same plus ``affinity_break_margin=m`` (PR #7435);
   * ``kwargs``: the same keyword style with every option the constructor accepts
     (``tie_break``, ``hash_mode``, ``lease_accounting``, ``balance_abs_threshold`` /
     ``balance_rel_threshold`` or ``dual_threshold``) -- Affinity's own adapter;
   * ``yaml``: verl's router plug-in path,
     ``IMPL(servers, {"router_class": ..., "full_determinism": b, **options})``.

   ``auto`` (the default) picks ``kwargs`` when a keyword construction works, else ``yaml``.

2. **Which features does it have?** (:data:`~affinity_conformance.vector_format.FEATURES`)
   A feature is supported iff constructing with a *valid* value of its option succeeds
   (verl's class raises ``TypeError`` for an unknown keyword). ``counters`` needs
   ``affinity_kept``/``affinity_broken`` in ``get_status()``; ``observe_loads`` needs an
   ``observe_loads`` method; ``unkeyed`` is probed by behaviour (two ``request_id=None``
   acquires on two idle servers must go to different servers: verl would pin ``None`` like
   any key); ``core_events`` is never available through this API. ``context_band`` needs
   the band's options (``affinity_break_tokens``, ``affinity_break_band_cap``) accepted
   *and* a way to receive the acquire's ``context_tokens``: an instance built with the band
   must declare ``"prompt_ids"`` (verl 0.9.1's client then sends the prompt's token ids,
   whose length is ``c``) or ``"context_tokens"`` (the count itself) in
   ``require_acquire_fields()`` -- the same declaration verl's own client reads.
   ``group_pins`` needs ``group_stickiness="only"`` accepted (with ``max_group_cache_size``
   equal to ``max_cache_size``) *and* an ``acquire_server`` that takes
   ``request_group_id`` (PR #6122's call shape, which is how a grouped acquire is
   delivered); ``group_fallback``, ``group_margin`` and ``group_cache_size`` need, on top,
   ``"fallback"``, an integer ``group_break_margin`` and a group map of another size than
   the sticky map; ``group_optional`` needs such an instance to route a keyed acquire
   without a group id (R-GRP-7; PR #6122's class refuses one). When only half of
   ``group_pins`` is there, :attr:`Impl.notes` says which half is missing, and the report
   names it instead of the bare feature. ``prefix_placement`` needs ``placement_margin``
   accepted *and* an ``acquire_server`` that takes ``cached_prefix`` (by name or
   ``**kwargs``), through which each acquire's estimate is delivered as a
   ``{server_id: tokens}`` dict.

A case needing an unsupported feature is reported ``unsupported``, never run, so a class
without a margin is told "unsupported", not crashed. Every failure here is a
:class:`ImplError` with a one-line explanation: import errors, missing attributes, a
non-callable target, missing methods, or a constructor that fails even with defaults.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from affinity_engine import Config, HashMode, TieBreak

__all__ = ["CONTEXT_FIELDS", "CONVENTIONS", "GROUP_FIELD", "PREFIX_FIELD", "REQUIRED_METHODS",
           "Impl", "ImplError", "context_field", "declared_acquire_fields", "load_impl",
           "takes_group_id", "takes_keyword"]

CONVENTIONS = ("auto", "verl", "pr7435", "kwargs", "yaml")
REQUIRED_METHODS = ("acquire_server", "release_server", "add_servers", "remove_servers",
                    "clear_sticky_cache", "get_status")
_PROBE_SERVERS = ("p0", "p1")
CONTEXT_FIELDS = ("prompt_ids", "context_tokens")  # acquire fields that carry the band's c
GROUP_FIELD = "request_group_id"  # PR #6122's acquire keyword carrying the group id
PREFIX_FIELD = "cached_prefix"  # the acquire keyword carrying the estimate (R-PFX-3)
_GROUP_PROBE_CACHE = 8  # a probe's max_cache_size (and, but for group_cache_size, group's)


# File name endings of implementations `affinity check` cannot load (it imports Python).
_OTHER_LANGUAGES = frozenset({".js", ".mjs", ".cjs", ".ts", ".rs", ".go", ".java", ".kt",
                              ".c", ".cc", ".cpp", ".h", ".hpp", ".rb", ".lua", ".jl",
                              ".so", ".dll", ".dylib", ".wasm", ".jar"})


class ImplError(ValueError):
    """The implementation cannot be loaded or constructed; the message says why."""


def _import_target(spec: str) -> tuple[Any, str]:
    if ":" not in spec:
        raise ImplError(f"IMPL {spec!r}: expected module:Class or path/to/file.py:Class "
                        "(for example verl.workers.rollout.router:GlobalRequestLoadBalancer)")
    module_part, _, attr_path = spec.rpartition(":")
    if not module_part or not attr_path:
        raise ImplError(f"IMPL {spec!r}: both the module and the attribute must be given")
    foreign = Path(module_part).suffix.lower() in _OTHER_LANGUAGES or (
        not module_part.endswith(".py") and Path(module_part).is_file())
    if foreign:
        raise ImplError(f"IMPL {spec!r}: {module_part} is not Python; affinity check loads a "
                        "Python class (module:Class or path/to/file.py:Class). Another "
                        "language: affinity vectors export DIR writes the vectors with "
                        "their README.md (the consumer contract) and SPEC.md for your own "
                        "runner; or check a decision log with affinity replay, or an HTTP "
                        "router with affinity check-router")
    try:
        if module_part.endswith(".py") or os.sep in module_part:
            path = Path(module_part)
            if not path.is_file():
                raise ImplError(f"IMPL {spec!r}: no such file {path}")
            name = f"_affinity_impl_{abs(hash(str(path.resolve()))):x}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            if module_spec is None or module_spec.loader is None:
                raise ImplError(f"IMPL {spec!r}: cannot import {path}")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            module_spec.loader.exec_module(module)
        else:
            if "" not in sys.path and os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())  # as `python -m` does
            module = importlib.import_module(module_part)
    except ImplError:
        raise
    except SyntaxError as exc:
        raise ImplError(f"IMPL {spec!r}: syntax error in {exc.filename}:{exc.lineno}: "
                        f"{exc.msg}") from None
    except SystemExit as exc:  # else `affinity check` would exit with the module's status
        raise ImplError(f"IMPL {spec!r}: importing {module_part!r} called "
                        f"sys.exit({exc.code!r})") from None
    except Exception as exc:
        raise ImplError(f"IMPL {spec!r}: importing {module_part!r} failed: "
                        f"{type(exc).__name__}: {exc}") from None
    target: Any = module
    for part in attr_path.split("."):
        if not hasattr(target, part):
            available = sorted(n for n in dir(target) if not n.startswith("_"))[:20]
            raise ImplError(f"IMPL {spec!r}: {module_part!r} has no attribute {part!r} "
                            f"(public names: {', '.join(available) or 'none'})")
        target = getattr(target, part)
    if not callable(target):
        raise ImplError(f"IMPL {spec!r}: {attr_path!r} is a {type(target).__name__}, "
                        "not a class or factory")
    return target, attr_path


def _verl_module_hint(spec: str) -> str | None:
    """verl/__init__ imports torch; verl's router module is loaded without it
    (:mod:`affinity_conformance.upstream`)."""
    if spec.split(":", 1)[0] == "verl.workers.rollout.router":
        return "verl"
    return None


@attrs.frozen
class Impl:
    """A loaded implementation: how to build it, and what it supports."""

    spec: str
    factory: Callable[..., Any]
    convention: str
    features: frozenset[str]
    gate_style: str | None  # "balance" (balance_*_threshold kwargs), "object", or None
    accepts_tie_break: bool
    release_takes_request_id: bool
    # feature -> why it is missing, where a bare feature name would not say (group_pins)
    notes: Mapping[str, str] = attrs.field(factory=dict)

    # ------------------------------------------------------------------ building
    def options_for(self, config: Config, tie_break: str | None) -> dict[str, Any]:
        """Constructor options for ``config`` in this implementation's terms."""
        options: dict[str, Any] = {"max_cache_size": config.max_cache_size}
        if config.full_determinism:
            options["full_determinism"] = True
        if config.affinity_break_margin is not None:
            options["affinity_break_margin"] = config.affinity_break_margin
        if config.affinity_break_tokens is not None:
            options["affinity_break_tokens"] = config.affinity_break_tokens
            options["affinity_break_band_cap"] = config.affinity_break_band_cap
        gate = config.dual_threshold
        if gate is not None:
            rel = str(gate.balance_rel_threshold)
            if self.gate_style == "object":
                options["dual_threshold"] = {"balance_abs_threshold": gate.balance_abs_threshold,
                                             "balance_rel_threshold": rel}
            else:
                options["balance_abs_threshold"] = gate.balance_abs_threshold
                options["balance_rel_threshold"] = rel
        if config.hash_mode is HashMode.STABLE:
            options["hash_mode"] = "stable"
        if config.lease_accounting:
            options["lease_accounting"] = True
        if tie_break is not None and self.accepts_tie_break:
            options["tie_break"] = tie_break
        if config.groups:
            options["group_stickiness"] = config.group_stickiness.value
            if config.group_break_margin is not None:
                options["group_break_margin"] = config.group_break_margin
            options["max_group_cache_size"] = config.max_group_cache_size
        if config.placement_margin is not None:
            options["placement_margin"] = config.placement_margin
        return options

    def build(self, servers: list[str], options: Mapping[str, Any]) -> Any:
        """Construct an instance (exceptions propagate: callers decide what they mean)."""
        return _construct(self.factory, self.convention, self.spec, servers, options)


def _construct(factory: Callable[..., Any], convention: str, spec: str, servers: list[str],
               options: Mapping[str, Any]) -> Any:
    handles = dict.fromkeys(servers)
    if convention == "yaml":
        # A router YAML states full_determinism: verl does not pass it to a plug-in.
        return factory(handles, {"router_class": spec.replace(":", "."),
                                 "full_determinism": False, **options})
    return factory(servers=handles, **options)


def _try(factory: Callable[..., Any], convention: str, spec: str,
         options: Mapping[str, Any]) -> Any | None:
    try:
        return _construct(factory, convention, spec, list(_PROBE_SERVERS), options)
    except Exception:
        return None


def declared_acquire_fields(instance: Any) -> list[str]:
    """``require_acquire_fields()`` as verl 0.9.1's client reads it ([] when absent)."""
    method = getattr(instance, "require_acquire_fields", None)
    if not callable(method):
        return []
    try:
        fields = method()
    except Exception:
        return []
    return [f for f in fields if isinstance(f, str)] if isinstance(fields, (list, tuple)) else []


def context_field(instance: Any) -> str | None:
    """How ``instance`` takes the acquire's ``context_tokens``: ``"prompt_ids"`` (verl's
    field: a sequence whose length is the count), ``"context_tokens"``, or None."""
    fields = declared_acquire_fields(instance)
    return next((f for f in CONTEXT_FIELDS if f in fields), None)


def _has_methods(instance: Any) -> list[str]:
    return [m for m in REQUIRED_METHODS if not callable(getattr(instance, m, None))]


def _probe_unkeyed(instance: Any) -> bool:
    try:
        first = instance.acquire_server(request_id=None)
        second = instance.acquire_server(request_id=None)
    except Exception:
        return False
    return bool(_server_of(first) != _server_of(second))


def _server_of(result: Any) -> Any:
    return result[0] if isinstance(result, tuple) and result else result


def takes_keyword(method: Callable[..., Any], name: str) -> bool:
    """Whether ``method`` takes the keyword ``name`` (by name or ``**kwargs``)."""
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def takes_group_id(method: Callable[..., Any]) -> bool:
    """Whether ``acquire_server`` takes ``request_group_id`` (by name or ``**kwargs``)."""
    return takes_keyword(method, GROUP_FIELD)


def _takes_request_id(method: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return "request_id" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def load_impl(spec: str, convention: str = "auto") -> Impl:
    """Import ``spec``, settle the constructor convention and probe its features."""
    if convention not in CONVENTIONS:
        raise ImplError(f"--ctor must be one of {', '.join(CONVENTIONS)}, got {convention!r}")
    if _verl_module_hint(spec) == "verl":
        from .upstream import UpstreamUnavailable, load_upstream_router_module
        try:
            module = load_upstream_router_module()
        except UpstreamUnavailable as exc:
            raise ImplError(f"IMPL {spec!r}: {exc}") from None
        name = spec.split(":", 1)[1]
        factory: Any = getattr(module, name, None)
        if not callable(factory):
            raise ImplError(f"IMPL {spec!r}: verl's router module has no class {name!r}")
    else:
        factory, _ = _import_target(spec)
    candidates = ["kwargs", "yaml"] if convention == "auto" else [convention]
    base: Any = None
    chosen = ""
    errors = []
    for name in candidates:
        style = "yaml" if name == "yaml" else "kwargs"
        try:
            base = _construct(factory, style, spec, list(_PROBE_SERVERS), {})
            chosen = name
            break
        except Exception as exc:
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    if base is None:
        raise ImplError(f"IMPL {spec!r}: cannot construct it with servers only ("
                        + "; ".join(errors) + ")")
    missing = _has_methods(base)
    if missing:
        raise ImplError(f"IMPL {spec!r}: missing verl balancer methods {missing}; "
                        f"required: {', '.join(REQUIRED_METHODS)}")
    style = "yaml" if chosen == "yaml" else "kwargs"
    allowed_options = {"verl": {"full_determinism"},
                       "pr7435": {"full_determinism", "affinity_break_margin"}}.get(chosen)

    def accepts(instance: bool = False, **options: Any) -> Any:
        """Whether a construction with ``options`` succeeds (the instance if asked)."""
        if allowed_options is not None and not set(options) <= allowed_options:
            return None if instance else False
        built = _try(factory, style, spec, options)
        return built if instance else built is not None

    features: set[str] = set()
    if accepts(affinity_break_margin=1):
        features.add("margin")
    banded = _try(factory, style, spec, {"affinity_break_margin": 0, "affinity_break_tokens": 1,
                                         "affinity_break_band_cap": 1})
    if allowed_options is None and banded is not None and context_field(banded) is not None:
        features.add("context_band")
    gate_style = None
    if accepts(balance_abs_threshold=2, balance_rel_threshold="3/2"):
        gate_style = "balance"
    elif accepts(dual_threshold={"balance_abs_threshold": 2, "balance_rel_threshold": "3/2"}):
        gate_style = "object"
    if gate_style:
        features.add("dual_threshold")
    if accepts(full_determinism=True):
        features.add("full_determinism")
    if accepts(full_determinism=True, hash_mode="stable"):
        features.add("hash_stable")
    accepts_tie_break = accepts(tie_break=TieBreak.FIRST.value)
    if accepts(tie_break="hashed"):
        features.add("tie_hashed")
    release_rid = _takes_request_id(base.release_server)
    if release_rid and accepts(lease_accounting=True):
        features.add("lease_accounting")
    status = base.get_status()
    if isinstance(status, Mapping) and {"affinity_kept", "affinity_broken"} <= set(status):
        features.add("counters")
    if callable(getattr(base, "observe_loads", None)):
        features.add("observe_loads")
    probe = _try(factory, style, spec, {})
    if probe is not None and _probe_unkeyed(probe):
        features.add("unkeyed")
    notes = _group_features(accepts, base, features)
    if accepts(placement_margin=1) and takes_keyword(base.acquire_server, PREFIX_FIELD):
        features.add("prefix_placement")
    return Impl(spec, factory, style if chosen in ("kwargs", "yaml") else chosen,
                frozenset(features), gate_style, accepts_tie_break, release_rid, notes)


def _routes_without_group(accepts: Callable[..., Any], size: int) -> bool:
    """Whether an instance with group stickiness routes a keyed acquire without a group id."""
    instance = accepts(max_cache_size=size, group_stickiness="only",
                       max_group_cache_size=size, instance=True)
    if instance is None:
        return False
    try:
        instance.acquire_server(request_id="probe-without-group")
    except Exception:
        return False
    return True


def _group_features(accepts: Callable[..., Any], base: Any, features: set[str]
                    ) -> dict[str, str]:
    """Add the group features ``base``'s class has; the notes on a half-present one."""
    size = _GROUP_PROBE_CACHE

    def grouped(stickiness: str, **more: Any) -> bool:
        return bool(accepts(max_cache_size=size, group_stickiness=stickiness,
                            **{"max_group_cache_size": size, **more}))

    constructs = grouped("only")
    delivers = takes_group_id(base.acquire_server)
    if constructs and not delivers:
        return {"group_pins": "group_pins: acquire_server takes no request_group_id (PR "
                              "#6122's call shape), so no group id can reach it"}
    if delivers and not constructs:
        return {"group_pins": "group_pins: the constructor refuses group_stickiness='only' "
                              "with max_group_cache_size = max_cache_size"}
    if not constructs:
        return {}
    features.add("group_pins")
    if _routes_without_group(accepts, size):
        features.add("group_optional")
    if grouped("fallback"):
        features.add("group_fallback")
    if grouped("only", group_break_margin=1):
        features.add("group_margin")
    if grouped("only", max_group_cache_size=size // 2):
        features.add("group_cache_size")
    return {}
