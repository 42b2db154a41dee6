"""Group pins in the conformance tooling: the ``group`` vectors and ``affinity check``'s
group features (SPEC section 7.6, R-GRP-1..8).

* The suite replays through the reference consumer, cites every R-GRP id, covers "only"
  and "fallback", a null and a set group_break_margin, breaks, evictions, removed servers,
  clears, full_determinism in both hash modes, hashed ties, unkeyed and group-less
  acquires; no vector outside the suite carries a group id or a group option.
* ``affinity check``: an independent implementation written from the spec
  (``MiniGroupBalancer``) passes the suite, traces included; two mutants (no recency
  refresh on a group hit, a group pin on a removed server kept) fail it with the rule
  named; a class whose acquire_server takes no request_group_id is reported unsupported
  with the reason, never a traceback; a class without group options is unsupported.
* The harness delivers a grouped acquire as ``acquire_server(request_id=...,
  request_group_id=...)`` and any other acquire exactly as before.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from affinity_conformance.check import CheckReport, run_check
from affinity_conformance.impl_loader import load_impl
from affinity_conformance.lockstep import Lockstep
from affinity_conformance.pr_classes import pr6122_group
from affinity_conformance.shipped import shipped_vectors
from affinity_conformance.vector_format import load_case, vector_files
from affinity_conformance.vector_runner import run_case
from affinity_engine import Acquire, Config

ROOT = Path(__file__).resolve().parents[2]
BROKEN = ROOT / "tests" / "conformance" / "broken_balancers.py"
VECTORS = shipped_vectors()
GROUP_KEYS = ("group_stickiness", "group_break_margin", "max_group_cache_size")


def _group_cases() -> list[Path]:
    return [p for p in vector_files(VECTORS) if p.parent.name == "group"]


def _check(cls: str, **kwargs: Any) -> CheckReport:
    options: dict[str, Any] = {"tie_mode": "first", "budget": 30, "suites": ["group"]}
    options.update(kwargs)
    return run_check(f"{BROKEN}:{cls}", **options)


def _failures(report: CheckReport) -> list[Any]:
    return [f for r in report.suites.values() for f in r.failures]


# ------------------------------------------------------------------ the vectors
def test_group_suite_replays_and_cites_every_group_requirement() -> None:
    paths = _group_cases()
    assert len(paths) >= 20
    cited: set[str] = set()
    stickiness: set[str] = set()
    margins: set[object] = set()
    paths_seen: set[str] = set()
    reports: set[str] = set()
    for path in paths:
        case = load_case(path)
        assert run_case(case) is None, path
        assert "group_pins" in case.features and "group_pins" in case.levels, path
        cited |= set(case.requirements)
        config = case.data["config"]
        stickiness.add(config.get("group_stickiness", "off"))
        if "group_stickiness" in config:
            margins.add(config["group_break_margin"])
        for item in case.data["steps"]:
            expect = item.get("expect", {})
            paths_seen.add(expect.get("path", ""))
            reports |= {k for k in ("evicted_group", "cleared_groups", "previous") if k in expect}
    assert {f"R-GRP-{n}" for n in range(1, 9)} <= cited
    assert stickiness == {"off", "fallback", "only"}
    assert None in margins and any(isinstance(m, int) for m in margins)
    assert {"group_kept", "group_broken", "reselected", "new", "kept", "unkeyed"} <= paths_seen
    assert {"evicted_group", "cleared_groups", "previous"} <= reports


def test_every_vector_that_mentions_groups_declares_group_pins() -> None:
    """A consumer without group pins skips exactly the cases that use them: any vector
    whose configuration or steps mention groups needs feature group_pins (R-GRP-1)."""
    mentioning = 0
    for path in vector_files(VECTORS):
        text = path.read_text(encoding="utf-8")
        case = json.loads(text)
        uses = ("group" in json.dumps(case["config"]) or '"group_id"' in text
                or "group_kept" in text)
        mentioning += uses
        assert not uses or "group_pins" in case["features"], path
    assert mentioning >= 27  # the group suite at least: the check above was exercised


def test_stable_siblings_land_on_the_hash_of_their_group() -> None:
    case = load_case(VECTORS / "group" / "stable_siblings_hash_the_group.json")
    chosen: dict[str, set[str]] = {}
    for item in case.data["steps"]:
        event = item.get("event", {})
        if event.get("op") == "acquire":
            chosen.setdefault(event["group_id"], set()).add(item["expect"]["server_id"])
    assert len(chosen) == 3 and all(len(servers) == 1 for servers in chosen.values())


# ------------------------------------------------------------------ affinity check
def test_an_implementation_written_from_the_spec_passes_the_group_suite() -> None:
    report = _check("MiniGroupBalancer")
    group = report.suites["group"]
    assert not _failures(report), [f.divergence.render() for f in _failures(report)]
    assert group.failed == 0 and group.passed >= 15
    assert group.traces_passed > 0 and group.traces_failed == 0
    assert report.levels["group_pins"].verdict == "pass"
    impl = load_impl(f"{BROKEN}:MiniGroupBalancer")
    assert {"group_pins", "group_optional", "group_fallback", "group_margin",
            "group_cache_size", "unkeyed"} <= impl.features


@pytest.mark.parametrize("cls", ["StaleGroupLruBalancer", "KeepsRemovedGroupBalancer"])
def test_a_group_mutant_fails_the_group_suite(cls: str) -> None:
    report = _check(cls)
    failures = _failures(report)
    assert report.verdict == "fail" and failures
    assert report.levels["group_pins"].verdict == "fail"
    for failure in failures:  # each divergence names the group rule it breaks
        assert "R-GRP-4" in failure.divergence.requirements, failure.divergence.render()
    pinned = [f for f in failures if "group 'g" in f.divergence.words]
    assert pinned, [f.divergence.render() for f in failures]


def test_pr6122_group_accepts_only_r_grp_8s_configuration() -> None:
    """The shim refuses (before loading the PR file) every group option that is not
    R-GRP-8's, naming the value, so such cases are reported unsupported."""
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"group_stickiness": "fallback"}, "group_stickiness='fallback'"),
        ({"group_stickiness": "only", "group_break_margin": 1}, "group_break_margin=1"),
        ({"group_stickiness": "only", "max_cache_size": 4, "max_group_cache_size": 2},
         "max_group_cache_size=2"),
    ]
    for options, named in refusals:
        with pytest.raises(TypeError, match=re.escape(named)):
            pr6122_group({"s0": None}, **options)


def test_stale_group_lru_is_caught_by_the_recency_vector() -> None:
    report = _check("StaleGroupLruBalancer", budget=0)
    origins = {f.origin for f in _failures(report)}
    assert "vector group/only_group_hit_refreshes_recency.json" in origins, origins


def test_kept_removed_group_pin_is_caught_by_the_removed_server_vectors() -> None:
    report = _check("KeepsRemovedGroupBalancer", budget=0)
    origins = {f.origin for f in _failures(report)}
    assert {"vector group/fallback_group_on_removed_server_reselects.json",
            "vector group/only_group_on_removed_server_reselects.json"} & origins, origins


def test_acquire_without_request_group_id_is_reported_not_raised() -> None:
    impl = load_impl(f"{BROKEN}:NoGroupFieldBalancer")
    assert "group_pins" not in impl.features
    assert "request_group_id" in impl.notes["group_pins"]
    report = _check("NoGroupFieldBalancer")
    group = report.suites["group"]
    assert group.failed == 0 and group.passed == 0 and group.unsupported == len(_group_cases())
    assert any("request_group_id" in m for m in group.missing), group.missing


def test_a_class_without_group_options_is_unsupported_not_failed() -> None:
    report = _check("MiniBalancer")
    group = report.suites["group"]
    assert group.failed == 0 and group.unsupported == len(_group_cases())
    assert "group_pins" in group.missing


class _Recorder:
    """Records acquire_server's keyword arguments; routes by load, first ties."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.loads = {"s0": 0, "s1": 0}

    def acquire_server(self, **kwargs: Any) -> tuple[str, None]:
        self.calls.append(kwargs)
        chosen = min(self.loads, key=lambda s: self.loads[s])
        self.loads[chosen] += 1
        return chosen, None

    def get_status(self) -> dict[str, Any]:
        return {"servers": dict(self.loads), "total_inflight": sum(self.loads.values()),
                "active_servers": len(self.loads)}


def test_a_grouped_acquire_carries_request_group_id_and_others_do_not() -> None:
    impl = load_impl(f"{BROKEN}:MiniGroupBalancer")
    recorder = _Recorder()
    config = Config(group_stickiness="only")
    lockstep = Lockstep(impl, recorder, config, ["s0", "s1"], "first")
    assert lockstep.apply(Acquire(request_id="a", group_id="g")) is None
    assert lockstep.apply(Acquire(request_id="b")) is None
    assert recorder.calls == [{"request_id": "a", "request_group_id": "g"},
                              {"request_id": "b"}]


@pytest.mark.verl_prs
def test_pr6122s_real_class_routes_groups_as_r_grp_8_says(tmp_path: Path) -> None:
    """PR #6122's GroupStickyLoadBalancer (extracted at run time, AFFINITY_VERL_PRS) under
    R-GRP-8's configuration: every group vector its API can run passes; what fails is the
    API's shape (no remove_servers, a release on an idle server raises)."""
    report = run_check("affinity_conformance.pr_classes:pr6122_group", ctor="kwargs",
                       tie_mode="first", budget=20, suites=["group"], out_dir=tmp_path)
    group = report.suites["group"]
    assert report.verdict == "fail" and group.passed >= 5
    assert {"group_optional", "group_fallback", "group_margin"} <= group.missing
    for failure in group.failures:
        words = failure.divergence.words
        assert "has no remove_servers" in words or "no inflight requests" in words, words
