"""The optional decision log, written by the balancer actor.

Off by default. When on: one record per state-changing call, in the format of
:mod:`affinity_runtime.decision_log`, which replays through the core with zero
divergences; files rotate at the size cap and each kept file replays alone;
every call that returned is already on disk, and an abrupt kill leaves at most a
partial last line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import ray
from affinity_verl import AffinityLoadBalancer, OptionError
from affinity_verl.testing.driving import call
from affinity_verl.testing.replay import replay_decision_log

from affinity_conformance.decision_log import LogError, read_log
from affinity_engine import Acquire, ClearStickyCache, RemoveServers
from affinity_runtime.decision_log import DecisionLogLocked

SERVERS = dict.fromkeys(["s0", "s1", "s2"])


def _records(path: Path) -> list[dict[str, Any]]:
    return [r.data for r in read_log(path) if not r.is_header]


def test_off_by_default(make_balancer: Any) -> None:
    lb = make_balancer(servers=SERVERS)
    call(lb, "acquire_server", request_id="a")
    assert call(lb, "get_status")["decision_log"] is None
    assert call(lb, "decision_log_files") == []


def test_every_event_and_outcome_is_logged_and_replays(make_balancer: Any, tmp_path: Path) -> None:
    path = tmp_path / "lb.ndjson"
    lb = make_balancer(servers=SERVERS, decision_log=str(path), affinity_break_margin=1, seed=4)
    assert Path(call(lb, "get_status")["decision_log"]) == path
    assert len(_records(path)) == 0  # header only, written at construction

    steps: list[tuple[str, dict[str, Any]]] = [
        ("acquire_server", {"request_id": "a"}),  # a three-way tie: drawn
        ("acquire_server", {"request_id": "a"}),
        ("acquire_server", {"request_id": "a"}),  # above min + 1: broken
        ("release_server", {"server_id": "s0"}),
        ("release_server", {"server_id": "nope"}),
        ("add_servers", {"servers": {"s3": None}}),
        ("clear_sticky_cache", {}),
        ("remove_servers", {"server_ids": ["s0", "s1", "s2", "s3"]}),
    ]
    for method, kwargs in steps:
        call(lb, method, **kwargs)
    with pytest.raises(RuntimeError, match="No available servers"):
        call(lb, "acquire_server", request_id="b")
    for method in ("get_status", "get_all_servers", "get_total_inflight",
                   "require_release_fields"):
        call(lb, method)  # queries change nothing and are not logged

    records = _records(path)
    assert [r["seq"] for r in records] == list(range(len(steps) + 1))
    assert [r["event"]["op"] for r in records] == [
        "acquire", "acquire", "acquire", "release", "release", "add_servers",
        "clear_sticky_cache", "remove_servers", "acquire"]
    assert [r["outcome"]["kind"] for r in records][-1] == "rejected"
    assert "broken" in [r["outcome"].get("path") for r in records]

    report = replay_decision_log([path])
    assert report.divergences == ()
    assert report.config.tie_break.value == "draw" and report.config.affinity_break_margin == 1
    assert isinstance(report.events[0], Acquire)
    assert isinstance(report.events[6], ClearStickyCache)
    assert isinstance(report.events[7], RemoveServers)

    tampered = tmp_path / "tampered.ndjson"  # the check can fail: flip one decision
    lines = path.read_text().splitlines(keepends=True)
    record = json.loads(lines[1])
    record["outcome"]["server_id"] = "s9"
    lines[1] = json.dumps(record) + "\n"
    tampered.write_text("".join(lines))
    assert len(replay_decision_log([tampered]).divergences) == 1


def test_rotation_caps_size_and_every_kept_file_replays_alone(
    make_balancer: Any, tmp_path: Path
) -> None:
    path = tmp_path / "lb.ndjson"
    lb = make_balancer(servers=SERVERS, decision_log=str(path),
                       decision_log_max_bytes=4096, decision_log_backups=2)
    refs = []
    for i in range(300):
        refs.append(lb.acquire_server.remote(request_id=f"r{i % 40}"))
        refs.append(lb.release_server.remote(server_id=f"s{i % 3}"))
    ray.get(refs)
    files = [Path(f) for f in call(lb, "decision_log_files")]
    assert [f.name for f in files] == ["lb.ndjson.2", "lb.ndjson.1", "lb.ndjson"]
    assert all(f.stat().st_size <= 4096 for f in files)
    for single in files:
        assert replay_decision_log([single]).divergences == ()
    report = replay_decision_log(files)  # the kept files join up
    assert report.divergences == ()
    assert report.first_seq > 0  # the oldest records were rotated away
    assert report.first_seq + len(report.events) == 600


def test_returned_calls_are_on_disk_and_a_kill_loses_at_most_the_last_line(
    ray_cluster: None, make_balancer: Any, tmp_path: Path
) -> None:
    path = tmp_path / "lb.ndjson"
    lb = make_balancer(servers=SERVERS, decision_log=str(path))
    for i in range(5):
        call(lb, "acquire_server", request_id=f"r{i}")
        assert len(_records(path)) == i + 1  # flushed before the call returned

    refs = [lb.acquire_server.remote(request_id=f"x{i}") for i in range(3000)]
    ray.get(refs[:200])
    ray.kill(lb, no_restart=True)

    text = path.read_text()
    *complete, partial = text.split("\n")
    assert all(json.loads(line) for line in complete)  # every complete line is a record
    if partial:  # the kill landed mid-write: read_log reports it as truncation
        with pytest.raises(LogError, match="truncated"):
            list(read_log(path))
    intact = tmp_path / "intact.ndjson"
    intact.write_text("\n".join(complete) + "\n")
    report = replay_decision_log([intact])
    assert report.divergences == ()
    assert len(report.events) >= 5 + 200


# --------------------------------------------------------------------------------------
# One writer per path; failures reported (R-LOG-2)


def _affinity_replay(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "affinity_cli.main", "replay",
                           *map(str, paths)], capture_output=True, text=True, timeout=120,
                          check=False)


def test_a_second_actor_on_the_same_log_fails_and_the_first_log_replays_complete(
    make_balancer: Any, tmp_path: Path
) -> None:
    path = tmp_path / "lb.ndjson"
    first = make_balancer(servers=SERVERS, decision_log=str(path), seed=1)
    for i in range(10):
        call(first, "acquire_server", request_id=f"r{i % 4}")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    second = make_balancer(servers=SERVERS, decision_log=str(path))
    with pytest.raises(ray.exceptions.RayActorError) as info:
        call(second, "get_status")  # its constructor failed: the first call re-raises it
    assert f"decision log {path} is in use by another writer" in str(info.value)
    assert "held by PID" in str(info.value) and "nothing was changed" in str(info.value)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    for i in range(10):
        call(first, "release_server", server_id=f"s{i % 3}")
    assert call(first, "get_status")["decision_log_ok"] is True
    done = _affinity_replay(path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok: 20 records in 1 file(s) match the spec" in done.stdout


def test_in_one_process_too_and_a_deleted_log_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "lb.ndjson"
    lb = AffinityLoadBalancer(SERVERS, decision_log=str(path), seed=1)
    with pytest.raises(DecisionLogLocked, match="in use by another writer"):
        AffinityLoadBalancer(SERVERS, decision_log=str(path))
    lb.acquire_server("a")
    path.unlink()
    status = lb.get_status()
    assert status["decision_log_ok"] is False and status["decision_log_errors"] == 1
    assert "was deleted" in status["decision_log_problem"]
    lb.acquire_server("b")  # default: routing goes on, and the log resumes
    status = lb.get_status()
    assert status["decision_log_ok"] is True and status["decision_log_errors"] == 1
    report = replay_decision_log([path])
    assert report.divergences == () and report.first_seq == 1 and len(report.events) == 1


def test_decision_log_required_refuses_an_acquire_it_cannot_log(tmp_path: Path) -> None:
    path = tmp_path / "lb.ndjson"
    lb = AffinityLoadBalancer(SERVERS, decision_log=str(path), decision_log_required=True)
    lb.acquire_server("a")
    writer = lb._driver.decision_log
    assert writer is not None and writer._file is not None
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, writer._file.fileno())  # the next write fails with ENOSPC
    os.close(full)
    with pytest.raises(RuntimeError, match=r"decision log unavailable .*No space left"):
        lb.acquire_server("b")
    assert lb.get_total_inflight() == 1  # the refused acquire was undone
    assert lb.get_status()["decision_log_errors"] == 1
    lb.acquire_server("b")  # the log resumed with a new file: routing again
    assert lb.get_total_inflight() == 2 and lb.get_status()["decision_log_ok"] is True
    for file in (path.with_name("lb.ndjson.1"), path):
        assert replay_decision_log([file]).divergences == ()


@pytest.mark.parametrize(("options", "message"), [
    ({"decision_log_required": True}, "decision_log_required: true needs a decision_log"),
    ({"decision_log_required": "yes", "decision_log": "x"},
     "decision_log_required must be true or false, got 'yes'"),
])
def test_decision_log_required_is_validated(options: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        AffinityLoadBalancer(SERVERS, **options)
