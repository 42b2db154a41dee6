"""``affinity_sim.records``: run records merged by seed, and the band table over merged records."""

from __future__ import annotations

import json
from collections.abc import Callable
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


@pytest.mark.parametrize(("text", "says"), [
    ("nope", "not JSON"),
    ('{"summary": []}', "no 'results' list"),
    ('[1, 2]', "no 'results' list"),
    ('{"results": [{"workload": "w"}]}', r"results\[0\] lacks policy, seed, step_time_s"),
])
def test_a_file_that_is_no_run_record_is_refused_naming_it(
        tmp_path: Path, text: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    from affinity_sim.prscale_figure import main as figure_main
    from affinity_sim.prscale_report import main as report_main
    from affinity_sim.records import load
    from affinity_sim.records import main as records_main

    bad = tmp_path / "bad.json"
    bad.write_text(text, encoding="utf-8")
    with pytest.raises(RecordError, match=f"{bad}: .*{says}"):
        load(bad)
    runs: list[tuple[Callable[[list[str]], int], list[str]]] = [
        (band_main, [str(bad), "--band", "x"]), (records_main, [str(bad)]),
        (report_main, [str(bad)]), (figure_main, [str(bad), str(tmp_path / "out.png")])]
    for run, args in runs:
        assert run(args) == 2
        captured = capsys.readouterr()
        assert captured.out == ""  # nothing printed before the refusal
        assert str(bad) in captured.err and "Traceback" not in captured.err
    with pytest.raises(RecordError, match=r"missing\.json: cannot be read"):
        load(tmp_path / "missing.json")


def test_an_unwritable_figure_path_is_refused_before_any_table_is_printed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_record(["legacy", "margin-2", "band-m0-T50-cap2"], range(0, 3))))
    args = [str(path), "--band", "band-m0-T50-cap2"]
    assert band_main([*args, "--png", str(tmp_path / "no" / "x.png")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "does not exist" in captured.err
    assert band_main([*args, "--png", str(tmp_path / "x.txt")]) == 2
    assert "must end in .png" in capsys.readouterr().err
    assert band_main(args) == 0 and "band-m0-T50-cap2" in capsys.readouterr().out
    path.write_text(json.dumps(_record(["legacy", "band-m0-T50-cap2"], range(0, 3))))
    assert band_main(args) == 2  # nothing to compare the band with: one line, no traceback
    captured = capsys.readouterr()
    assert captured.out == "" and "no margin-N policy" in captured.err


def test_the_records_command_writes_the_merged_record(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from affinity_sim.records import load
    from affinity_sim.records import main as records_main

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_record(["legacy", "margin-0"], range(0, 3))))
    b.write_text(json.dumps(_record(["legacy"], range(2, 5))))
    out = tmp_path / "m.json"
    assert records_main([str(a), str(b), "--seeds", "1-3", "--json", str(out)]) == 0
    said = capsys.readouterr().out
    assert "5 rows from 2 record(s)" in said and "3 seeds" in said
    merged = load(out)
    assert merged["seeds"] == [1, 2, 3]
    assert sorted((r["policy"], r["seed"]) for r in merged["results"]) == [
        ("legacy", 1), ("legacy", 2), ("legacy", 3), ("margin-0", 1), ("margin-0", 2)]
    assert records_main([str(a), "--json", str(tmp_path / "no" / "m.json")]) == 2
    assert "--json" in capsys.readouterr().err
