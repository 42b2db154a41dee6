"""The context band in the conformance tooling: the ``band`` vectors, ``affinity check``'s
feature ``context_band``, and ``affinity replay`` of acquires carrying ``context_tokens``.

* The suite replays through the core and covers what SPEC section 7.5 asks: the c
  boundaries, the cap, default equivalence, monotonicity, full_determinism, the R-CFG-6
  refusals and malformed ``context_tokens``; no older vector mentions the band.
* ``affinity check``: an independent band implementation (``MiniBandBalancer``, verl's
  ``prompt_ids`` field) and one taking the count (``CountBandBalancer``) pass; three
  mutants (ceiling, no cap, a guessed context) fail with the requirement id and the
  mistake named; a class without the band gets *unsupported*, never a failure.
* ``affinity replay`` accepts ``context_tokens`` in acquire records written by the verl
  adapter, and pinpoints a record whose context was tampered with.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from affinity_cli.main import main
from affinity_conformance.check import CheckReport, run_check
from affinity_conformance.lockstep import PROMPT_LIST_LIMIT, acquire_extra
from affinity_conformance.shipped import shipped_vectors
from affinity_conformance.vector_format import load_case, vector_files
from affinity_conformance.vector_runner import run_case

ROOT = Path(__file__).resolve().parents[2]
BROKEN = ROOT / "tests" / "conformance" / "broken_balancers.py"
VECTORS = shipped_vectors()
BAND_KEYS = ("affinity_break_tokens", "affinity_break_band_cap")


def _band_cases() -> list[Path]:
    return [p for p in vector_files(VECTORS) if p.parent.name == "band"]


def _check(cls: str, **kwargs: object) -> CheckReport:
    options: dict[str, Any] = {"tie_mode": "first", "budget": 30, "suites": ["band", "validation"]}
    options.update(kwargs)
    return run_check(f"{BROKEN}:{cls}", **options)


# ------------------------------------------------------------------ the vectors
def test_band_suite_replays_through_the_core_and_covers_section_7_5() -> None:
    paths = _band_cases()
    assert len(paths) >= 30
    cited: set[str] = set()
    contexts: set[int | None] = set()
    for path in paths:
        case = load_case(path)
        assert run_case(case) is None, path
        assert "context_band" in case.features and "context_band" in case.levels, path
        cited |= set(case.requirements)
        for item in case.data["steps"]:
            event = item.get("event", {})
            if event.get("op") == "acquire" and item.get("valid", True):
                contexts.add(event.get("context_tokens"))
    assert {f"R-BAND-{n}" for n in range(1, 6)} | {"R-EV-2"} <= cited
    # c absent, 0, T - 1, T, T + 1, 3T - 1, 3T (T = 100) and a huge value all occur
    assert {None, 0, 99, 100, 101, 299, 300, 10**12} <= contexts


def test_cfg6_refusals_are_validation_vectors_behind_the_flag() -> None:
    refusals = [load_case(p) for p in vector_files(VECTORS)
                if p.parent.name == "validation" and p.stem.startswith("config_band_")]
    assert len(refusals) >= 10
    keys = set()
    for case in refusals:
        assert not case.valid and case.levels == ("strict-config",)
        assert "context_band" in case.features and "R-CFG-6" in case.requirements
        assert case.error is not None and run_case(case) is None
        keys.add(case.error["key"])
    assert keys == {"affinity_break_tokens", "affinity_break_band_cap", "affinity_break_margin"}


def test_no_older_vector_mentions_the_band() -> None:
    """The codec emits the new keys only when set, so the 244 older files kept their bytes."""
    for path in vector_files(VECTORS):
        case = load_case(path)
        if "context_band" in case.features:
            continue
        text = path.read_text(encoding="utf-8")
        assert "context_tokens" not in text and not any(k in text for k in BAND_KEYS), path


def test_schema_knows_the_band_and_rejects_its_misuse() -> None:
    schema = json.loads((VECTORS / "schema" / "vector.schema.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    case = json.loads((VECTORS / "band" / "context_t_widens_by_one.json").read_text(
        encoding="utf-8"))
    assert validator.is_valid(case)
    lone = json.loads(json.dumps(case))
    del lone["config"]["affinity_break_band_cap"]  # T without the cap (R-CFG-6)
    assert not validator.is_valid(lone)
    negative = json.loads(json.dumps(case))
    step = next(s for s in negative["steps"] if "context_tokens" in s.get("event", {}))
    step["event"]["context_tokens"] = -1  # R-EV-2
    assert not validator.is_valid(negative)
    unknown = json.loads(json.dumps(case))
    unknown["features"] = ["band"]  # the flag is context_band; the suite is band
    assert not validator.is_valid(unknown)


# ------------------------------------------------------------ affinity check
def test_acquire_extra_sends_only_declared_present_fields() -> None:
    assert acquire_extra(None, 5) == {} and acquire_extra("prompt_ids", None) == {}
    assert acquire_extra("prompt_ids", 3) == {"prompt_ids": [0, 0, 0]}
    assert acquire_extra("context_tokens", 7) == {"context_tokens": 7}
    huge = acquire_extra("prompt_ids", 10**12)["prompt_ids"]
    assert isinstance(huge, range) and len(huge) == 10**12
    assert isinstance(acquire_extra("prompt_ids", PROMPT_LIST_LIMIT)["prompt_ids"], list)


@pytest.mark.parametrize("cls", ["MiniBandBalancer", "CountBandBalancer"])
def test_band_implementations_pass(cls: str) -> None:
    report = _check(cls)
    assert "context_band" in report.features
    band = report.level("context_band")
    assert band.verdict == "pass" and band.passed >= 38 and band.traces_passed > 0
    assert report.suites["band"].failed == 0 and report.suites["band"].passed >= 38
    assert report.level("strict-config").failed == 0  # the R-CFG-6 refusals are made


@pytest.mark.parametrize(("cls", "rid", "words"), [
    ("CeilBandBalancer", "R-BAND-1", "rounded up"),
    ("UncappedBandBalancer", "R-BAND-2", "an uncapped band keeps here"),
    ("GuessingBandBalancer", "R-BAND-1", "never widens on a guess"),
])
def test_band_mutants_fail_naming_the_requirement(cls: str, rid: str, words: str,
                                                  tmp_path: Path) -> None:
    report = _check(cls, out_dir=tmp_path)
    assert report.level("context_band").verdict == "fail" and report.verdict == "fail"
    failures = report.suites["band"].failures
    assert failures
    named = [f for f in failures if rid in f.divergence.requirements
             and words in f.divergence.words]
    assert named, [f.divergence.render() for f in failures]
    written = named[0].vector_path
    assert written is not None and run_case(load_case(written)) is None  # replays on the core


def test_implementation_without_the_band_is_unsupported_not_failed() -> None:
    report = _check("MiniBalancer")
    assert "context_band" not in report.features
    band = report.suites["band"]
    assert band.verdict == "unsupported" and band.failed == 0 and band.traces_failed == 0
    assert band.unsupported == len(_band_cases()) and "context_band" in band.missing
    assert report.level("context_band").verdict == "unsupported"
    claimed = subprocess.run(
        [sys.executable, "-m", "affinity_cli.main", "check", f"{BROKEN}:MiniBalancer",
         "--budget", "0", "--suite", "band", "--level", "context_band"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert claimed.returncode == 1  # a claimed level that cannot run does not pass
    assert "unsupported (needs context_band" in claimed.stdout


def test_verl_adapter_passes_the_band_suite_through_prompt_ids() -> None:
    report = run_check("affinity_verl:AffinityLoadBalancer", budget=30,
                       suites=["band", "validation"])
    assert "context_band" in report.features
    assert report.suites["band"].verdict == "pass", [
        f.divergence.render() for f in report.suites["band"].failures]
    assert report.level("context_band").passed >= 38


# ------------------------------------------------------------ affinity replay
def _replay(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["replay", *args])
    return code, out.getvalue() + err.getvalue()


def test_replay_accepts_context_tokens_and_pinpoints_a_tampered_one(tmp_path: Path) -> None:
    from affinity_verl import AffinityLoadBalancer

    path = tmp_path / "band.ndjson"
    lb = AffinityLoadBalancer(servers=dict.fromkeys(["s0", "s1", "s2"]),
                              affinity_break_margin=0, affinity_break_tokens=100,
                              affinity_break_band_cap=3, tie_break="first",
                              decision_log=str(path))
    assert lb.acquire_server(request_id="a", prompt_ids=[7] * 50)[0] == "s0"
    assert lb.acquire_server(request_id="a", prompt_ids=[7] * 150)[0] == "s0"  # band 1: kept
    assert lb.acquire_server(request_id="b")[0] == "s1"
    code, text = _replay(str(path))
    assert code == 0, text
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    record = json.loads(lines[2])
    assert record["event"] == {"op": "acquire", "request_id": "a", "context_tokens": 150}
    assert record["outcome"]["path"] == "kept"
    record["event"]["context_tokens"] = 99  # band 0: the spec breaks this hit
    lines[2] = json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"
    tampered = tmp_path / "tampered.ndjson"
    tampered.write_text("".join(lines), encoding="utf-8")
    code, text = _replay(str(tampered))
    assert code == 1
    assert "acquire('a', context_tokens=99)" in text and "R-BAND-1" in text
    assert "band 0 [min(0 + 99 // 100, 3), c = 99]" in text and "Traceback" not in text
