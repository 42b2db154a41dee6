"""The validation table: configuration, configuration event and event fields.

Every rejection must name the key, the offending value and the accepted range
(R-CFG-1). Values are passed through ``Any`` on purpose: the point is what the
constructors do with inputs their type hints would not allow.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest

from affinity_engine import (
    Acquire,
    AddServers,
    Config,
    ConfigError,
    DualThreshold,
    EventError,
    Release,
    RemoveServers,
    TieBreak,
    initial_state,
    validate_margin,
)

MARGIN_RANGE = "null or an integer >= 0"


def raw(value: object) -> Any:
    """A deliberately ill-typed input, hidden from mypy."""
    return value


# ------------------------------------------------------------- affinity_break_margin
@pytest.mark.parametrize(("value", "stored"), [(None, None), (0, 0), (2, 2), (2.0, 2)])
def test_margin_accepted(value: Any, stored: int | None) -> None:
    """R-CFG-3: None or an integer >= 0; an integral float becomes an int."""
    margin = Config(affinity_break_margin=value).affinity_break_margin
    assert margin == stored
    assert margin is None or type(margin) is int


@pytest.mark.parametrize("value", [True, False, -1, -0.5, 0.5, math.inf, -math.inf, math.nan,
                                   "2", []])
def test_margin_rejected(value: Any) -> None:
    """R-CFG-1, R-CFG-3: bools, negatives, non-integral or non-finite floats, strings and
    other types are rejected, naming key, value and the accepted range. (verl accepts
    True/False, 0.5 and +inf; the spec deliberately does not.)"""
    with pytest.raises(ConfigError) as err:
        Config(affinity_break_margin=value)
    message = str(err.value)
    assert "affinity_break_margin" in message
    assert repr(value) in message
    assert MARGIN_RANGE in message


def test_margin_validator_names_the_callers_key() -> None:
    """R-CFG-1: adapters validate raw config values under their own key names."""
    with pytest.raises(ConfigError, match=r"rollout\.affinity_break_margin .*-3"):
        validate_margin(-3, key="rollout.affinity_break_margin")


# -------------------------------------------------------------------- other options
@pytest.mark.parametrize("value", [0, -1, True, 1.5, None, "10"])
def test_max_cache_size_rejected(value: Any) -> None:
    """R-CFG-4: max_cache_size must be an integer >= 1 (verl accepts 0 and then fails
    every acquire)."""
    with pytest.raises(ConfigError) as err:
        Config(max_cache_size=value)
    assert "max_cache_size" in str(err.value)
    assert repr(value) in str(err.value)
    assert ">= 1" in str(err.value)


def test_max_cache_size_one_accepted() -> None:
    """R-CFG-4: 1 is the smallest capacity; 10000 is verl's default."""
    assert Config(max_cache_size=1).max_cache_size == 1
    assert Config().max_cache_size == 10000


@pytest.mark.parametrize(("key", "value", "accepted"), [
    ("tie_break", "random", ("'first'", "'draw'", "'hashed'")),
    ("tie_break", None, ("'first'", "'draw'", "'hashed'")),
    ("tie_break", "First", ("'first'", "'draw'", "'hashed'")),
    ("hash_mode", "python", ("'caller'", "'stable'")),
    ("hash_mode", "", ("'caller'", "'stable'")),
])
def test_enum_options_name_the_accepted_values(key: str, value: Any,
                                               accepted: tuple[str, ...]) -> None:
    """R-CFG-1: a bad tie_break / hash_mode names every accepted value."""
    with pytest.raises(ConfigError) as err:
        Config(**{key: value})
    message = str(err.value)
    assert key in message and repr(value) in message
    assert all(name in message for name in accepted)


def test_enum_options_accept_strings_and_members() -> None:
    """R-CFG-1: "draw" and TieBreak.DRAW configure the same balancer."""
    assert Config(tie_break="draw") == Config(tie_break=TieBreak.DRAW)


@pytest.mark.parametrize("key", ["full_determinism", "lease_accounting"])
@pytest.mark.parametrize("value", [1, 0, "true", None])
def test_flags_must_be_bool(key: str, value: Any) -> None:
    """R-CFG-1: the boolean options take only True or False."""
    with pytest.raises(ConfigError) as err:
        Config(**{key: value})
    assert key in str(err.value) and repr(value) in str(err.value)


def test_margin_and_gate_together_rejected() -> None:
    """R-POL-1: the margin rule and the dual-threshold gate are alternatives."""
    with pytest.raises(ConfigError, match="affinity_break_margin and dual_threshold"):
        Config(affinity_break_margin=2, dual_threshold=DualThreshold(4))
    assert Config(affinity_break_margin=2).policy == "margin"
    assert Config(dual_threshold=DualThreshold(4)).policy == "dual_threshold"
    assert Config().policy == "legacy"


@pytest.mark.parametrize(("build", "key"), [
    (lambda: Config(dual_threshold=raw((4, 1.5))), "dual_threshold"),
    (lambda: DualThreshold(raw(1.5)), "balance_abs_threshold"),
    (lambda: DualThreshold(True), "balance_abs_threshold"),
    (lambda: DualThreshold(4, 0.5), "balance_rel_threshold"),
    (lambda: DualThreshold(4, "abc"), "balance_rel_threshold"),
    (lambda: DualThreshold(4, True), "balance_rel_threshold"),
    (lambda: DualThreshold(4, math.inf), "balance_rel_threshold"),
    (lambda: DualThreshold(4, math.nan), "balance_rel_threshold"),
    (lambda: DualThreshold(4, "1/0"), "balance_rel_threshold"),
])
def test_gate_values_rejected(build: Any, key: str) -> None:
    """R-CFG-1, R-CFG-5, R-GATE-1: abs must be an integer, rel a finite number >= 1."""
    with pytest.raises(ConfigError, match=key):
        build()


def test_gate_rel_accepts_exact_inputs() -> None:
    """R-CFG-5: rel 1 (int) and "3/2" (a fraction string) are exact rationals."""
    assert DualThreshold(4, 1).balance_rel_threshold == 1
    assert DualThreshold(4, "3/2").balance_rel_threshold == Fraction(3, 2)


# ----------------------------------------------------------- configuration event
@pytest.mark.parametrize(("servers", "shown"), [
    (["s0", "s1", "s0"], "['s0', 's1', 's0']"),
    (["s0", ""], "''"),
    (["s0", 1], "1"),
    ([None], "None"),
])
def test_initial_state_rejects_bad_server_lists(servers: Any, shown: str) -> None:
    """R-CFG-2: servers must be unique non-empty strings."""
    with pytest.raises(ConfigError) as err:
        initial_state(Config(), servers)
    assert "servers" in str(err.value) and shown in str(err.value)


def test_initial_state_rejects_a_bare_string() -> None:
    """R-CFG-2: like AddServers, the configuration event must refuse a bare string."""
    with pytest.raises(ConfigError, match="servers"):
        initial_state(Config(), "s0")


def test_initial_state_is_all_idle_with_an_empty_map() -> None:
    """R-CFG-2, R-ST-1: a fresh state: pool order as given, all idle, nothing pinned."""
    state = initial_state(Config(max_cache_size=5), ["b", "a"])
    assert state.pool.items() == (("b", 0), ("a", 0))
    assert state.lru.items() == () and state.lru.capacity == 5
    assert (state.affinity_kept, state.affinity_broken) == (0, 0)
    assert state.sorted_servers == ("a", "b")


# ----------------------------------------------------------------------- events
@pytest.mark.parametrize(("build", "field", "shown"), [
    (lambda: Acquire(request_id=""), "request_id", "''"),
    (lambda: Acquire(request_id=raw(7)), "request_id", "7"),
    (lambda: Acquire(request_id="a", tie_draw=-1), "tie_draw", "-1"),
    (lambda: Acquire(request_id="a", tie_draw=True), "tie_draw", "True"),
    (lambda: Acquire(request_id="a", tie_draw=raw(1.0)), "tie_draw", "1.0"),
    (lambda: Acquire(request_id="a", request_hash=raw("h")), "request_hash", "'h'"),
    (lambda: Acquire(request_id="a", request_hash=False), "request_hash", "False"),
    (lambda: Release(server_id=""), "server_id", "''"),
    (lambda: Release(server_id=raw(None)), "server_id", "None"),
    (lambda: Release(server_id="s0", request_id=""), "request_id", "''"),
    (lambda: AddServers(server_ids=["s0", "s0"]), "unique", "['s0', 's0']"),
    (lambda: AddServers(server_ids="s0"), "server_ids", "'s0'"),
    (lambda: AddServers(server_ids=["s0", ""]), "server id", "''"),
    (lambda: RemoveServers(server_ids="s0"), "server_ids", "'s0'"),
    (lambda: RemoveServers(server_ids=[3]), "server id", "3"),
])
def test_bad_event_fields_rejected(build: Any, field: str, shown: str) -> None:
    """R-EV-2: event fields are validated at construction, naming field and value."""
    with pytest.raises(EventError) as err:
        build()
    assert field in str(err.value) and shown in str(err.value)


def test_event_edge_values_accepted() -> None:
    """R-EV-1, R-EV-2: unkeyed acquire, negative or huge caller hashes, big draws, and
    repeated ids in a removal (verl takes a list there) are all valid events."""
    assert Acquire(request_id=None).request_id is None
    assert Acquire(request_id="a", request_hash=-(2**63), tie_draw=2**70).tie_draw == 2**70
    assert RemoveServers(server_ids=["s0", "s0"]).server_ids == ("s0", "s0")
    assert AddServers(server_ids=[]).server_ids == ()
