"""``affinity_sim.records``: run records merged by seed, and the band table over merged records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from affinity_sim.band import main as band_main
from affinity_sim.records import RecordError, merge_records, parse_seed_ranges, select_seeds
from affinity_sim.routing import parse_policies
from affinity_sim.simulate import simulate_step

from .test_sim_routing import tiny_workload


def _record(policies: list[str], seeds: range) -> dict[str, Any]:
    workload = tiny_workload()
    rows = [simulate_step(workload, p, s).as_dict()
            for s in seeds for p in parse_policies(policies)]
    for row in rows:
        row["requests_per_replica"] = list(row["requests_per_replica"])  # as JSON has it
    return {"sweep": "t", "results": rows}


def test_merging_two_pieces_equals_one_run_and_summaries_are_recomputed() -> None:
    whole = merge_records([("w", _record(["legacy", "margin-0", "band-m0-T50-cap2"],
                                         range(0, 4)))])
    a = _record(["legacy", "margin-0"], range(0, 4))
    b = _record(["legacy", "band-m0-T50-cap2"], range(0, 4))  # legacy rows shared
    merged = merge_records([("a", a), ("b", b)])
    assert merged["seeds"] == [0, 1, 2, 3]
    key = sorted((s["workload"], s["policy"], s["median_change"]) for s in merged["summary"])
    assert key == sorted((s["workload"], s["policy"], s["median_change"])
                         for s in whole["summary"])
    assert len(merged["results"]) == 12


def test_a_disagreeing_shared_row_is_refused_by_name() -> None:
    a = _record(["legacy"], range(0, 2))
    b = json.loads(json.dumps(a))
    b["results"][1]["step_time_s"] += 0.5
    with pytest.raises(RecordError, match=r"b and a disagree on \('tiny', 'legacy', 1\)"):
        merge_records([("a", a), ("b", b)])
    with pytest.raises(RecordError, match="not a run record"):
        merge_records([("x", {"summary": []})])
    with pytest.raises(RecordError, match="no record"):
        merge_records([])


def test_selecting_seeds_summarizes_every_policy_on_the_same_seeds() -> None:
    record = merge_records([("a", _record(["legacy", "margin-0"], range(0, 3))),
                            ("b", _record(["legacy"], range(3, 6)))])
    only = select_seeds(record, parse_seed_ranges("0-1,2"))
    assert {r["seed"] for r in only["results"]} == {0, 1, 2}
    assert all(s["seeds"] == 3 for s in only["summary"])
    with pytest.raises(RecordError, match=r"no results for seeds \[9\]"):
        select_seeds(record, [9])


@pytest.mark.parametrize(("text", "fragment"), [
    ("5-2", "needs 0 <= A <= B"), ("x", "is not N or A-B"), ("-3", "is not N or A-B"),
])
def test_bad_seed_ranges_name_the_value(text: str, fragment: str) -> None:
    with pytest.raises(RecordError, match=fragment):
        parse_seed_ranges(text)


def test_the_band_table_reads_merged_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                             ) -> None:
    a = _record(["legacy", "margin-0", "margin-1", "margin-2", "margin-4"], range(0, 4))
    b = _record(["legacy", "band-m0-T50-cap2-reuse"], range(0, 4))
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    assert band_main([str(pa), str(pb), "--band", "band-m0-T50-cap2-reuse",
                      "--seeds", "0-3"]) == 0
    out = capsys.readouterr().out
    assert "| tiny |" in out and "band-m0-T50-cap2-reuse" in out
    assert band_main([str(pa), str(pb), "--band", "band-m0-T50-cap2-reuse",
                      "--seeds", "7"]) == 2
    assert "no results for seeds [7]" in capsys.readouterr().err
