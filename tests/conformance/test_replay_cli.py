"""``affinity replay`` (R-LOG-1): a good decision log passes; tampered logs are pinpointed.

Logs are written by the real writer (:class:`DecisionLogWriter`), once driven directly
from the core and once by the verl adapter's ``decision_log`` option, then tampered with
the ways that matter: a changed decision, a deleted line, swapped lines, a forged digest,
a truncated last line, a broken header, rotated files that do not join up.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from affinity_cli.main import main
from affinity_conformance.log_replay import LogError, replay_file
from affinity_engine import (
    Acquire,
    AddServers,
    ClearStickyCache,
    Config,
    Event,
    Release,
    RemoveServers,
    initial_state,
    step,
)
from affinity_runtime.decision_log import DecisionLogWriter

ROOT = Path(__file__).resolve().parents[2]


def write_log(path: Path, events: list[Event], config: Config, *,
              max_bytes: int = 1 << 20) -> DecisionLogWriter:
    writer = DecisionLogWriter(path, max_bytes=max_bytes, backups=5)
    state = initial_state(config, ["s0", "s1", "s2"])
    writer.start(config, state)
    for event in events:
        t = step(config, state, event)
        writer.record(config, state, event, t.outcome, t.state)
        state = t.state
    writer.close()
    return writer


EVENTS: list[Event] = [
    Acquire(request_id="a"), Acquire(request_id="b"), Acquire(request_id="a"),
    Release(server_id="s0"), Acquire(request_id="a"), Acquire(request_id="c", tie_draw=1),
    RemoveServers(server_ids=["s1"]), Acquire(request_id="b"), AddServers(server_ids=["s1"]),
    ClearStickyCache(), Acquire(request_id="a"), Release(server_id="s9"),
]
CONFIG = Config(affinity_break_margin=0, max_cache_size=2, tie_break="draw")


@pytest.fixture
def good_log(tmp_path: Path) -> Path:
    path = tmp_path / "decisions.ndjson"
    write_log(path, EVENTS, CONFIG)
    return path


@attrs.frozen
class Done:
    returncode: int
    stdout: str
    stderr: str


def replay(*args: str) -> Done:
    """``affinity replay ARGS`` in process (the CLI's own entry point, output captured)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["replay", *args])
    return Done(code, out.getvalue(), err.getvalue())


def replay_subprocess(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "affinity_cli.main", "replay", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines(keepends=True)


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(lines), encoding="utf-8")
    return path


def test_good_log_passes(good_log: Path) -> None:
    result = replay_file(good_log)
    assert result.divergence is None and result.truncated is None
    assert result.records == len(EVENTS) and (result.first_seq, result.last_seq) == (0, 11)
    done = replay_subprocess(str(good_log))  # the installed entry point, end to end
    assert done.returncode == 0, done.stderr
    assert f"ok: {len(EVENTS)} records in 1 file(s) match the spec" in done.stdout


def test_adapter_log_passes(tmp_path: Path) -> None:
    from affinity_verl import AffinityLoadBalancer

    path = tmp_path / "adapter.ndjson"
    lb = AffinityLoadBalancer(servers=dict.fromkeys(["s0", "s1", "s2"]), tie_break="draw",
                              affinity_break_margin=1, decision_log=str(path), seed=7)
    for i in range(30):
        sid, _ = lb.acquire_server(request_id="abcde"[i % 5])
        if i % 4 == 0:
            lb.release_server(sid)
    lb.remove_servers(["s2"])
    lb.add_servers({"s2": None})
    lb.clear_sticky_cache()
    lb.acquire_server(request_id="a")
    assert replay(str(path)).returncode == 0


def test_changed_decision_is_pinpointed(good_log: Path, tmp_path: Path) -> None:
    lines = _lines(good_log)
    record = json.loads(lines[3])  # seq 2: acquire("a"), a hit at margin 0: it breaks
    assert record["event"] == {"op": "acquire", "request_id": "a"}
    assert record["outcome"]["server_id"] == "s2" and record["outcome"]["path"] == "broken"
    record["outcome"]["server_id"] = "s0"
    lines[3] = json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"
    done = replay(str(_write(tmp_path / "changed.ndjson", lines)))
    assert done.returncode == 1
    assert "changed.ndjson:4 (seq 2): acquire('a')" in done.stderr
    assert "the log chose s0, the spec requires s2" in done.stderr
    assert "before: seq 0 acquire('a')" in done.stderr and "before: seq 1" in done.stderr
    assert "R-KEEP-1" in done.stderr and "Traceback" not in done.stderr


def _tamper_last(path: Path, outcome: dict[str, object], out: Path) -> Path:
    """The log at ``path`` with its last record's outcome replaced (a router's bug)."""
    lines = _lines(path)
    record = json.loads(lines[-1])
    record["outcome"] = outcome
    lines[-1] = json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"
    return _write(out, lines)


def test_margin_under_full_determinism_is_named(tmp_path: Path) -> None:
    # A router that applies the margin under full_determinism logs a break of a kept pin.
    # The diagnosis must not blame the sticky map's recency (R-LRU-2).
    config = Config(affinity_break_margin=0, full_determinism=True, hash_mode="stable")
    path = tmp_path / "det.ndjson"
    write_log(path, [Acquire(request_id="a"), Acquire(request_id="a")], config)
    assert json.loads(_lines(path)[-1])["outcome"]["path"] == "kept"
    bad = _tamper_last(path, {"kind": "acquired", "path": "broken", "previous": "s0",
                              "server_id": "s1"}, tmp_path / "bad.ndjson")
    done = replay(str(bad))
    assert done.returncode == 1
    assert "under full_determinism the margin, the context band and the gate are ignored" \
        in done.stderr
    assert "R-DET-4" in done.stderr and "R-LRU" not in done.stderr


def test_break_that_did_not_re_pin_is_named(tmp_path: Path) -> None:
    # margin 2: 'a' is kept on s0 twice, then broken to s1; s0 drains; the spec keeps 'a'
    # on s1 (inside the band, not on its edge), a router that did not re-pin routes it to s0.
    config = Config(affinity_break_margin=2)
    path = tmp_path / "repin.ndjson"
    events: list[Event] = [*[Acquire(request_id="a")] * 4,
                           *[Release(server_id="s0")] * 3, Acquire(request_id="a")]
    write_log(path, events, config)
    assert json.loads(_lines(path)[4])["outcome"]["path"] == "broken"
    bad = _tamper_last(path, {"kind": "acquired", "path": "kept", "server_id": "s0"},
                       tmp_path / "bad.ndjson")
    done = replay(str(bad))
    assert done.returncode == 1
    assert "the break at seq 3 re-pinned 'a' from s0 to s1, but the log still routes it " \
        "to s0" in done.stderr
    assert "R-BREAK-1" in done.stderr and "'<' comparison" not in done.stderr


def test_own_random_tie_says_how_to_log_the_draw(tmp_path: Path) -> None:
    # A router with tie_break 'draw' that logs no tie_draw: replay has no --tie-break
    # option, so the hint is what the log must carry (not "first in pool
    # order" nor "run --tie-break any").
    config = Config(affinity_break_margin=1, tie_break="draw")
    path = tmp_path / "draw.ndjson"
    write_log(path, [Acquire(request_id="a")], config)
    bad = _tamper_last(path, {"kind": "acquired", "path": "new", "server_id": "s1"},
                       tmp_path / "bad.ndjson")
    done = replay(str(bad))
    assert done.returncode == 1
    assert "'draw': tie_draw 0 mod 3 = index 0 of the tie set {s0, s1, s2}" in done.stderr
    assert "as the event's tie_draw" in done.stderr
    assert "--tie-break" not in done.stderr and "first in pool order" not in done.stderr


def _drop_digests(lines: list[str], keep: set[int]) -> list[str]:
    out = []
    for i, line in enumerate(lines):
        record = json.loads(line)
        if i and i - 1 not in keep:
            record.pop("state_digest", None)
        out.append(json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n")
    return out


def test_a_log_without_state_digests_is_malformed(good_log: Path, tmp_path: Path) -> None:
    # A writer in another language that leaves out state_digest must not pass on the
    # outcomes and summaries alone, unchecked on the per-server counts or the sticky map.
    done = replay(str(_write(tmp_path / "bare.ndjson", _drop_digests(_lines(good_log),
                                                                      set()))))
    assert done.returncode == 2
    assert "bare.ndjson:2: record seq 0 has no state_digest; the first record of a file " \
        "must carry one (R-LOG-1" in done.stderr


def test_state_digest_at_least_every_1024_records(tmp_path: Path) -> None:
    config = Config(affinity_break_margin=1)
    path = tmp_path / "long.ndjson"
    events: list[Event] = [Acquire(request_id=f"r{i}") for i in range(1030)]
    write_log(path, events, config)
    lines = _lines(path)
    assert "state_digest" in json.loads(lines[1 + 1024])  # the writer's own interval
    assert replay(str(path)).returncode == 0
    done = replay(str(_write(tmp_path / "sparse.ndjson", _drop_digests(lines, {0}))))
    assert done.returncode == 2
    assert "sparse.ndjson:1026: record seq 1024 has no state_digest; a record 1024 " \
        "records after the last state_digest must carry one" in done.stderr
    first = _drop_digests(lines[:1 + 1024], {0})  # seq 0..1023: the next one is not due
    assert replay(str(_write(tmp_path / "first.ndjson", first))).returncode == 0


def test_deleted_line_is_pinpointed(good_log: Path, tmp_path: Path) -> None:
    lines = _lines(good_log)
    del lines[5]
    done = replay(str(_write(tmp_path / "deleted.ndjson", lines)))
    assert done.returncode == 1
    assert "deleted.ndjson:6 (seq 5)" in done.stderr and "seq 4 is missing" in done.stderr


def test_reordered_lines_are_pinpointed(good_log: Path, tmp_path: Path) -> None:
    lines = _lines(good_log)
    lines[4], lines[5] = lines[5], lines[4]
    done = replay(str(_write(tmp_path / "reordered.ndjson", lines)))
    assert done.returncode == 1
    assert "out of order (seq 3 is at line 6)" in done.stderr


def test_forged_summary_is_pinpointed(good_log: Path, tmp_path: Path) -> None:
    lines = _lines(good_log)
    record = json.loads(lines[6])
    record["summary"]["inflight_total"] += 1
    lines[6] = json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"
    done = replay(str(_write(tmp_path / "summary.ndjson", lines)))
    assert done.returncode == 1 and "summary differs" in done.stderr
    assert "summary.ndjson:7 (seq 5)" in done.stderr


def test_forged_digest_is_pinpointed(good_log: Path, tmp_path: Path) -> None:
    lines = _lines(good_log)
    record = json.loads(lines[7])
    record["state_digest"] = "0" * 64
    lines[7] = json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"
    done = replay(str(_write(tmp_path / "digest.ndjson", lines)))
    assert done.returncode == 1 and "state_digest differs" in done.stderr
    assert "digest.ndjson:8 (seq 6)" in done.stderr


def test_truncated_log_is_reported_as_truncated(good_log: Path, tmp_path: Path) -> None:
    text = good_log.read_text(encoding="utf-8")
    cut = _write(tmp_path / "cut.ndjson", [text[:-25]])
    done = replay(str(cut))
    assert done.returncode == 2
    assert "TRUNCATED" in done.stderr and "truncated last line" in done.stderr
    assert f"the {len(EVENTS) - 1} records before it match the spec" in done.stderr
    allowed = replay("--allow-truncated", str(cut))
    assert allowed.returncode == 0 and f"ok: {len(EVENTS) - 1} records" in allowed.stdout


def test_rotated_files_each_replay_alone(tmp_path: Path) -> None:
    path = tmp_path / "rotating.ndjson"
    events: list[Event] = [Acquire(request_id=f"r{i % 7}") for i in range(120)]
    writer = write_log(path, events, Config(), max_bytes=4096)
    files = writer.files()
    assert len(files) >= 3
    done = replay(*map(str, files))
    assert done.returncode == 0, done.stderr
    assert f"in {len(files)} file(s)" in done.stdout
    assert replay(str(files[-1])).returncode == 0  # the newest file alone


def _rotated(tmp_path: Path) -> list[Path]:
    path = tmp_path / "rotating.ndjson"
    events: list[Event] = [Acquire(request_id=f"r{i % 7}") for i in range(120)]
    files = write_log(path, events, Config(), max_bytes=4096).files()
    assert len(files) >= 3
    return files


def test_rotated_files_must_join_up(tmp_path: Path) -> None:
    """R-LOG-1: every file replays alone, but a set with a file missing, out of order or
    with a rewritten header is a divergence at the header that does not continue."""
    oldest, middle, *_, newest = files = _rotated(tmp_path)
    for single in files:
        assert replay(str(single)).returncode == 0
    gap = replay(str(oldest), str(newest))  # the middle file(s) are missing
    assert gap.returncode == 1
    assert f"{newest}:1 (seq " in gap.stderr and "does not continue" in gap.stderr
    assert "records lost, or files out of order" in gap.stderr and "R-LOG-1" in gap.stderr
    swapped = replay(str(middle), str(oldest))
    assert swapped.returncode == 1 and f"{oldest}:1" in swapped.stderr
    assert replay("--separate", str(oldest), str(newest)).returncode == 0

    lines = _lines(middle)  # same seq, different state: a header rewritten by hand
    header = json.loads(lines[0])
    header["state"]["affinity_kept"] += 1
    lines[0] = json.dumps(header) + "\n"
    _write(middle, lines)
    assert replay(str(middle)).returncode == 1  # alone it fails on its first digest...
    forged = replay(str(oldest), str(middle))
    assert forged.returncode == 1  # ...and in the set it fails at the join, before that
    assert f"{middle}:1" in forged.stderr and "is not the state" in forged.stderr


def test_config_change_between_files_is_a_divergence(tmp_path: Path) -> None:
    first, second = tmp_path / "a.ndjson", tmp_path / "b.ndjson"
    state = initial_state(CONFIG, ["s0", "s1", "s2"])
    for path, config in ((first, CONFIG), (second, attrs.evolve(CONFIG, max_cache_size=3))):
        writer = DecisionLogWriter(path)
        writer.start(config, state)
        writer.close()
    done = replay(str(first), str(second))
    assert done.returncode == 1 and "config differs" in done.stderr
    assert replay(str(first), str(first)).returncode == 0  # empty files join at their seq


def test_a_restart_is_a_new_run_and_the_set_replays_clean(tmp_path: Path) -> None:
    """R-LOG-3: a writer restarted on the same path marks its header as a restart; replay
    counts it as a new run and exits 0 (it used to call it a DIVERGENCE and exit 1)."""
    path = tmp_path / "restart.ndjson"
    write_log(path, EVENTS[:4], CONFIG)
    first_run = path.read_text(encoding="utf-8")
    writer = write_log(path, EVENTS[4:], CONFIG)  # a restarted actor, same path
    old, new = writer.files()
    assert old.name == "restart.ndjson.1" and old.read_text(encoding="utf-8") == first_run
    joined = replay(str(old), str(new))
    assert joined.returncode == 0, joined.stderr
    assert f"ok: {len(EVENTS)} records in 2 file(s)" in joined.stdout
    assert "2 run(s)" in joined.stdout and "a new run starts here (cold restart)" in joined.stdout
    as_json = json.loads(replay("--json", str(old), str(new)).stdout)
    assert as_json["runs"] == 2 and as_json["exit"] == 0
    # A header without the restart mark (an older writer's) is still a broken join.
    lines = _lines(new)
    header = json.loads(lines[0])
    del header["restart"]
    lines[0] = json.dumps(header) + "\n"
    unmarked = replay(str(old), str(_write(new, lines)))
    assert unmarked.returncode == 1, unmarked.stdout
    assert "a new run starts here" in unmarked.stderr and "--separate" in unmarked.stderr
    separate = replay("--separate", str(old), str(new))
    assert separate.returncode == 0, separate.stderr


def _warm_restart_set(tmp_path: Path) -> list[Path]:
    """A run that crashed with a request in flight and a cut last line, then a warm
    restart on the same path (affinity_runtime.warm_start)."""
    from affinity_runtime.warm_start import ABANDONED, start_log

    path = tmp_path / "warm.ndjson"
    write_log(path, EVENTS[:6], CONFIG)
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"seq": 6, "event": {"op": "acq')  # killed mid-record
    writer = DecisionLogWriter(path, backups=5)
    resumed = start_log(writer, CONFIG, initial_state(CONFIG, ["s0", "s1", "s2"]))
    assert resumed.warm and resumed.abandoned
    state = resumed.state
    for event in [*resumed.abandoned, *EVENTS[6:]]:
        t = step(CONFIG, state, event)
        writer.record(CONFIG, state, event, t.outcome, t.state,
                      reason=ABANDONED if event in resumed.abandoned else None)
        state = t.state
    writer.close()
    return writer.files()


def test_a_warm_restart_after_a_crash_joins_and_exits_0(tmp_path: Path) -> None:
    old, new = _warm_restart_set(tmp_path)
    done = replay(str(old), str(new))
    assert done.returncode == 0, done.stderr
    assert "2 run(s)" in done.stdout and "(warm restart, continuing" in done.stdout
    assert "its last line is cut (a crash)" in done.stdout
    records = [json.loads(line) for line in _lines(new)[1:]]
    assert all(isinstance(r["ts"], int) for r in records)  # wall clock, ignored by replay
    assert records[0]["reason"].startswith("abandoned")
    assert replay(str(old)).returncode == 2  # alone, the cut line is still reported


def test_wall_clock_times_are_ignored_by_replay(good_log: Path, tmp_path: Path) -> None:
    """``ts`` is the writer's wall clock (SPEC §16, decision log): a clock that jumps
    back, stands still or is missing changes no verdict. The control rewrites a decided
    field the same way, and the same replay refutes it."""
    def rewrite(field: str, values: list[object]) -> list[str]:
        lines = _lines(good_log)
        for number, value in zip(range(1, len(lines)), values, strict=False):
            record = json.loads(lines[number])
            assert field in record, record
            if value is None:
                del record[field]
            else:
                record[field] = value
            lines[number] = json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"
        return lines

    clocks: list[object] = [10**12, 0, -5, 0, None, 1, 2**62, 3, 3, None, 7, 0]
    done = replay(str(_write(tmp_path / "clock.ndjson", rewrite("ts", clocks))))
    assert done.returncode == 0, done.stderr
    seqs: list[object] = [0, 2, 1]  # the same rewrite of a field replay checks
    control = replay(str(_write(tmp_path / "seq.ndjson", rewrite("seq", seqs))))
    assert control.returncode == 1, control.stdout


def test_a_warm_restart_that_does_not_continue_its_run_is_a_divergence(
        tmp_path: Path) -> None:
    old, new = _warm_restart_set(tmp_path)
    lines = _lines(new)
    header = json.loads(lines[0])
    header["state"]["affinity_kept"] += 1  # restarted from another state than replayed
    lines[0] = json.dumps(header) + "\n"
    done = replay(str(old), str(_write(new, lines)))
    assert done.returncode == 1
    assert "a warm restart does not continue the run before it" in done.stderr
    assert "R-LOG-3" in done.stderr


def test_bad_header_is_malformed_input(good_log: Path, tmp_path: Path) -> None:
    lines = _lines(good_log)
    header = json.loads(lines[0])
    header["config"]["max_cache_size"] = 0
    lines[0] = json.dumps(header) + "\n"
    done = replay(str(_write(tmp_path / "header.ndjson", lines)))
    assert done.returncode == 2
    assert "header.ndjson:1: header config" in done.stderr and "max_cache_size" in done.stderr
    with pytest.raises(LogError, match="header config"):
        replay_file(tmp_path / "header.ndjson")


def test_json_output(good_log: Path) -> None:
    done = replay("--json", str(good_log))
    data = json.loads(done.stdout)
    assert done.returncode == 0 and data["exit"] == 0
    assert data["files"][0]["records"] == len(EVENTS)


def test_the_other_language_example_in_the_docs_replays(tmp_path: Path) -> None:
    # docs/conformance.md shows a log a non-Python router writes; it must replay, and a
    # wrong decision in it must be caught.
    text = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    block = text.split("```ndjson\n", 1)[1].split("```", 1)[0]
    path = _write(tmp_path / "example.ndjson", [block])
    done = replay(str(path))
    assert done.returncode == 0, done.stderr
    assert "example.ndjson: 4 records match the spec (seq 0..3)" in done.stdout
    lines = block.splitlines(keepends=True)
    record = json.loads(lines[3])
    assert record["outcome"] == {"kind": "acquired", "path": "kept", "server_id": "s1"}
    record["outcome"]["server_id"] = "s0"
    lines[3] = json.dumps(record) + "\n"
    assert replay(str(_write(tmp_path / "wrong.ndjson", lines))).returncode == 1


def test_separate_reports_every_diverging_file(good_log: Path, tmp_path: Path) -> None:
    # --separate judges every file, not only up to the first that diverges.
    lines = _lines(good_log)
    record = json.loads(lines[3])
    record["outcome"]["server_id"] = "s0"
    lines[3] = json.dumps(record) + "\n"
    bad1 = _write(tmp_path / "bad1.ndjson", lines)
    bad2 = _write(tmp_path / "bad2.ndjson", lines)
    done = replay("--separate", str(bad1), str(good_log), str(bad2))
    assert done.returncode == 1
    assert "DIVERGENCE after 2 matching records in " + str(bad1) in done.stderr
    assert "DIVERGENCE after 2 matching records in " + str(bad2) in done.stderr
    assert "2 of 3 file(s) diverge" in done.stderr
    assert f"{good_log}: {len(EVENTS)} records match the spec" in done.stdout
    # a rotated set still stops at its first divergence
    done = replay(str(bad1), str(bad2))
    assert done.returncode == 1 and str(bad2) not in done.stderr
