"""The decision-log writer of affinity_runtime: one writer per path, failures reported.

R-LOG-2: a writer locks its path before it reads, rotates or writes any file of the log;
a second writer fails naming the path and the holder and changes nothing; a write failure
or the live file deleted, moved or replaced is reported and the writer resumes with a new
file whose header holds the current state (R-LOG-1 still holds for every file).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import affinity_runtime.decision_log as decision_log_module
from affinity_conformance.log_replay import replay_files
from affinity_engine import Acquire, Config, Release, State, initial_state, step
from affinity_runtime import path_lock
from affinity_runtime.decision_log import DecisionLogLocked, DecisionLogWriter

CONFIG = Config(affinity_break_margin=1, tie_break="first")


def _drive(writer: DecisionLogWriter, state: State, n: int, tag: str = "r") -> State:
    for i in range(n):
        for event in (Acquire(request_id=f"{tag}{i % 3}"), Release(server_id="s0")):
            t = step(CONFIG, state, event)
            writer.record(CONFIG, state, event, t.outcome, t.state)
            state = t.state
    return state


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _started(path: Path, **kwargs: float) -> tuple[DecisionLogWriter, State]:
    writer = DecisionLogWriter(path, **kwargs)  # type: ignore[arg-type]
    state = initial_state(CONFIG, ["s0", "s1"])
    writer.start(CONFIG, state)
    return writer, state


def test_a_second_writer_fails_naming_path_and_holder_and_changes_nothing(
        tmp_path: Path) -> None:
    path = tmp_path / "lb.ndjson"
    first, state = _started(path)
    state = _drive(first, state, 5)
    before = _files(tmp_path)
    second = DecisionLogWriter(path)
    with pytest.raises(DecisionLogLocked) as info:
        second.start(CONFIG, initial_state(CONFIG, ["s0", "s1"]))
    message = str(info.value)
    assert f"decision log {path} is in use by another writer" in message
    assert f"PID {os.getpid()}" in message and str(first.lock_path) in message
    assert _files(tmp_path) == before  # not rotated, not truncated, lock file untouched
    _drive(first, state, 5)  # the first writer goes on undisturbed
    first.close()
    assert not first.lock_path.exists()  # released and removed
    (result,) = replay_files([path])
    assert result.divergence is None and result.records == 20


def test_negative_control_without_the_lock_a_second_writer_rotates_the_live_log_away(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: with the lock disabled, the second start destroys."""

    def no_lock(path: str | os.PathLike[str], what: str) -> path_lock.PathLock:
        return path_lock.PathLock(Path(path), os.open(os.devnull, os.O_RDONLY))

    monkeypatch.setattr(decision_log_module, "acquire", no_lock)
    monkeypatch.setattr(decision_log_module, "_lock_live_file", lambda path: None)
    path = tmp_path / "lb.ndjson"
    first, state = _started(path)
    _drive(first, state, 5)
    live = path.read_bytes()
    DecisionLogWriter(path).start(CONFIG, initial_state(CONFIG, ["s0", "s1"]))
    assert path.read_bytes() != live  # the running writer's file was moved away


def test_deleting_the_lock_file_does_not_let_a_second_writer_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The log file itself is locked too, and its path always names a locked file --
    across size rotations as well -- so a deleted ``.lock`` lets nobody rotate it."""
    path = tmp_path / "lb.ndjson"
    first, state = _started(path, max_bytes=4096)
    state = _drive(first, state, 40)  # several size rotations: the live lock moves along
    assert len(first.files()) >= 3
    first.lock_path.unlink()
    before = _files(tmp_path)
    with pytest.raises(DecisionLogLocked, match="the log file itself is locked"):
        DecisionLogWriter(path).start(CONFIG, initial_state(CONFIG, ["s0", "s1"]))
    after = _files(tmp_path)
    after.pop("lb.ndjson.lock", None)  # the loser's sidecar, released and removed again
    assert after == before  # nothing rotated, truncated or written
    state = _drive(first, state, 3)
    first.close()
    assert replay_files(first.files())[-1].divergence is None
    # Negative control: without the live-file lock the second writer gets in.
    monkeypatch.setattr(decision_log_module, "_lock_live_file", lambda path: None)
    again, _ = _started(path)
    again.lock_path.unlink()
    intruder = DecisionLogWriter(path)
    intruder.start(CONFIG, initial_state(CONFIG, ["s0", "s1"]))
    intruder.close()
    again.close()


def test_after_close_or_a_killed_holder_the_path_is_free(tmp_path: Path) -> None:
    path = tmp_path / "lb.ndjson"
    first, state = _started(path)
    _drive(first, state, 2)
    first.close()
    restarted, _ = _started(path)  # a restart keeps the old run as lb.ndjson.1
    assert [p.name for p in restarted.files()] == ["lb.ndjson.1", "lb.ndjson"]
    restarted.close()
    # A holder killed with SIGKILL never releases by hand: the kernel drops its flock.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from affinity_runtime.path_lock import acquire; "
         f"lock = acquire({str(restarted.lock_path)!r}, 'x'); print('held', flush=True); "
         "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(DecisionLogLocked, match=f"PID {holder.pid}"):
            _started(path)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)
    assert restarted.lock_path.exists()  # left behind by the killed holder...
    again, _ = _started(path)  # ...and no obstacle
    again.close()


def test_a_write_error_is_reported_not_raised_and_the_writer_resumes(
        tmp_path: Path) -> None:
    path = tmp_path / "lb.ndjson"
    writer, state = _started(path)
    state = _drive(writer, state, 3)
    assert writer._file is not None
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, writer._file.fileno())  # the next write gets ENOSPC from the kernel
    os.close(full)
    event = Acquire(request_id="x")
    t = step(CONFIG, state, event)
    assert writer.record(CONFIG, state, event, t.outcome, t.state) is False
    assert not writer.ok and writer.errors == {"write": 1}
    assert writer.problem is not None and "No space left on device" in writer.problem
    state = _drive(writer, t.state, 2)  # resumes at once: a new file, a fresh header
    assert writer.ok and writer.errors == {"write": 1}
    writer.close()
    old, new = path.with_name("lb.ndjson.1"), path
    assert [r.divergence for r in replay_files([old], join=False)] == [None]
    assert [r.divergence for r in replay_files([new], join=False)] == [None]
    joined = replay_files([old, new])  # record 6 is lost, and the set says so
    assert joined[-1].divergence is not None


@pytest.mark.parametrize("how", ["deleted", "moved", "replaced"])
def test_the_live_file_taken_away_is_detected_and_kept(tmp_path: Path, how: str) -> None:
    path = tmp_path / "lb.ndjson"
    writer, state = _started(path, check_interval=3600.0)
    state = _drive(writer, state, 2)
    if how == "deleted":
        path.unlink()
    elif how == "moved":
        path.rename(tmp_path / "elsewhere.ndjson")
    else:  # logrotate's move-and-create: the old file lives on under another name
        path.rename(tmp_path / "elsewhere.ndjson")
        path.write_text("someone else's file\n")
    assert writer.ok  # not checked per record (check_interval): only on check()
    assert writer.check() is False
    assert writer.errors == {how: 1} and writer.problem is not None and how in writer.problem
    _drive(writer, state, 1)
    assert writer.ok
    writer.close()
    (result,) = replay_files([path])
    assert result.divergence is None and result.records == 2 and result.first_seq == 4
    if how == "replaced":  # the foreign file was rotated away, not overwritten
        assert path.with_name("lb.ndjson.1").read_text() == "someone else's file\n"


def test_a_writer_touches_nothing_before_start(tmp_path: Path) -> None:
    DecisionLogWriter(tmp_path / "sub" / "lb.ndjson")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("")
    unusable = tmp_path / "file" / "lb.ndjson"  # its parent is a file
    with pytest.raises(OSError, match=f"cannot open decision log {unusable}: .*file"):
        _started(unusable)
    with pytest.raises(ValueError, match="check_interval must be in"):
        DecisionLogWriter(tmp_path / "lb.ndjson", check_interval=-1.0)


def test_digest_every_is_bounded_by_what_replay_accepts(tmp_path: Path) -> None:
    # R-LOG-1: a digest at least every 1,024 records; a sparser writer would write logs that
    # affinity replay refuses as malformed, so it is refused when it is built.
    for bad in (0, 1025):
        with pytest.raises(ValueError, match=rf"digest_every must be in \[1, 1024\], got {bad}"):
            DecisionLogWriter(tmp_path / "lb.ndjson", digest_every=bad)
    assert DecisionLogWriter(tmp_path / "lb.ndjson", digest_every=1024).digest_every == 1024
    assert list(tmp_path.iterdir()) == []
