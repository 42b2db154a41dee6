"""The context band (SPEC §7.5) in the verl adapter, without Ray: options, the declared
acquire field, and ``context_tokens = len(prompt_ids)``.

The plain class is what the Ray actor runs, so construction errors here are the errors
the actor would die with. The end-to-end test through verl's own client is
``test_verl_client_band.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from affinity_verl import (
    ACCEPTED_KEYS,
    AffinityLoadBalancer,
    OptionError,
    balancer_class_from_config,
    options_from_verl_config,
    parse_options,
    validate_router_config,
)
from affinity_verl.testing.replay import replay_decision_log

from affinity_engine import Acquire, Config

SERVERS = dict.fromkeys(["s0", "s1", "s2"])
# margin 0, one more request of band per 1000 prompt tokens, at most 3.
BAND: dict[str, Any] = {"affinity_break_margin": 0, "affinity_break_tokens": 1000,
                        "affinity_break_band_cap": 3, "tie_break": "first"}


def test_band_options_are_accepted_keys_and_map_onto_the_core_config() -> None:
    assert {"affinity_break_tokens", "affinity_break_band_cap"} <= set(ACCEPTED_KEYS)
    yaml_dict = {"router_class": "affinity_verl.AffinityLoadBalancer",
                 "full_determinism": False, "affinity_break_margin": 1,
                 "affinity_break_tokens": 4096}
    options = parse_options(yaml_dict, {"affinity_break_band_cap": 4})
    assert options.config == Config(affinity_break_margin=1, affinity_break_tokens=4096,
                                    affinity_break_band_cap=4, tie_break="draw")
    assert options.config.context_band


@pytest.mark.parametrize(("options", "expected"), [
    ({"affinity_break_tokens": 0, "affinity_break_band_cap": 3},
     "affinity_break_tokens must be null or an integer >= 1, got 0 (int)"),
    ({"affinity_break_tokens": "4k", "affinity_break_band_cap": 3},
     "affinity_break_tokens must be null or an integer >= 1, got '4k' (str)"),
    ({"affinity_break_tokens": True, "affinity_break_band_cap": 3},
     "affinity_break_tokens must be null or an integer >= 1, got True (bool)"),
    ({"affinity_break_tokens": 1000, "affinity_break_band_cap": -2},
     "affinity_break_band_cap must be null or an integer >= 1, got -2 (int)"),
    ({"affinity_break_tokens": 1000, "affinity_break_band_cap": 1.5},
     "affinity_break_band_cap must be null or an integer >= 1, got 1.5 (float)"),
    ({"affinity_break_tokens": 1000}, "are set together"),
    ({"affinity_break_band_cap": 3}, "are set together"),
    ({"affinity_break_margin": 4, "affinity_break_tokens": 1000, "affinity_break_band_cap": 2},
     "affinity_break_band_cap must be an integer >= affinity_break_margin (4), got 2"),
])
def test_bad_band_options_fail_at_construction_naming_value_and_range(
    options: dict[str, Any], expected: str
) -> None:
    options = {"affinity_break_margin": 1, **options}
    with pytest.raises(OptionError, match=r"^AffinityLoadBalancer: ") as raised:
        AffinityLoadBalancer(SERVERS, options)  # the router-YAML path
    assert expected in str(raised.value)
    with pytest.raises(OptionError) as as_keywords:
        AffinityLoadBalancer(servers=SERVERS, **options)  # the keyword path
    assert expected in str(as_keywords.value)


def test_band_without_a_margin_is_refused() -> None:
    with pytest.raises(OptionError, match="affinity_break_margin, which is null"):
        AffinityLoadBalancer(SERVERS, {"affinity_break_tokens": 1000,
                                       "affinity_break_band_cap": 3})


def test_verl_config_sets_the_band_in_the_rollout_section_or_under_custom() -> None:
    direct = {"actor_rollout_ref": {"rollout": {
        "affinity_break_margin": 1, "affinity_break_tokens": 2000,
        "affinity_break_band_cap": 4}}}
    custom = {"actor_rollout_ref": {"rollout": {"custom": {
        "affinity_break_margin": 1, "affinity_break_tokens": 2000,
        "affinity_break_band_cap": 4}}}}
    expected = {"affinity_break_margin": 1, "affinity_break_tokens": 2000,
                "affinity_break_band_cap": 4}
    assert options_from_verl_config(direct) == expected
    assert options_from_verl_config(custom) == expected
    cls = balancer_class_from_config(custom, tie_break="first")
    assert cls(SERVERS).require_acquire_fields() == ["prompt_ids"]

    disagree = {"actor_rollout_ref": {"rollout": {"affinity_break_tokens": 2000,
                                                  "custom": {"affinity_break_tokens": 3000}}}}
    with pytest.raises(OptionError, match=r"affinity_break_tokens=2000 and "
                       r"custom\.affinity_break_tokens=3000 disagree"):
        options_from_verl_config(disagree)
    bad = {"actor_rollout_ref": {"rollout": {"custom": {
        "affinity_break_margin": 1, "affinity_break_tokens": -5,
        "affinity_break_band_cap": 4}}}}
    with pytest.raises(OptionError, match=r"affinity_break_tokens must be null or an integer "
                       r">= 1, got -5"):
        balancer_class_from_config(bad)  # at config load, before any actor exists


def test_router_yaml_preflight_checks_the_band(tmp_path: Path) -> None:
    good = tmp_path / "router.yaml"
    good.write_text("router_class: affinity_verl.AffinityLoadBalancer\nfull_determinism: false\n"
                    "affinity_break_margin: 1\naffinity_break_tokens: 8192\n"
                    "affinity_break_band_cap: 4\n")
    assert validate_router_config(good).config.affinity_break_tokens == 8192
    bad = tmp_path / "bad.yaml"
    bad.write_text("router_class: affinity_verl.AffinityLoadBalancer\nfull_determinism: false\n"
                   "affinity_break_margin: 1\naffinity_break_tokens: 8192\n"
                   "affinity_break_band_cap: 0\n")
    with pytest.raises(OptionError, match=f"router config {bad}: affinity_break_band_cap "
                       "must be null or an integer >= 1, got 0"):
        validate_router_config(bad)


@pytest.mark.parametrize(("options", "fields"), [
    ({}, []),  # verl 0.9.1's default: nothing is serialised into the acquire
    ({"affinity_break_margin": 2}, []),
    (BAND, ["prompt_ids"]),
    ({**BAND, "full_determinism": True}, []),  # the band is ignored there (R-BAND-5)
])
def test_prompt_ids_are_declared_only_with_the_band(
    options: dict[str, Any], fields: list[str]
) -> None:
    balancer = AffinityLoadBalancer(SERVERS, options)
    assert balancer.require_acquire_fields() == fields
    assert balancer.require_release_fields() == []


def _busy_s0(options: dict[str, Any], path: Path | None = None) -> AffinityLoadBalancer:
    """"conv" pinned to s0 (released), then s0 held at load 2, s1 and s2 idle."""
    extra = {} if path is None else {"decision_log": str(path)}
    lb = AffinityLoadBalancer(SERVERS, {**options, **extra})
    assert lb.acquire_server("conv", prompt_ids=[7] * 10) == ("s0", None)
    lb.release_server("s0")
    # One request on each server, then "a" again while s0 is still least loaded (kept at
    # any margin), then the other two finish.
    assert [lb.acquire_server(r)[0] for r in "abca"] == ["s0", "s1", "s2", "s0"]
    lb.release_server("s1")
    lb.release_server("s2")
    assert lb.get_status()["servers"] == {"s0": 2, "s1": 0, "s2": 0}
    return lb


@pytest.mark.parametrize(("prompt_len", "server", "kept"), [
    (10, "s1", 1),  # band 0: 2 > 0 + 0, broken
    (1999, "s1", 1),  # band 1: still broken
    (2000, "s0", 2),  # band 2: 2 <= 0 + 2, kept (the bound is inclusive)
    (10**6, "s0", 2),  # capped at 3: kept
])
def test_the_band_reads_the_length_of_prompt_ids(prompt_len: int, server: str,
                                                  kept: int) -> None:
    lb = _busy_s0(BAND)
    assert lb.acquire_server("conv", prompt_ids=[1] * prompt_len)[0] == server
    status = lb.get_status()
    assert (status["affinity_kept"], status["affinity_broken"]) == (
        kept, 1 if server == "s1" else 0)  # "a" kept once, then conv
    assert status["affinity_break_tokens"] == 1000
    assert status["affinity_break_band_cap"] == 3


def test_sequences_other_than_lists_count_by_length() -> None:
    for ids in ((3,) * 2000, range(2000)):
        assert _busy_s0(BAND).acquire_server("conv", prompt_ids=ids)[0] == "s0"
    np = pytest.importorskip("numpy")
    assert _busy_s0(BAND).acquire_server("conv", prompt_ids=np.zeros(2000, "int64"))[0] == "s0"


def test_no_prompt_ids_counts_as_zero_context() -> None:
    """R-BAND-1: an acquire without context counts as c = 0 (the plain margin)."""
    assert _busy_s0(BAND).acquire_server("conv")[0] == "s1"
    assert _busy_s0(BAND).acquire_server("conv", prompt_ids=None)[0] == "s1"


@pytest.mark.parametrize("bad", ["some prompt text", b"\x01\x02", {"ids": [1]}, {1, 2},
                                 42, 3.5, iter([1, 2])])
def test_malformed_prompt_ids_raise_and_change_nothing(bad: Any) -> None:
    lb = _busy_s0(BAND)
    before = lb.get_status()
    with pytest.raises(TypeError, match=r"acquire_server\(request_id='conv'\): prompt_ids "
                       r"must be a sequence of token ids \(e.g. a list of int\) or None, got"):
        lb.acquire_server("conv", prompt_ids=bad)
    assert lb.get_status() == before
    assert lb.acquire_server("conv", prompt_ids=[0] * 2000)[0] == "s0"  # still usable


def test_without_the_band_prompt_ids_are_ignored() -> None:
    """R-BAND-3: the margin alone decides, whatever was sent (even junk)."""
    for prompt_ids in (None, [0] * 10**5, "junk"):
        lb = _busy_s0({"affinity_break_margin": 0, "tie_break": "first"})
        assert lb.acquire_server("conv", prompt_ids=prompt_ids)[0] == "s1"


def test_decision_log_records_the_context_and_replays(tmp_path: Path) -> None:
    path = tmp_path / "band.ndjson"
    lb = _busy_s0(BAND, path)
    lb.acquire_server("conv", prompt_ids=[0] * 2500)
    report = replay_decision_log([path])
    assert report.divergences == ()
    assert report.config.affinity_break_tokens == 1000
    acquires = [e for e in report.events if isinstance(e, Acquire)]
    # Only what verl's client sent: the four acquires without prompt_ids carry none.
    assert [e.context_tokens for e in acquires] == [10, None, None, None, None, 2500]
