"""Obligation 19, continued: the events the core refuses, and the encoding's round trip.

Theory of operation
-------------------
Event validation (R-EV-2) is, like configuration validation, a total function from field
values to "accepted as X" or "refused", and it is checked the same way: :data:`EVENT_CASES`
lists the edge values of every field of every event (each side of every bound, booleans
where integers are expected, strings where lists are, empty and lone-surrogate ids,
duplicates) with what SPEC section 4 says (the ``expect`` column is written from the
spec, not from the code). :func:`check_events` builds each with the real constructor and
demands: an accepted value is stored exactly (same value, same type); a refused one raises
:class:`~affinity_engine.EventError` whose message names the field and the value. An event
that does not exist cannot reach :func:`~affinity_engine.step`, so "a refused event changes
nothing" holds by construction once the refusal happens at construction.

:func:`check_codec` holds the encoding (R-CODEC-1) to SPEC's text on the same values:
every accepted event and every configuration of the configuration table survives
``decode(encode(x)) == x`` through canonical text; an event's optional field is present
iff it differs from its default (``tie_draw`` 0, null), so ``request_hash`` 0 and
``context_tokens`` 0 are written; the band's keys appear iff they are set; the refused
values of an acquire are refused by the decoder too (a ``CodecError``). States reached by
a fixed trace (external loads, a full sticky map, leases, non-ASCII ids) must round-trip,
encode ``servers`` as in-flight counts (R-OBS-2) and print non-ASCII ids unescaped; a
lease-mode state given without its book decodes with one fresh epoch per server, an
external load of 0 decodes as none, and a load given as a boolean or as -1 is refused.
The codec is one, the reference's (the engine's functions encode the abstraction of an
engine state), so these checks hold it to SPEC's text: a state's digest is the SHA-256 of
its canonical text; its optional keys (``external``, ``leases``, the group map and
counters) are written exactly when not empty; the decoder refuses the states SPEC rules
out (:data:`REFUSED_STATES`); an outcome writes exactly its non-null fields (a zero
``cleared_groups`` omitted). The outcomes' encoded names (``path``, ``result``,
``reason``) are read off R-OUT-3's text and must be the enums' values, and canonical text
must not depend on the order in which a value's keys were inserted (it sorts them).
:func:`check_defaults` reads SPEC's Default column off ``Config()``.
:func:`check_unread_inputs` holds ``needs_draw`` / ``needs_request_hash`` (R-TIE-5, R-DET-5)
to their promise: where they say an acquire's draw or hash is not read, no value of it
changes the transition, in the reference and in the engine alike.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

import attrs

import affinity_engine.codec as codec
from affinity_core.events import ClearStickyCache, Event
from affinity_core.leases import LeaseBook
from affinity_engine import (
    Acquire,
    AddServers,
    Config,
    ConfigError,
    EventError,
    ObserveLoads,
    Release,
    RemoveServers,
    initial_state,
    step,
)
from affinity_engine.abstraction import to_reference
from affinity_engine.codec import CodecError

__all__ = ["EVENT_CASES", "EventCase", "check_codec", "check_defaults", "check_derived",
           "check_events", "check_unread_inputs"]

_REFUSED = object()
_SURROGATE = "\ud800"


@attrs.frozen
class EventCase:
    field: str  # the field the message must name
    value: Any
    expect: Any  # the stored value, or _REFUSED
    build: Callable[[Any], Event]
    read: Callable[[Any], Any]


def _cases() -> list[EventCase]:
    out: list[EventCase] = []

    def add(field: str, build: Callable[[Any], Event], accepted: list[tuple[Any, Any]],
            refused: list[Any]) -> None:
        def read(e: Any) -> Any:
            return getattr(e, field)
        out.extend(EventCase(field, v, want, build, read) for v, want in accepted)
        out.extend(EventCase(field, v, _REFUSED, build, read) for v in refused)

    ids_ok = [("a", "a"), ("é", "é"), ("a b", "a b"), ("x" * 300, "x" * 300)]
    ids_bad = ["", _SURROGATE, "a" + _SURROGATE, 1, b"a", True, ["a"]]
    # R-EV-1, R-EV-2: acquire -- request_id an id or null; tie_draw an integer >= 0;
    # request_hash any integer or null; context_tokens an integer >= 0 or null.
    add("request_id", lambda v: Acquire(request_id=v), [(None, None), *ids_ok], ids_bad)
    add("tie_draw", lambda v: Acquire(request_id="r", tie_draw=v),
        [(0, 0), (1, 1), (2**70, 2**70)], [-1, -(2**70), True, False, 1.0, 0.0, None, "1"])
    add("request_hash", lambda v: Acquire(request_id="r", request_hash=v),
        [(None, None), (0, 0), (-1, -1), (2**70, 2**70), (-(2**70), -(2**70))],
        [True, False, 1.0, 0.0, "1", []])
    add("context_tokens", lambda v: Acquire(request_id="r", context_tokens=v),
        [(None, None), (0, 0), (1, 1), (10**12, 10**12)],
        [-1, -(2**70), True, False, 1.0, 0.0, "1", []])
    # release: server_id an id; request_id an id or null.
    add("server_id", lambda v: Release(server_id=v), ids_ok, [*ids_bad, None])
    add("request_id", lambda v: Release(server_id="s", request_id=v),
        [(None, None), *ids_ok], ids_bad)
    # add_servers: a list (not a bare string) of pairwise distinct ids.
    lists_ok = [([], ()), (["a"], ("a",)), (("b", "a"), ("b", "a")), (["é", "a"], ("é", "a"))]
    lists_bad = ["ab", "a", None, 1, {"a"}, [""], [1], ["a", None], [_SURROGATE]]
    add("server_ids", lambda v: AddServers(server_ids=v), lists_ok,
        [*lists_bad, ["a", "a"], ["a", "b", "a"]])
    # remove_servers MAY repeat ids.
    add("server_ids", lambda v: RemoveServers(server_ids=v),
        [*lists_ok, (["a", "a"], ("a", "a"))], lists_bad)
    # observe_loads: pairs of an id and an integer >= 0, with distinct ids.
    add("observed", lambda v: ObserveLoads(observed=v),
        [([], ()), ([("a", 0)], (("a", 0),)), ([["a", 3], ["b", 0]], (("a", 3), ("b", 0))),
         ([("a", 2**70)], (("a", 2**70),))],
        [[("a", -1)], [("a", True)], [("a", 1.0)], [("a", None)], [("a", 1), ("a", 2)],
         "ab", [("a",)], [("a", 1, 2)], [("", 1)], [(1, 1)], [(_SURROGATE, 1)], None])
    return out


EVENT_CASES: tuple[EventCase, ...] = tuple(_cases())


def _same(got: Any, want: Any) -> bool:
    # 1 == 1.0 == True: the stored value must also have the spec's type, all the way down.
    return bool(got == want) and repr(got) == repr(want)


# The names a refusal may give the field: an id inside a list is "server id".
_FIELD_NAMES = {"server_ids": ("server_ids", "server id"), "observed": ("observed", "server id")}


def _names(case: EventCase, message: str) -> bool:
    if not any(n in message for n in _FIELD_NAMES.get(case.field, (case.field,))):
        return False
    # a scalar field's message also shows the value; a list's shows the offending item
    return case.field in _FIELD_NAMES or repr(case.value) in message


def check_events() -> tuple[int, list[str]]:
    """(cases checked, problems) over :data:`EVENT_CASES`."""
    problems: list[str] = []
    for case in EVENT_CASES:
        try:
            event = case.build(case.value)
        except EventError as exc:
            if case.expect is not _REFUSED:
                problems.append(f"{case.field}={case.value!r} refused ({exc}); SPEC accepts "
                                f"it as {case.expect!r}")
            elif not _names(case, str(exc)):
                problems.append(f"{case.field}={case.value!r}: the message {str(exc)!r} "
                                "does not name the field and the value (R-EV-2)")
            continue
        except Exception as exc:  # a refusal must be an EventError, never a crash
            problems.append(f"{case.field}={case.value!r} raised {type(exc).__name__}: "
                            f"{exc} instead of an EventError")
            continue
        if case.expect is _REFUSED:
            problems.append(f"{type(event).__name__} {case.field}={case.value!r} accepted; "
                            "SPEC refuses it (R-EV-2)")
        elif not _same(case.read(event), case.expect):
            problems.append(f"{case.field}={case.value!r} stored as {case.read(event)!r}, "
                            f"SPEC says {case.expect!r}")
    return len(EVENT_CASES), problems


def _through_text(value: Any) -> Any:
    return json.loads(codec.canonical_dumps(value))


def _check_event_codec(problems: list[str]) -> None:
    events: list[Event] = [ClearStickyCache()]
    for case in EVENT_CASES:
        if case.expect is not _REFUSED:
            events.append(case.build(case.value))
    defaults = {"tie_draw": 0, "request_hash": None, "context_tokens": None}
    for event in events:
        data = codec.event_to_json(event)
        if isinstance(event, Acquire):
            for name, default in defaults.items():
                if (name in data) != (getattr(event, name) != default):
                    problems.append(f"{event!r} encodes as {data}: {name} must be present "
                                    f"iff it is not {default!r} (R-CODEC-1)")
        _round_trip(event, data, codec.event_from_json, problems)
    for field in ("tie_draw", "request_hash", "context_tokens"):
        for case in EVENT_CASES:
            if case.field != field or case.expect is not _REFUSED:
                continue
            try:
                got = codec.event_from_json({"op": "acquire", "request_id": "r", field: case.value})
            except CodecError:
                continue
            problems.append(f"acquire {field}={case.value!r} decoded as {got!r}; SPEC "
                            "refuses it (R-EV-2, R-CODEC-1)")


def _round_trip(value: Any, data: Any, decode: Any, problems: list[str]) -> None:
    """``data`` (``value``'s encoding), through JSON text and ``decode``, gives ``value``."""
    try:
        back = decode(_through_text(data))
    except CodecError as exc:
        problems.append(f"{value!r} encodes as {data}, which does not decode: {exc}")
        return
    if back != value:
        problems.append(f"{value!r} encodes as {data} and decodes as {back!r}")


def _check_config_codec(problems: list[str]) -> None:
    from affinity_engine import DualThreshold

    from .config_table import CASES

    built: list[object] = []
    for case in CASES:
        try:
            built.append(case.build(case.value))
        except Exception:  # the configuration table judges the refusals
            continue
    # the table's gates are bare DualThresholds: gates with integral and reducible rels
    built += [Config(dual_threshold=DualThreshold(a, r)) for a, r in
              ((1, 1), (0, 2), (-3, "6/4"), (2, 10**20), (1, "11/10"))]
    for config in built:
        if not isinstance(config, Config):
            continue
        data = codec.config_to_json(config)
        band = {"affinity_break_tokens", "affinity_break_band_cap"}
        if (band <= set(data)) != (config.affinity_break_tokens is not None) or \
                (band & set(data) and not band <= set(data)):
            problems.append(f"{config!r} encodes as {data}: the band's keys must be present "
                            "iff set (R-CFG-6)")
        gate = config.dual_threshold
        if gate is not None:  # canonical text: lowest terms, "p" when q = 1 (R-CODEC-1)
            rel = gate.balance_rel_threshold
            text = str(rel.numerator) if rel.denominator == 1 else \
                f"{rel.numerator}/{rel.denominator}"
            written = data["dual_threshold"]["balance_rel_threshold"]
            if written != text:
                problems.append(f"rel {rel!r} encodes as {written!r}; SPEC: {text!r}")
        _round_trip(config, data, codec.config_from_json, problems)


def _trace_states() -> list[tuple[Config, Any]]:
    """States of fixed traces: external loads, a full map, leases, non-ASCII ids, group
    pins and their counters."""
    out: list[tuple[Config, Any]] = []
    for config in (Config(affinity_break_margin=1, max_cache_size=2),
                   Config(lease_accounting=True, max_cache_size=2),
                   Config(affinity_break_margin=0, max_cache_size=2,
                          group_stickiness="fallback", max_group_cache_size=1)):
        state = initial_state(config, ["é", "s1", "s0"])
        out.append((config, state))
        trace: list[Event] = [
            Acquire(request_id="ä", group_id="g"), Acquire(request_id="b", group_id="g"),
            Acquire(request_id="c", group_id="h"),
            ObserveLoads(observed=[("s1", 4), ("é", 0)]), Release(server_id="é",
                                                                  request_id="ä"),
            RemoveServers(server_ids=["s0"]), AddServers(server_ids=["s0", "s1"]),
            Acquire(request_id=None), Release(server_id="s0", request_id="c"),
            ClearStickyCache(),  # the group counters outlive the group map
        ]
        for event in trace:
            state = step(config, state, event).state
            out.append((config, state))
    return out


def _check_state_codec(problems: list[str]) -> None:
    for config, state in _trace_states():
        data = codec.state_to_json(state)
        text = codec.canonical_dumps(data)
        if codec.state_digest(state) != hashlib.sha256(text.encode("utf-8")).hexdigest():
            problems.append(f"state_digest is not the SHA-256 of the canonical text {text[:60]}"
                            "... (R-CODEC-1)")
        if "\\u" in text:
            problems.append(f"canonical text {text[:80]}... escapes non-ASCII (R-CODEC-1)")
        if [tuple(p) for p in data["servers"]] != list(state.inflight_items()):
            problems.append(f"state encodes servers as {data['servers']}, SPEC says the "
                            f"in-flight counts {list(state.inflight_items())} (R-OBS-2)")
        try:
            back = codec.state_from_json(config, json.loads(text))
        except CodecError as exc:
            problems.append(f"state {text} does not decode: {exc}")
            continue
        if back != state:
            problems.append(f"state {text} decodes as {codec.state_to_json(back)}")
        _check_optional_state_keys(state, data, problems)
    _check_refused_states(problems)
    lease = Config(lease_accounting=True)
    given = codec.state_from_json(lease, {"servers": [["b", 0], ["a", 0]]})
    if given != initial_state(lease, ["b", "a"]):
        problems.append("a lease-mode state without a book does not decode to the initial "
                        f"state: epochs {dict(given.leases.epoch)}")
    # SPEC: a state stores only non-zero external loads, so an explicit 0 is the state
    # without it (a stored 0 breaks R-ST-2's well-formedness and the state's equality).
    plain = Config()
    zero = codec.state_from_json(plain, {"servers": [["a", 1]], "external": {"a": 0}})
    if zero != codec.state_from_json(plain, {"servers": [["a", 1]]}):
        problems.append(f"external load 0 decodes into the state: {dict(zero.external)}")
    for load in (True, -1):  # integers only; counts are >= 0 (R-CONS-1)
        try:
            codec.state_from_json(lease, {"servers": [["a", load]]})
            problems.append(f"state.servers [\"a\", {json.dumps(load)}] decoded; SPEC: "
                            "integers >= 0 only")
        except CodecError:
            pass


# States SPEC section 3 rules out (R-ST-2), each refused by the decoder: (why, config, JSON).
_SMALL, _GROUPED = Config(max_cache_size=2), Config(group_stickiness="fallback")
REFUSED_STATES: tuple[tuple[str, Config, dict[str, Any]], ...] = (
    ("a repeated sticky key", _SMALL, {"servers": [["a", 0]], "lru": [["r", "a"], ["r", "a"]]}),
    ("a repeated group key", _GROUPED,
     {"servers": [["a", 0]], "groups": [["g", "a"], ["g", "a"]]}),
    ("more pins than max_cache_size", _SMALL,
     {"servers": [["a", 0]], "lru": [["r", "a"], ["q", "a"], ["p", "a"]]}),
    ("a repeated server id", _SMALL, {"servers": [["a", 0], ["a", 1]]}),
    ("an empty server id", _SMALL, {"servers": [["", 0]]}),
    ("a negative count", _SMALL, {"servers": [["a", -1]]}),
    ("an unknown key", _SMALL, {"servers": [["a", 0]], "bogus": 1}),
    ("group pins with group stickiness off", _SMALL,
     {"servers": [["a", 0]], "groups": [["g", "a"]]}),
)


def _check_optional_state_keys(state: Any, data: dict[str, Any], problems: list[str]) -> None:
    """R-CODEC-1: a state's optional keys are written exactly when SPEC says."""
    reference = to_reference(state)
    grouped = bool(reference.groups or reference.group_kept or reference.group_broken)
    for key, present in (("external", any(reference.external.values())),
                         ("leases", reference.leases != LeaseBook()),
                         ("groups", grouped), ("group_kept", grouped),
                         ("group_broken", grouped)):
        if (key in data) != present:
            problems.append(f"state {data}: key {key!r} " + ("missing" if present else
                            "written") + " (R-CODEC-1 writes it only when it is not empty)")


def _check_refused_states(problems: list[str]) -> None:
    for why, config, data in REFUSED_STATES:
        try:
            codec.state_from_json(config, data)
        except (CodecError, ConfigError):
            continue
        problems.append(f"the state decoder accepts a state with {why}: {data}")


def check_derived() -> tuple[int, list[str]]:
    """The flags adapters and diagnoses read off a configuration, against SPEC's words:
    ``policy`` (R-POL-1), ``context_band`` -- the band widens with the context only when
    it is set and ``full_determinism`` is off (R-BAND-5) -- and ``evaluates_pins`` --
    hits are judged by load only under a margin or gate policy without
    ``full_determinism`` (R-DET-4)."""
    from affinity_engine import DualThreshold

    problems: list[str] = []
    checked = 0
    for det in (False, True):
        for margin, gate, tokens, cap in ((None, None, None, None), (0, None, None, None),
                                          (2, None, None, None), (0, None, 1, 1),
                                          (1, None, 4, 3), (None, DualThreshold(0), None, None),
                                          (None, DualThreshold(3, 2), None, None)):
            config = Config(affinity_break_margin=margin, dual_threshold=gate,
                            affinity_break_tokens=tokens, affinity_break_band_cap=cap,
                            full_determinism=det)
            policy = "margin" if margin is not None else (
                "dual_threshold" if gate is not None else "legacy")
            want = (policy, tokens is not None and not det, policy != "legacy" and not det)
            got = (config.policy, config.context_band, config.evaluates_pins)
            checked += 1
            if got != want:
                problems.append(f"{config!r}: (policy, context_band, evaluates_pins) = {got}, "
                                f"SPEC says {want}")
    return checked, problems


def check_defaults() -> tuple[int, list[str]]:
    """SPEC section 2's Default column, on the configuration a caller gets by naming
    nothing (built through the module, so a patched constructor is the one judged), the
    gate's relative threshold (3/2, R-CFG-5), and the decoder's defaults: ``{}`` is that
    configuration."""
    from fractions import Fraction

    import affinity_core.config as config_mod

    want: dict[str, Any] = {
        "affinity_break_margin": None, "dual_threshold": None, "max_cache_size": 10000,
        "full_determinism": False, "tie_break": config_mod.TieBreak.FIRST,
        "hash_mode": config_mod.HashMode.CALLER, "lease_accounting": False,
        "affinity_break_tokens": None, "affinity_break_band_cap": None,
    }
    problems: list[str] = []
    default = config_mod.Config()
    for name, value in want.items():
        got = getattr(default, name)
        if not _same(got, value):
            problems.append(f"Config().{name} = {got!r}; SPEC's default is {value!r}")
    rel = config_mod.DualThreshold(1).balance_rel_threshold
    if not _same(rel, Fraction(3, 2)):
        problems.append(f"DualThreshold(1).balance_rel_threshold = {rel!r}; SPEC: 3/2")
    if config_mod.DEFAULT_MAX_CACHE_SIZE != 10000:
        problems.append(f"DEFAULT_MAX_CACHE_SIZE = {config_mod.DEFAULT_MAX_CACHE_SIZE!r}")
    decoded = codec.config_from_json({})
    if decoded != default:
        problems.append(f"config {{}} decodes as {decoded!r}, not the default {default!r}")
    return len(want) + 3, problems


def check_codec() -> tuple[int, list[str]]:
    """(values checked, problems): events, configurations and traced states."""
    from .config_table import CASES

    problems: list[str] = []
    _check_event_codec(problems)
    _check_config_codec(problems)
    _check_state_codec(problems)
    names = _check_outcome_names(problems) + _check_outcome_fields(problems)
    return len(EVENT_CASES) + len(CASES) + len(_trace_states()) + names, problems


def _spec_names(field: str) -> set[str]:
    """The names R-OUT-3 lists for ``field`` (`` `field` ∈ {`a`, `b`} ``)."""
    from affinity_conformance.shipped import shipped_vectors

    # the specification ships beside the vectors, so an installed wheel reads it too
    text = (shipped_vectors() / "SPEC.md").read_text(encoding="utf-8")
    found = re.search(rf"`{field}` ∈ \{{([^}}]*)\}}", text)
    return set(re.findall(r"`([a-z_]+)`", found.group(1))) if found else set()


def _check_outcome_fields(problems: list[str]) -> int:
    """R-CODEC-1: an outcome's null fields, and a zero ``cleared_groups``, are omitted;
    every other field is written. On the outcomes of the traces, a grouped clear and an
    ungrouped one."""
    from affinity_core.outcomes import StickyCacheCleared

    outcomes: list[Any] = [StickyCacheCleared(1, (("a", 0),)),
                           StickyCacheCleared(1, (("a", 0),), cleared_groups=2)]
    for config, state in _trace_states():
        for event in (Acquire(request_id="b"), Release(server_id="s1"), ClearStickyCache()):
            outcomes.append(step(config, state, event).outcome)
    for outcome in outcomes:
        data = codec.outcome_to_json(outcome)
        fields = attrs.asdict(outcome, recurse=False)
        written = {name for name, value in fields.items()
                   if value is not None and not (name == "cleared_groups" and value == 0)}
        if set(data) != {"kind", *written} or any(v is None for v in data.values()):
            problems.append(f"{outcome!r} encodes as {data}: SPEC writes exactly the fields "
                            f"{sorted(written)} (R-CODEC-1)")
    return len(outcomes)


def _check_outcome_names(problems: list[str]) -> int:
    """R-OUT-3: each outcome enum encodes as the names SPEC lists, and canonical text of
    every traced state is the same whatever order its keys were inserted in."""
    from affinity_core.outcomes import Path as AcquirePath
    from affinity_core.outcomes import RejectReason, ReleaseResult

    for field, enum in (("path", AcquirePath), ("result", ReleaseResult),
                        ("reason", RejectReason)):
        spec, code = _spec_names(field), {member.value for member in enum}
        if spec != code:
            problems.append(f"R-OUT-3 lists {field} {sorted(spec)}; the encoding writes "
                            f"{sorted(code)}")
    for _, state in _trace_states():
        data = codec.state_to_json(state)
        text = codec.canonical_dumps(data)
        if codec.canonical_dumps(_reversed_keys(data)) != text:
            problems.append(f"canonical text depends on key insertion order: {text[:80]}...")
    return len(AcquirePath) + len(ReleaseResult) + len(RejectReason)


def _reversed_keys(value: Any) -> Any:
    """``value`` with every object's keys inserted in reverse order."""
    if isinstance(value, dict):
        return {key: _reversed_keys(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed_keys(item) for item in value]
    return value


def check_unread_inputs() -> tuple[int, list[str]]:
    """R-TIE-5, R-DET-5: where the core says an acquire's ``tie_draw`` (``needs_draw``) or
    ``request_hash`` (``needs_request_hash``) is not needed, every value of it gives the
    same transition. Judged by running ``step`` -- the reference's and the engine's -- on
    states with tied minima, a pin and a full pool, for keyed and unkeyed acquires, hits
    and misses, under every tie-break, hash mode, policy and ``full_determinism``; the
    reference's and the engine's ``needs_*`` must also agree."""
    import affinity_core
    import affinity_engine
    from affinity_core.config import HashMode, TieBreak

    problems: list[str] = []
    checked = 0
    draws, hashes = (0, 1, 2, 5, 2**40), (None, 0, 1, 2, -3, 2**63)
    # An idle pool (three tied), a pin on s0 (two tied), and two busy of three.
    first, second = Acquire(request_id="a"), Acquire(request_id="b", tie_draw=1)
    traces: tuple[tuple[Acquire, ...], ...] = ((), (first,), (first, second))
    for det in (False, True):
        for tie_break in TieBreak:
            for hash_mode in HashMode:
                for margin in (None, 0, 1):
                    kwargs = {"affinity_break_margin": margin, "full_determinism": det,
                              "tie_break": tie_break, "hash_mode": hash_mode}
                    for rid in ("a", "z", None):
                        for trace in traces:
                            checked += 1
                            problems += _unread_case(affinity_core, affinity_engine, kwargs,
                                                     rid, trace, draws, hashes)
    return checked, problems


def _unread_case(reference: Any, engine: Any, kwargs: dict[str, Any], rid: str | None,
                 trace: tuple[Acquire, ...], draws: tuple[int, ...],
                 hashes: tuple[int | None, ...]) -> list[str]:
    from affinity_engine.abstraction import to_reference

    problems: list[str] = []
    servers = ("s0", "s1", "s2")
    reference_needs: tuple[bool, bool] | None = None
    for name, package in (("reference", reference), ("engine", engine)):
        config = package.Config(**kwargs)
        state = package.initial_state(config, servers)
        for event in trace:
            state = package.step(config, state, event).state
        needs = (package.needs_draw(config, rid), package.needs_request_hash(config))
        if name == "engine" and needs != reference_needs:
            problems.append(f"{kwargs} rid={rid!r}: engine needs (draw, hash) = {needs}, "
                            f"the reference says {reference_needs}")
        reference_needs = needs
        varied = []
        if not needs[0]:
            varied.append(("tie_draw",
                           [package.Acquire(request_id=rid, tie_draw=d) for d in draws]))
        if not needs[1]:
            varied.append(("request_hash",
                           [package.Acquire(request_id=rid, request_hash=h) for h in hashes]))
        for field, events in varied:
            # The engine's own state representation is compared through its abstraction.
            view = to_reference if name == "engine" else (lambda s: s)
            results = {repr((t.outcome, view(t.state))) for t in
                       (package.step(config, state, e) for e in events)}
            if len(results) > 1:
                problems.append(f"{name} {kwargs} rid={rid!r} after {len(trace)} acquires: "
                                f"{field} is said to be unread, yet its values give "
                                f"{len(results)} different transitions")
    return problems
