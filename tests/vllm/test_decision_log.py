"""The router's decision log replays against the reference core, faults included.

The log (``affinity_conformance.decision_log``) has one header per file with the config
and full state, then one line per applied event with its outcome and the digest of the
state after it. Replaying means re-running ``affinity_engine.step`` from the header and
comparing every outcome and digest, in the canonical encoding of R-CODEC-1 (the
decision-log half of R-CONF-1). When the ``affinity replay`` command exists it runs too.
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from affinity_cli.main import SUBCOMMANDS
from affinity_conformance.decision_log import read_log
from affinity_engine import (
    config_from_json,
    event_from_json,
    outcome_to_json,
    state_digest,
    state_from_json,
    step,
)
from affinity_runtime.decision_log import state_summary

from .fleet import fleet, run, wait_until


def replay(path: Path) -> tuple[int, dict[str, int]]:
    """Re-run one log file with the core; returns (events, count per op)."""
    records = list(read_log(path))
    header = records[0].data
    config = config_from_json(header["config"])
    state = state_from_json(config, header["state"])
    ops: dict[str, int] = {}
    for record in records[1:]:
        event = event_from_json(record.data["event"])
        transition = step(config, state, event)
        assert outcome_to_json(transition.outcome) == record.data["outcome"], record
        assert state_summary(transition.state) == record.data["summary"], record
        if "state_digest" in record.data:  # the first record and every digest_every-th
            assert state_digest(transition.state) == record.data["state_digest"], record
        state = transition.state
        op = record.data["event"]["op"]
        ops[op] = ops.get(op, 0) + 1
    return len(records) - 1, ops


async def _workload(path: Path, max_bytes: int) -> None:
    async with fleet(2, margin=0, decision_log=str(path), decision_log_max_bytes=max_bytes,
                     health_timeout=0.3, ejection_base=0.05, stub={"delay": 0.05}) as f:
        a, b = f.router.table.servers
        await asyncio.gather(*(f.complete(f"s{i % 5}") for i in range(20)))
        await asyncio.gather(*(f.complete(None) for _ in range(5)))
        f.stub_at(a).phantom_running = 4
        await f.router.monitor.scrape_loads()
        await asyncio.gather(*(f.complete(f"s{i}") for i in range(5)))
        # the sessions moved to b (a looks busy); now b refuses: remove, retry, re-pin
        await f.stub_at(b).set_fault("refuse")
        await asyncio.gather(*(f.complete(f"s{i}") for i in range(5)))
        await f.stub_at(b).set_fault("none")
        await asyncio.sleep(0.06)  # the ejection back-off, then a passing check re-adds
        await f.router.monitor.check_health()
        await wait_until(lambda: f.router.table.is_active(b))
        await asyncio.gather(*(f.complete(f"s{i}") for i in range(5)))
        f.assert_idle()


def test_decision_log_replays_exactly(tmp_path: Path) -> None:
    path = tmp_path / "decisions.ndjson"
    run(_workload(path, 64 << 20))
    events, ops = replay(path)
    assert ops["acquire"] == ops["release"] >= 40
    assert ops["observe_loads"] == 1
    assert ops["remove_servers"] == 1 and ops["add_servers"] == 1
    assert events == sum(ops.values())
    if _replay_command_available():
        done = _affinity_replay(path)
        assert done.returncode == 0, done.stdout + done.stderr


def _replay_command_available() -> bool:
    return "replay" in SUBCOMMANDS and importlib.util.find_spec(
        SUBCOMMANDS["replay"][0]) is not None


def _affinity_replay(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "affinity_cli.main", "replay",
                           *map(str, paths)], capture_output=True, text=True, timeout=120,
                          check=False)


def test_rotated_decision_log_files_each_replay_alone(tmp_path: Path) -> None:
    path = tmp_path / "decisions.ndjson"
    run(_workload(path, 4096))
    files = sorted(tmp_path.iterdir(), key=lambda p: -int(p.suffix[1:]) if p.suffix[1:].isdigit()
                   else 0)  # oldest (highest number) first, the live file last
    assert len(files) >= 2, files  # rotated at 4 KiB
    total = 0
    for file in files:
        events, _ = replay(file)
        total += events
    assert total > 0
    if _replay_command_available():
        done = _affinity_replay(*files)
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_tampered_log_fails_replay(tmp_path: Path) -> None:
    """Negative control: the replay checks really compare outcomes."""
    path = tmp_path / "decisions.ndjson"
    run(_workload(path, 64 << 20))
    lines = path.read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if '"path":"kept"' in line)
    lines[index] = lines[index].replace('"path":"kept"', '"path":"broken"')
    path.write_text("".join(lines))
    with pytest.raises(AssertionError):
        replay(path)
    if _replay_command_available():
        assert _affinity_replay(path).returncode != 0
