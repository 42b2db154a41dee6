"""Suite ``validation``: what must be refused, and a few surprising values that must not.

Three kinds of ``valid: false`` cases (spec/vectors/README.md, "Condition: rejections"):

* construction rejections -- a configuration (stage ``config``) or initial server list
  (stage ``initial_state``) that must be refused before any state exists (R-CFG-1..5);
* malformed events (stage ``event``) that a decoder must refuse without a state change
  (R-EV-2); only a JSON/core API consumer can check these (feature ``core_events``);
* rejected steps (``no_servers``, ``invalid_for_config``): well-formed events the state
  machine answers with a ``rejected`` outcome (R-ACQ-5, R-ACQ-9).

``error.key`` names the option or field the refusal must name (R-CFG-1: the message names
the option, the value and the accepted range).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from affinity_conformance.scenario import Scenario
from affinity_conformance.vector_format import VECTOR_FORMAT
from affinity_engine import DualThreshold

SUITE = "validation"

# config key -> the implementation feature needed to even pass that key
CONFIG_FEATURES = {
    "affinity_break_margin": "margin", "dual_threshold": "dual_threshold",
    "full_determinism": "full_determinism", "hash_mode": "hash_stable",
    "tie_break": "tie_hashed", "lease_accounting": "lease_accounting",
    "affinity_break_tokens": "context_band", "affinity_break_band_cap": "context_band",
    "placement_margin": "prefix_placement",
}

_GATE = "dual_threshold"


def _band(margin: Any, tokens: Any, cap: Any) -> dict[str, Any]:
    return {"affinity_break_margin": margin, "affinity_break_tokens": tokens,
            "affinity_break_band_cap": cap}


# (case, requirement ids, raw config overrides, error key)
CONFIG_REJECTIONS: tuple[tuple[str, str, dict[str, Any], str], ...] = (
    ("margin_negative", "R-CFG-3", {"affinity_break_margin": -1}, "affinity_break_margin"),
    ("margin_negative_float", "R-CFG-3", {"affinity_break_margin": -0.5},
     "affinity_break_margin"),
    ("margin_fraction", "R-CFG-3", {"affinity_break_margin": 0.5}, "affinity_break_margin"),
    ("margin_true", "R-CFG-3 R-CFG-1", {"affinity_break_margin": True},
     "affinity_break_margin"),
    ("margin_false", "R-CFG-3 R-CFG-1", {"affinity_break_margin": False},
     "affinity_break_margin"),
    ("margin_string", "R-CFG-3", {"affinity_break_margin": "2"}, "affinity_break_margin"),
    ("margin_list", "R-CFG-3", {"affinity_break_margin": [2]}, "affinity_break_margin"),
    ("cache_zero", "R-CFG-4", {"max_cache_size": 0}, "max_cache_size"),
    ("cache_negative", "R-CFG-4", {"max_cache_size": -1}, "max_cache_size"),
    ("cache_true", "R-CFG-4 R-CFG-1", {"max_cache_size": True}, "max_cache_size"),
    ("cache_fraction", "R-CFG-4", {"max_cache_size": 1.5}, "max_cache_size"),
    ("cache_string", "R-CFG-4", {"max_cache_size": "10"}, "max_cache_size"),
    ("cache_null", "R-CFG-4", {"max_cache_size": None}, "max_cache_size"),
    ("determinism_string", "R-CFG-1", {"full_determinism": "yes"}, "full_determinism"),
    ("determinism_integer", "R-CFG-1", {"full_determinism": 1}, "full_determinism"),
    ("leases_string", "R-CFG-1", {"lease_accounting": "no"}, "lease_accounting"),
    ("tie_break_unknown", "R-CFG-1", {"tie_break": "random"}, "tie_break"),
    ("tie_break_null", "R-CFG-1", {"tie_break": None}, "tie_break"),
    ("hash_mode_unknown", "R-CFG-1", {"hash_mode": "crc32"}, "hash_mode"),
    ("gate_abs_fraction", "R-CFG-5", {_GATE: {"balance_abs_threshold": 1.5}},
     "balance_abs_threshold"),
    ("gate_abs_true", "R-CFG-5", {_GATE: {"balance_abs_threshold": True}},
     "balance_abs_threshold"),
    ("gate_rel_below_one", "R-CFG-5",
     {_GATE: {"balance_abs_threshold": 2, "balance_rel_threshold": 0.5}},
     "balance_rel_threshold"),
    ("gate_rel_unparsable", "R-CFG-5",
     {_GATE: {"balance_abs_threshold": 2, "balance_rel_threshold": "abc"}},
     "balance_rel_threshold"),
    ("gate_rel_true", "R-CFG-5",
     {_GATE: {"balance_abs_threshold": 2, "balance_rel_threshold": True}},
     "balance_rel_threshold"),
    ("gate_missing_abs", "R-CFG-5 R-CODEC-1", {_GATE: {"balance_rel_threshold": 2}},
     "balance_abs_threshold"),
    ("gate_not_an_object", "R-CFG-5 R-CODEC-1", {_GATE: 3}, "dual_threshold"),
    ("margin_and_gate_together", "R-POL-1",
     {"affinity_break_margin": 1, _GATE: {"balance_abs_threshold": 2}}, "dual_threshold"),
    ("unknown_option", "R-CODEC-1 R-CFG-1", {"affinity_margin": 1}, "affinity_margin"),
    # R-CFG-6, the context band: each option's range, then each refused combination.
    ("band_tokens_zero", "R-CFG-6", _band(1, 0, 2), "affinity_break_tokens"),
    ("band_tokens_negative", "R-CFG-6", _band(1, -5, 2), "affinity_break_tokens"),
    ("band_tokens_fraction", "R-CFG-6", _band(1, 2.5, 2), "affinity_break_tokens"),
    ("band_tokens_true", "R-CFG-6 R-CFG-1", _band(1, True, 2), "affinity_break_tokens"),
    ("band_tokens_string", "R-CFG-6", _band(1, "100", 2), "affinity_break_tokens"),
    ("band_cap_zero", "R-CFG-6", _band(0, 10, 0), "affinity_break_band_cap"),
    ("band_cap_false", "R-CFG-6 R-CFG-1", _band(0, 10, False), "affinity_break_band_cap"),
    ("band_cap_below_margin", "R-CFG-6", _band(3, 10, 2), "affinity_break_band_cap"),
    ("band_tokens_without_cap", "R-CFG-6",
     {"affinity_break_margin": 1, "affinity_break_tokens": 10}, "affinity_break_band_cap"),
    ("band_cap_without_tokens", "R-CFG-6",
     {"affinity_break_margin": 1, "affinity_break_band_cap": 3}, "affinity_break_tokens"),
    ("band_without_margin", "R-CFG-6",
     {"affinity_break_tokens": 10, "affinity_break_band_cap": 3}, "affinity_break_margin"),
    # R-PFX-1, prefix-aware placement: the margin's range and refusals.
    ("placement_margin_negative", "R-PFX-1 R-CFG-3", {"placement_margin": -1},
     "placement_margin"),
    ("placement_margin_fraction", "R-PFX-1 R-CFG-3", {"placement_margin": 0.5},
     "placement_margin"),
    ("placement_margin_true", "R-PFX-1 R-CFG-1", {"placement_margin": True},
     "placement_margin"),
    ("placement_margin_string", "R-PFX-1", {"placement_margin": "2"}, "placement_margin"),
    ("band_with_gate_instead_of_margin", "R-CFG-6 R-POL-1",
     {_GATE: {"balance_abs_threshold": 2}, "affinity_break_tokens": 10,
      "affinity_break_band_cap": 3}, "affinity_break_margin"),
)

# (case, requirement ids, raw servers, error key, extra features)
STATE_REJECTIONS: tuple[tuple[str, str, list[Any], str, tuple[str, ...]], ...] = (
    ("server_id_empty", "R-CFG-2", [["", 0], ["s1", 0]], "servers", ()),
    ("server_ids_duplicate", "R-CFG-2", [["s0", 0], ["s0", 0]], "servers", ("core_events",)),
)


def config_features(raw: dict[str, Any]) -> list[str]:
    """Features needed to pass ``raw`` to a constructor (unknown keys need none)."""
    return sorted({CONFIG_FEATURES[k] for k in raw if k in CONFIG_FEATURES})


def _idle(servers: list[Any]) -> dict[str, Any]:
    return {"servers": servers, "lru": [], "affinity_kept": 0, "affinity_broken": 0}


def _rejection(case: str, description: str, reqs: str, raw_config: dict[str, Any],
               servers: list[Any], stage: str, key: str,
               features: list[str]) -> dict[str, Any]:
    return {
        "format": VECTOR_FORMAT, "suite": SUITE, "case": case, "description": description,
        "source": "scenario", "requirements": sorted(set(reqs.split())),
        "features": sorted(features), "config": raw_config,
        "initial_state": _idle(servers), "valid": False,
        "error": {"stage": stage, "key": key}, "steps": [],
    }


def cases() -> Iterator[Scenario | dict[str, Any]]:
    servers = [["s0", 0], ["s1", 0]]
    for case, reqs, raw, key in CONFIG_REJECTIONS:
        yield _rejection(f"config_{case}", f"The configuration {raw} must be refused, naming "
                         f"{key!r}.", reqs, raw, servers, "config", key, config_features(raw))
    for case, reqs, raw_servers, key, extra in STATE_REJECTIONS:
        yield _rejection(f"state_{case}", f"The server list {[s for s, _ in raw_servers]} must "
                         "be refused.", reqs, {}, raw_servers, "initial_state", key, list(extra))
    yield from _accepted_surprises()
    yield from _events()


def _accepted_surprises() -> Iterator[Scenario]:
    """Valid configurations written in forms a strict decoder might wrongly refuse."""
    forms: tuple[tuple[str, str, dict[str, Any], dict[str, Any]], ...] = (
        ("margin_integral_float", "R-CFG-3", {"affinity_break_margin": 2.0},
         {"affinity_break_margin": 2}),
        ("margin_negative_zero", "R-CFG-3", {"affinity_break_margin": -0.0},
         {"affinity_break_margin": 0}),
        ("gate_rel_decimal_string", "R-CFG-5",
         {_GATE: {"balance_abs_threshold": 1, "balance_rel_threshold": "1.5"}},
         {"dual_threshold": DualThreshold(1, "3/2")}),
        ("defaults_only", "R-CFG-1 R-CFG-2", {}, {}),
        ("band_integral_floats", "R-CFG-6", _band(1, 100.0, 3.0),
         {"affinity_break_margin": 1, "affinity_break_tokens": 100,
          "affinity_break_band_cap": 3}),
        ("placement_margin_integral_float", "R-PFX-1 R-CFG-3", {"placement_margin": 2.0},
         {"placement_margin": 2}),
    )
    for case, reqs, raw, options in forms:
        run = Scenario(SUITE, f"accepted_{case}", f"The configuration {raw} is valid and "
                       "behaves like its canonical form.", requirements=reqs.split(),
                       servers=("s0", "s1"), **options)
        run.acquire("a", expect="s0").acquire("b", expect="s1").acquire("a", path="kept")
        yield run.with_raw_config(raw)
    yield (Scenario(SUITE, "no_servers_step", "A well-formed acquire on an empty pool is a "
                    "rejected step; the state is unchanged.",
                    requirements=("R-ACQ-5", "R-OUT-2", "R-OUT-1"), servers=())
           .reject("a", reason="no_servers").release("s0", result="unknown_server")
           .clear(cleared=0).reject("a", reason="no_servers"))


def _events() -> Iterator[Scenario]:
    run = Scenario(SUITE, "malformed_events_are_refused",
                   "Ill-formed events are refused by the decoder and never reach the state "
                   "machine; the well-formed events around them run normally.",
                   requirements=("R-EV-2", "R-CODEC-1", "R-OUT-1"))
    run.acquire("a", expect="s0")
    run.bad_event({"op": "acquire", "request_id": ""}, "request_id")
    run.bad_event({"op": "acquire"}, "request_id")
    run.bad_event({"op": "acquire", "request_id": "a", "tie_draw": -1}, "tie_draw")
    run.bad_event({"op": "acquire", "request_id": "a", "tie_draw": True}, "tie_draw")
    run.bad_event({"op": "acquire", "request_id": "a", "request_hash": "7"}, "request_hash")
    run.bad_event({"op": "acquire", "request_id": 5}, "request_id")
    run.bad_event({"op": "acquire", "request_id": "a", "priority": 1}, "priority")
    run.acquire("a", expect="s0", path="kept")
    run.bad_event({"op": "release", "server_id": ""}, "server_id")
    run.bad_event({"op": "release"}, "server_id")
    run.bad_event({"op": "add_servers", "server_ids": ["s3", "s3"]}, "server_ids")
    run.bad_event({"op": "add_servers", "server_ids": "s3"}, "server_ids")
    run.bad_event({"op": "remove_servers", "server_ids": [""]}, "server id")
    run.bad_event({"op": "acquire_server", "request_id": "a"}, "op")
    run.bad_event({"op": "clear_sticky_cache", "all": True}, "all")
    run.bad_event({"op": "observe_loads", "observed": [["s0", -1]]}, "observed")
    run.bad_event({"op": "observe_loads", "observed": [["s0", 1], ["s0", 2]]}, "observed")
    run.bad_event({"op": "acquire", "request_id": "a", "cached_prefix": [["s0", -1]]},
                  "cached_prefix")
    run.bad_event({"op": "acquire", "request_id": "a",
                   "cached_prefix": [["s0", 1], ["s0", 2]]}, "cached_prefix")
    run.bad_event({"op": "acquire", "request_id": "a", "cached_prefix": "s0"},
                  "cached_prefix")
    run.acquire("b", expect="s1").check()
    yield run
