"""Conformance vectors: the file format, its parser and the manifest.

Theory of operation
-------------------
A vector is one JSON file ``spec/vectors/<suite>/<case>.json`` describing one case
(formal-methods.md section 5, after ethereum/consensus-specs): a configuration, an
initial state, and ordered steps. spec/vectors/README.md is the consumer's contract;
this module is its Python reading, shared by the reference consumer
(:mod:`affinity_conformance.vector_runner`), ``affinity check`` and the generator.

* Text: the canonical JSON of the case (:func:`affinity_core.canonical_dumps`: UTF-8,
  sorted keys, compact separators, non-ASCII unescaped) followed by one newline. Numbers
  are integers except where a case must carry a float (a validation config, a malformed
  event); :func:`case_text` refuses a float anywhere else and one whose text would need an
  exponent (spec/vectors/README.md, "Canonical JSON").
* ``_info.sha256`` is the SHA-256 of the canonical JSON of the case *without* ``_info``;
  ``MANIFEST.json`` holds the SHA-256 of every file's bytes.
* A case is either *valid* (``config`` and ``initial_state`` decode, ``steps`` run) or
  a construction rejection (top-level ``"valid": false`` with ``error.stage`` naming
  what must be rejected: ``config`` or ``initial_state``).
* A step is an event step (``event``, ``expect``, optional ``allowed``, ``valid`` and
  ``error``) or a check step (``checks``). An event step with ``error.stage == "event"``
  carries event JSON that a decoder must reject; it has no outcome.

Parsing never raises anything but :class:`VectorError`, whose message names the file,
the JSON location (``steps[3].event``) and what was expected, so ``affinity check`` can
report a malformed vector instead of crashing on it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from affinity_engine import (
    CodecError,
    Config,
    ConfigError,
    Event,
    State,
    canonical_dumps,
    config_from_json,
    event_from_json,
    state_from_json,
)

__all__ = [
    "CHECK_FIELDS",
    "FEATURES",
    "GENERATOR",
    "LEVELS",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "SOURCES",
    "STRICT_CONFIG",
    "SUITES",
    "VECTOR_FORMAT",
    "Case",
    "CheckStep",
    "EventStep",
    "VectorError",
    "case_digest",
    "case_text",
    "file_digest",
    "float_problems",
    "levels_of",
    "load_case",
    "load_manifest",
    "parse_case",
    "seal",
    "vector_files",
]

VECTOR_FORMAT = "affinity-vector/1"
MANIFEST_FORMAT = "affinity-vectors-manifest/1"
MANIFEST_NAME = "MANIFEST.json"
GENERATOR = "affinity_conformance.generate 1"

# Suite order is report order: the verl-compatible suites first.
SUITES: tuple[str, ...] = (
    "legacy", "eviction", "failover", "determinism", "margin", "band", "counters",
    "dual_threshold", "ties", "unkeyed", "leases", "observations", "group", "prefix", "validation",
    "counterexamples",
    "regressions",
)
SOURCES = ("scenario", "enumeration", "random", "counterexample", "regression")

# What a case needs from an implementation besides verl 0.9.1's plain API.
FEATURES: tuple[str, ...] = (
    "margin",            # constructor takes affinity_break_margin
    "context_band",      # takes affinity_break_tokens / affinity_break_band_cap and the
                         # acquire's context_tokens (declared as an acquire field)
    "dual_threshold",    # constructor takes the PR #6533 gate
    "full_determinism",  # constructor takes full_determinism
    "hash_stable",       # constructor takes hash_mode="stable"
    "tie_hashed",        # constructor takes tie_break="hashed"
    "lease_accounting",  # constructor takes lease_accounting; release takes request_id
    "unkeyed",           # acquire_server(request_id=None) is an unkeyed request
    "counters",          # get_status() reports affinity_kept / affinity_broken
    "observe_loads",     # observe_loads(observed) reconciles external load (extension)
    "group_pins",        # constructor takes group_stickiness="only" (with max_group_cache_size
                         # equal to max_cache_size) and acquire_server takes request_group_id
                         # (PR #6122's call shape): R-GRP-8's configuration needs only this
    "group_optional",    # a keyed acquire without group_id under group stickiness is routed
                         # as without groups, and group ids are ignored with it "off" (R-GRP-7);
                         # PR #6122's class refuses an acquire without one (R-GRP-8)
    "group_fallback",    # constructor takes group_stickiness="fallback"
    "group_margin",      # constructor takes group_break_margin (an integer)
    "group_cache_size",  # constructor takes a max_group_cache_size other than max_cache_size
    "prefix_placement",  # constructor takes placement_margin and acquire_server takes
                         # cached_prefix, a {server_id: tokens} estimate (R-PFX-1..3)
    "core_events",       # uses what only the core API expresses (malformed events, absent
                         # request_hash, duplicate server ids): not checkable through verl's API
)

# Conformance levels (spec/vectors/README.md, "Condition: levels"). Every case declares the
# levels it counts toward: "core" (verl's semantics through verl's API: routing decisions,
# status, rejections), the feature levels (one per name in FEATURES: the case needs that
# option or event), and "strict-config" (the spec's construction-time refusals, several of
# which verl does not make: SPEC section 18). A consumer reports a verdict per level, as the
# JSON Schema test suite keeps its required and optional/ tests apart.
STRICT_CONFIG = "strict-config"
LEVELS: tuple[str, ...] = ("core", *FEATURES, STRICT_CONFIG)

CHECK_FIELDS = ("servers", "lru", "affinity_kept", "affinity_broken", "external", "status")


class VectorError(ValueError):
    """A vector file is malformed; the message names the file, location and expectation."""


# --------------------------------------------------------------------------- text
def case_digest(case: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of the case without its ``_info``."""
    body = {k: v for k, v in case.items() if k != "_info"}
    return hashlib.sha256(canonical_dumps(body).encode("utf-8")).hexdigest()


def levels_of(case: Mapping[str, Any]) -> list[str]:
    """The levels a case counts toward: a construction rejection is ``strict-config``; any
    other case is in the levels of its ``features``, or in ``core`` when it needs none."""
    if case.get("valid", True) is False:
        return [STRICT_CONFIG]
    features = [f for f in FEATURES if f in case.get("features", [])]
    return features or ["core"]


def seal(case: Mapping[str, Any]) -> dict[str, Any]:
    """The case with ``levels`` (when not given) and ``_info`` (generator, digest) filled in."""
    body = {k: v for k, v in case.items() if k != "_info"}
    body.setdefault("levels", levels_of(body))
    return {**body, "_info": {"generator": GENERATOR, "sha256": case_digest(body)}}


def float_problems(case: Mapping[str, Any]) -> list[str]:
    """Where ``case`` breaks the README's number rules (empty when it keeps them).

    A float may appear only in a ``validation`` case's ``config`` (a value as a user writes
    it: ``2.0``, ``-0.0``, ``0.5``) or in the event of a malformed-event step; elsewhere
    every number is an integer. Its text is Python's ``repr`` (shortest round trip, always a
    fraction part), which has no exponent only for 1e-4 <= |x| < 1e16 and zero: a consumer
    then never meets ``1e+16`` and the text it compares is the text of this module.
    """
    problems: list[str] = []

    def allowed(path: tuple[Any, ...]) -> bool:
        if path[:1] == ("config",):
            return case.get("suite") == "validation"
        if len(path) >= 3 and path[0] == "steps" and path[2] == "event":
            steps = case.get("steps")
            step = steps[path[1]] if isinstance(steps, list) else None
            return (isinstance(step, dict) and step.get("valid") is False
                    and isinstance(step.get("error"), dict)
                    and step["error"].get("stage") == "event")
        return False

    def walk(value: Any, path: tuple[Any, ...]) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                walk(item, (*path, key))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, (*path, index))
        elif isinstance(value, float):
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
            text = repr(value)
            if not allowed(path):
                problems.append(f"{where.lstrip('.')}: float {text} where the format has "
                                "integers only (floats: a validation config, a malformed event)")
            elif not re.fullmatch(r"-?[0-9]+\.[0-9]+", text):
                problems.append(f"{where.lstrip('.')}: float {text} has no canonical text "
                                "(finite, 1e-4 <= |x| < 1e16 or zero, written without exponent)")

    walk(case, ())
    return problems


def case_text(case: Mapping[str, Any]) -> str:
    """The exact file text of a case: canonical JSON and one newline.

    Raises :class:`VectorError` for a float the format does not allow (:func:`float_problems`).
    """
    problems = float_problems(case)
    if problems:
        name = f"{case.get('suite', '?')}/{case.get('case', '?')}"
        raise VectorError(f"{name}: {problems[0]}")
    return canonical_dumps(case) + "\n"


def file_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------ parsing
@attrs.frozen
class EventStep:
    index: int
    raw_event: Any
    event: Event | None  # None when the event JSON itself must be rejected
    expect: dict[str, Any] | None
    allowed: tuple[str, ...] | None
    valid: bool
    error: dict[str, Any] | None


@attrs.frozen
class CheckStep:
    index: int
    checks: dict[str, Any]


Step = EventStep | CheckStep


@attrs.frozen
class Case:
    """A parsed vector. ``config``/``initial_state`` are None for construction rejections."""

    path: str
    suite: str
    name: str
    description: str
    source: str
    requirements: tuple[str, ...]
    features: tuple[str, ...]
    raw_config: Any
    raw_initial_state: Any
    config: Config | None
    initial_state: State | None
    valid: bool
    error: dict[str, Any] | None
    steps: tuple[Step, ...]
    data: dict[str, Any]
    levels: tuple[str, ...] = ("core",)

    @property
    def server_ids(self) -> list[str]:
        """The initial servers, read from the raw JSON (also for rejected cases)."""
        servers = self.raw_initial_state.get("servers", []) if isinstance(
            self.raw_initial_state, dict) else []
        return [p[0] for p in servers if isinstance(p, list) and p]


class _Where:
    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, where: str, message: str) -> VectorError:
        return VectorError(f"{self.path}: {where}: {message}")


def _require(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], at: _Where,
             where: str) -> Any:
    if key not in obj:
        raise at.fail(where, f"missing required field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise at.fail(f"{where}.{key}", f"expected {names}, got {value!r}")
    return value


def _str_list(value: Any, at: _Where, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise at.fail(where, f"expected a list of strings, got {value!r}")
    return tuple(value)


def parse_case(data: Any, path: str = "<vector>") -> Case:
    """Validate the structure of a decoded vector and decode its core values."""
    at = _Where(path)
    if not isinstance(data, dict):
        raise at.fail("top level", f"expected a JSON object, got {type(data).__name__}")
    fmt = data.get("format")
    if fmt != VECTOR_FORMAT:
        raise at.fail("format", f"expected {VECTOR_FORMAT!r}, got {fmt!r}")
    suite = _require(data, "suite", str, at, "case")
    name = _require(data, "case", str, at, "case")
    source = data.get("source", "scenario")
    if source not in SOURCES:
        raise at.fail("source", f"expected one of {list(SOURCES)}, got {source!r}")
    requirements = _str_list(data.get("requirements", []), at, "requirements")
    features = _str_list(data.get("features", []), at, "features")
    unknown = sorted(set(features) - set(FEATURES))
    if unknown:
        raise at.fail("features", f"unknown features {unknown}; known: {list(FEATURES)}")
    valid = data.get("valid", True)
    if not isinstance(valid, bool):
        raise at.fail("valid", f"expected true or false, got {valid!r}")
    levels = _str_list(data.get("levels", levels_of(data)), at, "levels")
    if not levels or set(levels) - set(LEVELS):
        raise at.fail("levels", f"expected a non-empty list of {list(LEVELS)}, got {list(levels)}")
    raw_config = _require(data, "config", dict, at, "case")
    raw_state = _require(data, "initial_state", dict, at, "case")
    error = data.get("error")
    config: Config | None = None
    state: State | None = None
    if not valid:
        if not isinstance(error, dict) or error.get("stage") not in ("config", "initial_state"):
            raise at.fail("error", "a case with valid: false needs error.stage "
                          f"'config' or 'initial_state', got {error!r}")
        steps_raw = data.get("steps", [])
        if steps_raw:
            raise at.fail("steps", "a construction rejection has no steps")
        return Case(path, suite, name, str(data.get("description", "")), source,
                    requirements, features, raw_config, raw_state, None, None, False, error,
                    (), data, levels)
    try:
        config = config_from_json(raw_config)
    except (CodecError, TypeError) as exc:  # TypeError: a list or object where a name belongs
        raise at.fail("config", str(exc)) from None
    try:
        state = state_from_json(config, raw_state)
    except (CodecError, ConfigError, TypeError) as exc:
        raise at.fail("initial_state", str(exc)) from None
    steps_raw = _require(data, "steps", list, at, "case")
    steps = tuple(_parse_step(raw, i, at) for i, raw in enumerate(steps_raw))
    return Case(path, suite, name, str(data.get("description", "")), source, requirements,
                features, raw_config, raw_state, config, state, True, None, steps, data, levels)


def _parse_step(raw: Any, index: int, at: _Where) -> Step:
    where = f"steps[{index}]"
    if not isinstance(raw, dict):
        raise at.fail(where, f"expected a JSON object, got {raw!r}")
    if "checks" in raw:
        if set(raw) != {"checks"}:
            raise at.fail(where, f"a check step holds only 'checks', got keys {sorted(raw)}")
        checks = raw["checks"]
        if not isinstance(checks, dict) or not checks:
            raise at.fail(f"{where}.checks", f"expected a non-empty object, got {checks!r}")
        bad = sorted(set(checks) - set(CHECK_FIELDS))
        if bad:
            raise at.fail(f"{where}.checks", f"unknown fields {bad}; known: {list(CHECK_FIELDS)}")
        return CheckStep(index, checks)
    extra = sorted(set(raw) - {"event", "expect", "allowed", "valid", "error"})
    if extra or "event" not in raw:
        raise at.fail(where, "an event step has 'event' and optional 'expect', 'allowed', "
                      f"'valid', 'error'; got keys {sorted(raw)}")
    valid = raw.get("valid", True)
    if not isinstance(valid, bool):
        raise at.fail(f"{where}.valid", f"expected true or false, got {valid!r}")
    error = raw.get("error")
    if error is not None and not isinstance(error, dict):
        raise at.fail(f"{where}.error", f"expected an object, got {error!r}")
    allowed_raw = raw.get("allowed")
    allowed = None if allowed_raw is None else _str_list(allowed_raw, at, f"{where}.allowed")
    if error is not None and error.get("stage") == "event":
        if valid or "expect" in raw:
            raise at.fail(where, "a malformed-event step has valid: false and no 'expect'")
        return EventStep(index, raw["event"], None, None, None, False, error)
    op = raw["event"].get("op") if isinstance(raw["event"], dict) else None
    if op is not None and not isinstance(op, str):
        raise at.fail(f"{where}.event.op", f"must be an event name, got {type(op).__name__}")
    try:
        event = event_from_json(raw["event"])
    except (CodecError, TypeError) as exc:  # TypeError: an unhashable value the codec looks up
        raise at.fail(f"{where}.event", str(exc)) from None
    expect = raw.get("expect")
    if not isinstance(expect, dict) or not isinstance(expect.get("kind"), str):
        raise at.fail(f"{where}.expect", f"expected an outcome object with 'kind', got {expect!r}")
    if not valid and expect.get("kind") != "rejected":
        raise at.fail(where, f"valid: false needs a 'rejected' outcome, got {expect.get('kind')!r}")
    return EventStep(index, raw["event"], event, expect, allowed, valid, error)


def load_case(path: str | os.PathLike[str]) -> Case:
    """Read and parse one vector file (errors name the file and the JSON location)."""
    name = os.fspath(path)
    try:
        text = Path(name).read_text(encoding="utf-8")
    except OSError as exc:
        raise VectorError(f"{name}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise VectorError(f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise VectorError(
            f"{name}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    return parse_case(data, name)


def load_manifest(root: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(root) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise VectorError(f"{path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise VectorError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise VectorError(f"{path}: expected a manifest with format {MANIFEST_FORMAT!r}")
    if not isinstance(data.get("files"), dict):
        raise VectorError(f"{path}: 'files' must map relative paths to sha256 digests")
    return data


def vector_files(root: str | os.PathLike[str]) -> list[Path]:
    """Every case file under ``root`` (``<suite>/<case>.json``), sorted."""
    base = Path(root)
    return sorted(p for p in base.glob("*/*.json") if p.parent.name != "schema")
