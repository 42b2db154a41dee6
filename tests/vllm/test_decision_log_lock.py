"""A decision log that cannot be destroyed (R-LOG-2).

* Two real ``affinity serve`` processes on one ``--decision-log`` path: the second exits
  non-zero with an error naming the path and the first router's PID, whether it fails on
  the lock or on a port in use, and changes nothing; the first router's log then replays
  clean and complete with ``affinity replay`` after more traffic.
* The live log deleted underneath a running router, and a real write error (the log's
  file descriptor pointed at ``/dev/full``: ENOSPC from the kernel), are reported in
  /metrics and the router log; routing goes on and the writer resumes with a new file
  that replays alone.
* ``--require-decision-log``: while the log cannot be written the router answers 503
  and holds no lease; when the log is back it routes again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from affinity_conformance.decision_log import LogError, read_log

from .fleet import fleet, run, settle

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def _read_line(proc: subprocess.Popen[str], pattern: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if re.search(pattern, line):
            return line
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"no line matching {pattern!r} (exit {proc.poll()})")


def _serve(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "affinity_cli.main", "serve", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=ENV)


def _complete(port: int, session: str) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", method="POST",
        data=json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 2}).encode(),
        headers={"content-type": "application/json", "x-session-id": session})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200


def _affinity_replay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "affinity_cli.main", "replay", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _wait_for_records(path: Path, count: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(LogError):  # a line being written as we read
            if sum(_ops(path).values()) >= count:
                return
        assert time.monotonic() < deadline, f"{path} did not reach {count} records"
        time.sleep(0.02)


def _ops(path: Path) -> dict[str, int]:
    ops: dict[str, int] = {}
    for record in read_log(path):
        if not record.is_header:
            op = record.data["event"]["op"]
            ops[op] = ops.get(op, 0) + 1
    return ops


def test_second_router_on_the_same_log_fails_and_the_first_log_replays_complete(
        tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()  # the router creates no directories
    path = logs / "decisions.ndjson"
    procs: list[subprocess.Popen[str]] = []
    try:
        stub = subprocess.Popen([sys.executable, "-m", "affinity_vllm.stub", "--name", "p"],
                                stdout=subprocess.PIPE, text=True, env=ENV)
        procs.append(stub)
        stub_port = int(_read_line(stub, r"^ready \d+").split()[1])
        backend = f"http://127.0.0.1:{stub_port}"
        first = _serve("--backend", backend, "--port", "0", "--decision-log", str(path))
        procs.append(first)
        port = int(re.findall(r":(\d+) ", _read_line(first, r"listening on http://"))[0])
        for i in range(20):
            _complete(port, f"conv-{i % 4}")
        _wait_for_records(path, 40)  # the last release is logged just after the response
        before = _snapshot(logs)
        assert set(before) == {"decisions.ndjson", "decisions.ndjson.lock"}
        assert before["decisions.ndjson.lock"].decode().strip() == str(first.pid)

        # A second router on another port: the lock refuses it.
        second = _serve("--backend", backend, "--port", "0", "--decision-log", str(path))
        procs.append(second)
        out, _ = second.communicate(timeout=60)
        assert second.returncode == 1, out
        assert f"decision log {path} is in use by another writer" in out, out
        assert f"PID {first.pid}" in out and "nothing was changed" in out, out
        assert "Traceback" not in out, out
        # A second router on the first one's port: the bind refuses it, before the log.
        third = _serve("--backend", backend, "--port", str(port), "--decision-log", str(path))
        procs.append(third)
        out, _ = third.communicate(timeout=60)
        assert third.returncode == 1 and "Traceback" not in out, out
        assert "in use" in out.lower(), out
        assert _snapshot(logs) == before  # neither start touched any file of the log

        for i in range(20):
            _complete(port, f"conv-{i % 4}")
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()

    assert sorted(p.name for p in logs.iterdir()) == ["decisions.ndjson"]  # lock released
    done = _affinity_replay(str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    ops = _ops(path)
    assert ops.get("acquire") == ops.get("release") == 40, ops  # every request, both ends
    assert f"{sum(ops.values())} records in 1 file(s) match the spec" in done.stdout


def _metric(text: str, name: str) -> float | None:
    match = re.search(rf"^affinity_router_{name} (\S+)$", text, re.MULTILINE)
    return None if match is None else float(match.group(1))


def test_a_log_deleted_under_the_router_is_reported_and_resumed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "decisions.ndjson"

    async def scenario() -> None:
        async with fleet(2, decision_log=str(path)) as f:
            for i in range(6):
                assert (await f.complete(f"s{i % 3}")).status == 200
            text = await f.metrics_text()
            assert _metric(text, "decision_log_ok") == 1
            assert _metric(text, 'decision_log_errors_total{kind="deleted"}') == 0
            path.unlink()  # an operator's rm, or a second writer of an older version
            text = await f.metrics_text()  # the scrape looks at the live file
            assert _metric(text, "decision_log_ok") == 0
            assert _metric(text, 'decision_log_errors_total{kind="deleted"}') == 1
            assert (await f.get_json("/status"))["decision_log"]["ok"] is False
            for i in range(4):  # routing goes on; the first record starts a new file
                assert (await f.complete(f"s{i % 3}")).status == 200
            await settle(f)
            text = await f.metrics_text()
            assert _metric(text, "decision_log_ok") == 1
            assert _metric(text, 'decision_log_errors_total{kind="deleted"}') == 1
            f.assert_idle()

    with caplog.at_level(logging.WARNING, logger="affinity_runtime.decision_log"):
        run(scenario())
    assert f"decision log {path} was deleted while being written" in caplog.text
    assert "resumed: a new file starts at seq 12" in caplog.text  # 6 acquires + 6 releases
    done = _affinity_replay(str(path))  # the new file replays alone, from its own header
    assert done.returncode == 0, done.stdout + done.stderr
    assert _ops(path) == {"acquire": 4, "release": 4}


def _break_writes(router_log: object) -> None:
    """Point the writer's open file descriptor at /dev/full: every write fails with a
    real ENOSPC from the kernel (a full disk, without filling one)."""
    handle = router_log._file  # type: ignore[attr-defined]
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        os.dup2(full, handle.fileno())
    finally:
        os.close(full)


def test_a_write_error_is_counted_and_routing_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "decisions.ndjson"

    async def scenario() -> None:
        async with fleet(2, decision_log=str(path)) as f:
            for i in range(4):
                assert (await f.complete(f"s{i}")).status == 200
            _break_writes(f.router.table.decision_log)
            assert (await f.complete("s0")).status == 200  # default: keep routing
            await settle(f)
            text = await f.metrics_text()
            assert _metric(text, 'decision_log_errors_total{kind="write"}') == 1
            assert _metric(text, "decision_log_ok") == 1  # the release resumed it
            f.assert_idle()

    with caplog.at_level(logging.ERROR, logger="affinity_runtime.decision_log"):
        run(scenario())
    assert "No space left on device" in caplog.text
    old, new = path.with_name(path.name + ".1"), path
    assert _affinity_replay(str(old)).returncode == 0  # everything before the failure
    assert _affinity_replay(str(new)).returncode == 0  # everything after it
    joined = _affinity_replay(str(old), str(new))  # ...and the lost record shows
    assert joined.returncode == 1, joined.stdout + joined.stderr


def test_require_decision_log_refuses_to_route_without_a_log(tmp_path: Path) -> None:
    path = tmp_path / "decisions.ndjson"

    async def scenario() -> None:
        async with fleet(2, decision_log=str(path), require_decision_log=True) as f:
            writer = f.router.table.decision_log
            assert writer is not None
            writer.retry_interval = 0.0  # retry on every request (default: once a second)
            writer.check_interval = 0.0  # look at the live file on every request (1 s)
            assert (await f.complete("a")).status == 200
            path.unlink()
            path.mkdir()  # the path cannot be reopened as a file: the log stays down
            reply = await f.complete("a")
            assert reply.status == 503, reply.body
            assert "decision log unavailable" in reply.body["error"]["message"]
            assert "require-decision-log" in reply.body["error"]["message"]
            assert _metric(await f.metrics_text(), "decision_log_ok") == 0
            f.assert_idle()  # the refused request holds nothing
            path.rmdir()
            assert (await f.complete("a")).status == 200  # back as soon as it can write
            await settle(f)
            f.assert_idle()

    run(scenario())
    assert _affinity_replay(str(path)).returncode == 0
    assert _ops(path) == {"acquire": 1, "release": 1}


def test_require_decision_log_needs_a_log_path() -> None:
    from affinity_vllm.options import OptionsError, RouterOptions

    with pytest.raises(OptionsError, match="require_decision_log needs a decision_log"):
        RouterOptions(backends=("http://127.0.0.1:1",), require_decision_log=True)
