"""Option parsing and validation at construction (R-CFG-1, R-CFG-3).

No Ray here: the plain class validates in its constructor, which is where the actor would
fail. Every bad value must name the key, the value and the accepted range.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from affinity_verl import (
    ACCEPTED_KEYS,
    DEFAULT_TIE_BREAK,
    AffinityLoadBalancer,
    OptionError,
    parse_options,
    validate_router_config,
)

from affinity_conformance.upstream import load_upstream_router_module
from affinity_engine import Config, ConfigError, DualThreshold, HashMode, TieBreak

SERVERS = dict.fromkeys(["s0", "s1"])


def test_defaults_equal_verl_091() -> None:
    options = parse_options()
    config = options.config
    router = load_upstream_router_module()
    assert config.max_cache_size == router.DEFAULT_ROUTING_CACHE_SIZE == 10000
    assert config.affinity_break_margin is None and config.dual_threshold is None
    assert config.full_determinism is False and config.lease_accounting is False
    assert config.hash_mode is HashMode.CALLER  # verl hashes with the builtin hash()
    assert config.tie_break is TieBreak.DRAW and DEFAULT_TIE_BREAK == "draw"  # random.choice
    assert options.decision_log is None and options.seed is None
    status = AffinityLoadBalancer(SERVERS).get_status()
    assert status["policy"] == "legacy" and status["tie_break"] == "draw"


def test_router_yaml_dict_and_keywords_map_onto_the_core_config() -> None:
    yaml_dict = {
        "router_class": "affinity_verl.AffinityLoadBalancer",  # accepted and ignored
        "full_determinism": False,  # required on the router-YAML path
        "affinity_break_margin": 2,
        "tie_break": "hashed",
        "hash_mode": "stable",
        "max_cache_size": 64,
    }
    options = parse_options(yaml_dict, {"lease_accounting": True, "seed": 5})
    assert options.config == Config(
        affinity_break_margin=2, tie_break="hashed", hash_mode="stable", max_cache_size=64,
        lease_accounting=True,
    )
    assert options.seed == 5
    gate = parse_options({"balance_abs_threshold": 8, "balance_rel_threshold": 1.5})
    assert gate.config.dual_threshold == DualThreshold(8, "3/2")


def test_integral_float_margin_is_accepted_as_int() -> None:
    assert parse_options({"affinity_break_margin": 2.0}).config.affinity_break_margin == 2


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("affinity_break_margin", -1, "null or an integer >= 0, got -1"),
        ("affinity_break_margin", 0.5, "null or an integer >= 0, got 0.5"),
        ("affinity_break_margin", math.inf, "null or an integer >= 0, got inf"),
        ("affinity_break_margin", math.nan, "null or an integer >= 0, got nan"),
        ("affinity_break_margin", True, "null or an integer >= 0, got True"),
        ("affinity_break_margin", "2", "null or an integer >= 0, got '2'"),
        ("max_cache_size", 0, "an integer >= 1, got 0"),
        ("tie_break", "random", "one of 'first', 'draw', 'hashed', got 'random'"),
        ("hash_mode", "crc", "one of 'caller', 'stable', got 'crc'"),
        ("full_determinism", "yes", "true or false, got 'yes'"),
        ("lease_accounting", 1, "true or false, got 1"),
        ("decision_log_max_bytes", 100, "an integer >= 4096, got 100"),
        ("decision_log_backups", -1, "an integer >= 0, got -1"),
        ("decision_log", "", "null or a non-empty file path, got ''"),
        ("seed", 1.5, "null or an integer, got 1.5"),
        ("balance_rel_threshold", 2, "needs balance_abs_threshold"),
    ],
)
def test_bad_value_names_key_value_and_range(key: str, value: Any, expected: str) -> None:
    with pytest.raises(OptionError) as info:
        AffinityLoadBalancer(SERVERS, {key: value})
    message = str(info.value)
    assert key in message and expected in message
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)


def test_unknown_key_names_itself_and_the_accepted_keys() -> None:
    with pytest.raises(OptionError, match="unknown option 'affinity_margin'") as info:
        AffinityLoadBalancer(SERVERS, {"affinity_margin": 2})
    assert all(key in str(info.value) for key in ACCEPTED_KEYS)
    with pytest.raises(OptionError, match="unknown option 'margin'"):
        AffinityLoadBalancer(SERVERS, margin=2)


def test_a_key_given_twice_must_agree() -> None:
    assert AffinityLoadBalancer(SERVERS, {"seed": 1}, seed=1).get_status()["servers"]
    with pytest.raises(OptionError, match="'affinity_break_margin' is given twice"):
        AffinityLoadBalancer(SERVERS, {"affinity_break_margin": 1}, affinity_break_margin=2)


def test_bad_servers_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="servers must be non-empty strings"):
        AffinityLoadBalancer({"": None})
    with pytest.raises(TypeError, match="servers must be a mapping"):
        AffinityLoadBalancer("s0")
    assert AffinityLoadBalancer(["a", "b"]).get_all_servers() == ["a", "b"]


def test_unwritable_decision_log_fails_at_construction(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        AffinityLoadBalancer(SERVERS, decision_log=str(blocker / "log.ndjson"))


def test_validate_router_config_preflight(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "router_class: affinity_verl.AffinityLoadBalancer\nfull_determinism: false\n"
        "affinity_break_margin: 2\ntie_break: first\n"
    )
    assert validate_router_config(good).config.affinity_break_margin == 2

    bad = tmp_path / "bad.yaml"
    bad.write_text("router_class: affinity_verl.AffinityLoadBalancer\n"
                   "full_determinism: false\naffinity_break_margin: -3\n")
    with pytest.raises(OptionError, match=r"bad\.yaml: affinity_break_margin .* got -3"):
        validate_router_config(bad)

    other = tmp_path / "other.yaml"
    other.write_text("router_class: my.Router\n")
    with pytest.raises(OptionError, match="router_class must be one of"):
        validate_router_config(other)
    with pytest.raises(FileNotFoundError, match="Router config file not found"):
        validate_router_config(tmp_path / "missing.yaml")


def test_validate_router_config_names_the_file_and_line_of_bad_yaml(tmp_path: Path) -> None:
    """yaml's own ParserError (a multi-line excerpt, not an OptionError) became one line."""
    bad = tmp_path / "router.yaml"
    bad.write_text("router_class: affinity_verl.AffinityLoadBalancer\n"
                   "full_determinism: false\naffinity_break_margin: [2\n")
    with pytest.raises(OptionError) as caught:
        validate_router_config(bad)
    message = str(caught.value)
    assert message.startswith(f"router config {bad}: invalid YAML at line 4 column 1: ")
    assert "\n" not in message
    unresolved = tmp_path / "interp.yaml"
    unresolved.write_text("router_class: affinity_verl.AffinityLoadBalancer\n"
                          "full_determinism: ${nowhere}\n")
    with pytest.raises(OptionError, match=r"interp\.yaml: Interpolation key 'nowhere'"):
        validate_router_config(unresolved)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(OptionError, match=r"binary\.yaml: not UTF-8 text"):
        validate_router_config(binary)
