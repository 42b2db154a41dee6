"""Decision-log retention across restarts (R-LOG-3): rotation never deletes a run a
restart could not replay, and by default keeps the newest crash, whatever the limits.

It used to keep 3 backups whatever they held: four clean restarts after a crash deleted
the crash's log.
"""

from __future__ import annotations

from pathlib import Path

from affinity_conformance.log_replay import count_runs, replay_files
from affinity_engine import Acquire, Config, Release, State, initial_state, step
from affinity_runtime.decision_log import DecisionLogWriter, read_restart
from affinity_runtime.warm_start import ABANDONED, start_log

CONFIG = Config(affinity_break_margin=1, lease_accounting=True)
SERVERS = ["s0", "s1"]


def _run(path: Path, *, in_flight: int = 0, clean: int = 3, **writer: object) -> None:
    """One run of a writer on ``path``: ``clean`` finished requests, then ``in_flight``
    requests left open (a crash, if any)."""
    log = DecisionLogWriter(path, **writer)  # type: ignore[arg-type]
    resumed = start_log(log, CONFIG, initial_state(CONFIG, SERVERS))
    state: State = resumed.state
    events = [e for i in range(clean) for e in (Acquire(request_id=f"c{i}"),
                                                Release(server_id="s0", request_id=f"c{i}"))]
    events += [Acquire(request_id=f"open{i}") for i in range(in_flight)]
    for event in [*resumed.abandoned, *events]:
        t = step(CONFIG, state, event)
        log.record(CONFIG, state, event, t.outcome, t.state,
                   reason=ABANDONED if event in resumed.abandoned else None)
        state = t.state
    log.close()  # a SIGKILL releases the same way; the log has no end marker either way


def _ends(path: Path) -> list[str | None]:
    files = DecisionLogWriter(path).files()
    return [None if (r := read_restart(f)) is None else r.get("previous_end") for f in files]


def test_four_clean_restarts_keep_the_crash(tmp_path: Path) -> None:
    path = tmp_path / "lb.ndjson"
    _run(path, in_flight=2)  # the crash
    for _ in range(5):
        _run(path, backups=3)
    files = DecisionLogWriter(path).files()
    crash = files[0]
    assert read_restart(crash) is None  # the first run's file, still there
    # the crash, the restart after it (whose header says "crash"), 3 backups, the live file
    assert _ends(path)[1] == "crash" and len(files) == 6, _ends(path)
    results = replay_files(files)
    assert [r.divergence for r in results] == [None] * 6
    assert count_runs(results) == 6
    # Negative control: without the exception, the same restarts delete it.
    other = tmp_path / "other.ndjson"
    _run(other, in_flight=2)
    for _ in range(5):
        _run(other, backups=3, keep_last_crash=False)
    assert len(DecisionLogWriter(other).files()) == 4
    assert "crash" not in _ends(other)


def test_an_unreplayable_log_is_never_rotated_away(tmp_path: Path) -> None:
    path = tmp_path / "lb.ndjson"
    path.write_text("not a decision log\n")  # another program's file, or a damaged one
    _run(path)  # starts cold: "unreplayed"
    assert read_restart(path) == {"mode": "cold", "previous_end": "unreplayed",
                                  "reason": read_restart(path)["reason"]}  # type: ignore[index]
    for _ in range(6):
        _run(path, backups=1)
    files = DecisionLogWriter(path).files()
    assert files[0].read_text() == "not a decision log\n"
    # the unreplayed file, the cold start after it, one backup, the live file
    assert len(files) == 4


def test_retention_by_bytes(tmp_path: Path) -> None:
    path = tmp_path / "lb.ndjson"
    for _ in range(6):
        _run(path, clean=20, keep_bytes=1)
    files = DecisionLogWriter(path).files()
    assert len(files) == 1  # no room for any backup: each start leaves only its own file
    for _ in range(3):
        _run(path, clean=20, keep_bytes=10 * path.stat().st_size)
    assert len(DecisionLogWriter(path).files()) == 4
