"""The core's fast paths give the values of the plain definitions.

Theory of operation
-------------------
Each shortcut added for speed is checked against what it replaces:

* ``LoadTable.add_load`` (single-leaf indexing up to 32 servers, unchanged child
  summaries reused above): after every change the table is *equal* to one rebuilt from
  its items, so the structure stays canonical (equal pools, equal tables), at the sizes
  where the shape changes;
* ``LoadTable.least_loaded`` (C-level scans for the child at the minimum): every k
  against the k-th minimum position of the plain list;
* shared outcomes: equal to freshly built ones, and the sharing table stays bounded;
* ``Acquire`` / ``Release`` field checks (common case first): accept and reject exactly
  what the per-field rules accept and reject, with the same messages;
* the positional builders ``acquire_event`` / ``release_event``: for every combination
  of good and bad field values, the same event as the keyword constructor, or the same
  ``EventError`` message;
* the native value classes (``affinity_engine.values``): for every one, an attrs frozen
  class with the same fields is built here, and equality, hash consistency, repr,
  immutability, ``attrs.evolve`` / ``evolve`` and pickling are compared with it;
* the leaf summary updated from the old one (``_bumped``) equals the full scan
  (``_leaf``) for every slot and both directions, and ``set_load`` (any delta) keeps
  tables canonical;
* ``policy.plan_of`` (the options the hot path reads, cached for the last ``Config``):
  every field equals the configuration's, a different configuration -- even an equal
  one -- gets its own plan, and steps that alternate between configurations decide as
  each configuration alone does.
"""

from __future__ import annotations

import pickle
import random
from typing import Any

import attrs
import pytest

import affinity_engine.loads as loads_mod
import affinity_engine.machine as machine
from affinity_core.config import DualThreshold
from affinity_engine import (
    BUILD,
    Acquire,
    Acquired,
    Config,
    EventError,
    LoadTable,
    Path,
    Release,
    Released,
    ReleaseResult,
    StickyLru,
    acquire_event,
    initial_state,
    release_event,
    step,
)
from affinity_engine.policy import plan_of
from affinity_engine.values import Value, evolve


@pytest.mark.parametrize("n", [1, 2, 31, 32, 33, 64, 65, 1024, 1025])
def test_add_load_keeps_the_table_canonical(n: int) -> None:
    rng = random.Random(n)
    servers = [f"s{i}" for i in range(n)]
    plain = [rng.choice((0, 0, 1, 2)) for _ in range(n)]
    table = LoadTable.build(zip(servers, plain, strict=True))
    for _ in range(150):
        p = rng.randrange(n)
        delta = rng.choice((1, 1, -1)) if plain[p] else 1
        plain[p] += delta
        table = table.add_load(servers[p], delta)
        assert table == LoadTable.build(zip(servers, plain, strict=True))
        low = min(plain)
        ties = [s for s, x in zip(servers, plain, strict=True) if x == low]
        assert table.tie_count == len(ties)
        for k in {0, len(ties) // 2, len(ties) - 1}:
            assert table.least_loaded(k) == ties[k]
        assert table.load(servers[p]) == plain[p]


def test_shared_outcomes_equal_fresh_ones_and_stay_bounded() -> None:
    config = Config(affinity_break_margin=2)
    state = initial_state(config, ["s0", "s1"])
    first = step(config, state, Acquire(request_id="a"))
    assert first.outcome == Acquired("s0", Path.NEW)
    kept = step(config, first.state, Acquire(request_id="a"))
    assert kept.outcome == Acquired("s0", Path.KEPT)
    released = step(config, kept.state, Release(server_id="s0"))
    assert released.outcome == Released("s0", ReleaseResult.APPLIED)
    limit = machine._SHARED_LIMIT
    for i in range(limit + 10):
        assert machine._plain_acquired(f"x{i}", Path.NEW) == Acquired(f"x{i}", Path.NEW)
        assert machine._applied_release(f"x{i}") == Released(f"x{i}", ReleaseResult.APPLIED)
    assert 0 < len(machine._SHARED_NEW) <= limit
    assert 0 < len(machine._SHARED_RELEASED) <= limit


class _Int(int):
    pass


BAD_IDS: list[Any] = ["", 1, None, True, b"s", "\ud800", ["s"]]
GOOD_IDS: list[Any] = ["s", "é", "ζ-1", "\U0001f600"]


@pytest.mark.parametrize("value", BAD_IDS)
def test_events_reject_bad_ids_with_the_field_name(value: Any) -> None:
    if value is not None:
        with pytest.raises(EventError, match="request_id must be a non-empty string"):
            Acquire(request_id=value)
        with pytest.raises(EventError, match="request_id must be a non-empty string"):
            Release(server_id="s", request_id=value)
    with pytest.raises(EventError, match="server_id must be a non-empty string"):
        Release(server_id=value)


@pytest.mark.parametrize("value", GOOD_IDS)
def test_events_accept_every_scalar_value_string(value: str) -> None:
    assert Acquire(request_id=value).request_id == value
    assert Release(server_id=value, request_id=value).server_id == value


@pytest.mark.parametrize(("field", "value", "message"), [
    ("tie_draw", -1, "tie_draw must be an integer >= 0, got -1"),
    ("tie_draw", True, "tie_draw must be an integer >= 0, got True"),
    ("tie_draw", 1.0, "tie_draw must be an integer >= 0, got 1.0"),
    ("tie_draw", _Int(-2), "tie_draw must be an integer >= 0"),
    ("request_hash", False, "request_hash must be an integer or null, got False"),
    ("request_hash", "7", "request_hash must be an integer or null, got '7'"),
])
def test_acquire_rejects_bad_numbers(field: str, value: Any, message: str) -> None:
    with pytest.raises(EventError, match=message):
        Acquire(request_id="a", **{field: value})


def test_acquire_accepts_int_subclasses_as_before() -> None:
    event = Acquire(request_id="a", tie_draw=_Int(3), request_hash=_Int(-5))
    assert (event.tie_draw, event.request_hash) == (3, -5)


ACQUIRE_VALUES: dict[str, list[Any]] = {
    "request_id": [*BAD_IDS, *GOOD_IDS],
    "tie_draw": [0, 5, -1, True, 1.0, _Int(3), None],
    "request_hash": [None, -5, 7, False, "7", _Int(-2)],
    "context_tokens": [None, 0, 12, -1, True, 2.5],
}


def _built(build: Any, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    try:
        return "event", build(*args, **kwargs)
    except EventError as exc:
        return "error", str(exc)


def test_positional_builders_equal_the_keyword_constructors() -> None:
    rng = random.Random(16)
    names = list(ACQUIRE_VALUES)
    combos = [[rng.choice(ACQUIRE_VALUES[n]) for n in names] for _ in range(400)]
    combos += [[v, 0, None, None] for v in ACQUIRE_VALUES["request_id"]]
    errors = 0
    for values in combos:
        fast = _built(acquire_event, *values)
        slow = _built(Acquire, **dict(zip(names, values, strict=True)))
        assert fast == slow, values
        errors += fast[0] == "error"
    for sid in [*BAD_IDS, *GOOD_IDS]:
        for rid in [None, *BAD_IDS, *GOOD_IDS]:
            assert _built(release_event, sid, rid) == _built(
                Release, server_id=sid, request_id=rid), (sid, rid)
        assert _built(release_event, sid) == _built(Release, server_id=sid), sid
    assert 0 < errors < len(combos)  # both outcomes were exercised


def _samples() -> list[Value]:
    config = Config(affinity_break_margin=2, lease_accounting=True)
    state = initial_state(config, ["s0", "s1", "s2"])
    t = step(config, state, Acquire(request_id="a", tie_draw=1, context_tokens=7))
    # The engine's own values; events and outcomes are the reference's attrs classes.
    return [state, t.state, t, t.state.pool, t.state.lru, t.state.leases,
            machine.ACQUIRE_RULES[machine.Lookup.MISS]]


@pytest.mark.parametrize("value", _samples(), ids=lambda v: type(v).__name__)
def test_native_values_behave_as_the_attrs_classes_they_replace(value: Value) -> None:
    cls = type(value)
    names = cls.__match_args__
    if BUILD == "pure":  # mypyc keeps no __slots__ on a native class
        assert sorted(cls.__slots__) == sorted(names)  # the two literals name the same fields
    assert not hasattr(value, "__dict__")  # slots or native fields, never a dict
    fields = {n: getattr(value, n) for n in names}
    twin_cls = attrs.make_class(cls.__name__, list(names), frozen=True)
    twin = twin_cls(**fields)
    # Their fields are a representation (a shared log or store): repr shows the entries.
    if isinstance(value, StickyLru):
        assert repr(value) == f"StickyLru(capacity={value.capacity!r}, items={value.items()!r})"
    elif isinstance(value, LoadTable):
        assert repr(value) == f"LoadTable(items={value.items()!r}, total={value.total!r})"
    else:
        assert repr(value) == repr(twin)
    copy = cls(**fields)
    assert copy == value and (copy != value) is False and hash(copy) == hash(value)
    assert value != twin and value != tuple(fields.values())
    name = names[0]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(value, name, fields[name])
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        delattr(value, name)
    assert [f.name for f in attrs.fields(cls)] == list(names)
    # attrs' mypy plugin knows decorated classes only; the runtime support is checked.
    assert attrs.evolve(value) == evolve(value) == value  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(value)) == value
    with pytest.raises(TypeError, match="has no field 'nope'"):
        evolve(value, nope=1)


def test_evolve_changes_only_the_named_fields() -> None:
    state = initial_state(Config(), ["s0"])
    changed = evolve(state, affinity_kept=3)
    assert changed.affinity_kept == 3 and changed.pool is state.pool and changed != state
    assert evolve(Config(), max_cache_size=5) == Config(max_cache_size=5)  # attrs classes too


def test_bumped_leaf_summary_equals_the_full_scan() -> None:
    rng = random.Random(7)
    for _ in range(300):
        loads = tuple(rng.choice((0, 1, 1, 2, 3)) for _ in range(rng.randint(1, 32)))
        leaf = loads_mod._leaf(loads)
        for j in range(len(loads)):
            for delta in (1, -1, 2, -2):
                if loads[j] + delta < 0:
                    continue
                changed = (*loads[:j], loads[j] + delta, *loads[j + 1 :])
                assert loads_mod._bumped(leaf, j, delta) == loads_mod._leaf(changed)


@pytest.mark.parametrize("n", [3, 32, 33, 1025])
def test_set_load_keeps_the_table_canonical(n: int) -> None:
    rng = random.Random(n)
    servers = [f"s{i}" for i in range(n)]
    plain = [0] * n
    table = LoadTable.build(zip(servers, plain, strict=True))
    for _ in range(60):
        p = rng.randrange(n)
        plain[p] = rng.randrange(6)
        table = table.set_load(servers[p], plain[p])
        assert table == LoadTable.build(zip(servers, plain, strict=True))


PLAN_CONFIGS = [
    Config(),
    Config(affinity_break_margin=0, tie_break="draw", lease_accounting=True),
    Config(affinity_break_margin=1, affinity_break_tokens=100, affinity_break_band_cap=3,
           tie_break="hashed"),
    Config(dual_threshold=DualThreshold(2, "3/2")),
    Config(full_determinism=True, hash_mode="stable"),
]


@pytest.mark.parametrize("config", PLAN_CONFIGS, ids=lambda c: c.policy)
def test_plan_fields_are_the_configs(config: Config) -> None:
    plan = plan_of(config)
    assert plan.config is config and plan_of(config) is plan
    assert (plan.full_determinism, plan.margin, plan.tokens, plan.cap, plan.gate,
            plan.tie_break, plan.hash_mode, plan.lease_accounting) == (
        config.full_determinism, config.affinity_break_margin, config.affinity_break_tokens,
        config.affinity_break_band_cap, config.dual_threshold, config.tie_break,
        config.hash_mode, config.lease_accounting)
    twin = evolve(config)  # equal, not the same object: a plan of its own
    assert twin == config and plan_of(twin).config is twin


def test_steps_alternating_configs_decide_as_each_config_alone() -> None:
    servers = ["s0", "s1", "s2"]
    configs = PLAN_CONFIGS[:4]
    rng = random.Random(5)
    events = [Acquire(request_id=f"r{rng.randrange(6)}", tie_draw=rng.randrange(7),
                      context_tokens=rng.randrange(400)) if rng.random() < 0.6
              else Release(server_id=rng.choice(servers), request_id=f"r{rng.randrange(6)}")
              for _ in range(300)]
    alone = []
    for config in configs:  # one configuration at a time: the cache always hits
        state = initial_state(config, servers)
        trace = []
        for event in events:
            t = step(config, state, event)
            state = t.state
            trace.append(t)
        alone.append(trace)
    states = [initial_state(config, servers) for config in configs]
    for i, event in enumerate(events):  # interleaved: the cache misses on every step
        for c, config in enumerate(configs):
            t = step(config, states[c], event)
            assert t == alone[c][i], (c, i)
            states[c] = t.state
