"""Concurrency stress: 8 verl-shaped clients x 2,000 turns against one balancer actor,
with a ninth actor adding, removing and clearing at random, and the decision log on.

Each client (:class:`affinity_verl.testing.load.SessionClient`) awaits acquire and sends
release fire-and-forget, exactly like verl 0.9.1's ``LLMServerClient``; it releases with
``request_id`` iff the balancer declares it in ``require_release_fields``. The churner
(:class:`~affinity_verl.testing.load.PoolChurn`) re-adds active servers too.

At the end:

* nothing raised (any client or churn exception fails ``ray.get``);
* the whole decision log -- every rotated file -- passes ``affinity replay`` (exit 0,
  zero divergences), and the in-process replay confirms the files join up, start at seq 0
  and hold exactly one record per call that reached the balancer;
* lease mode: ``get_total_inflight() == 0``, and at *every* logged step each active
  server's count equals the requests really in flight on it since it (re)joined the pool,
  computed by an independent tracker from the client's side of the story (one request
  per id in flight, releases carry the id): drift cannot happen (R-LEASE-3, R-LEASE-5);
* legacy mode: the total is what the spec predicts for the logged event sequence,
  computed twice -- by the replayed core state, and by the independent naive model of
  upstream verl (:mod:`affinity_conformance.legacy`, R-LEG-1) -- which is where the count drift
  of hazard R-HAZ-1 (add-on-active reset, late releases after remove/re-add) shows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import ray
from affinity_verl.testing.load import PoolChurn, SessionClient
from affinity_verl.testing.replay import replay_decision_log

from affinity_conformance.legacy import LegacyModel, legacy_step
from affinity_engine import (
    Acquire,
    Acquired,
    AddServers,
    Event,
    Outcome,
    Release,
    Released,
    ReleaseResult,
    RemoveServers,
    State,
)

CLIENTS = 8
PAIRS_PER_CLIENT = 2000
INITIAL = ["s0", "s1", "s2", "s3"]
UNIVERSE = ["s0", "s1", "s2", "s3", "s4", "s5"]


class InFlightTruth:
    """What is really in flight, per server and stay in the pool -- without the core.

    Every request id has at most one turn in flight (SessionClient's contract), so a
    release names exactly the acquire it ends. A request counts on its server while the
    server is in the same stay (no remove/re-add since the acquire). Used as a replay
    observer; collects every step at which the balancer's counts disagree.
    """

    def __init__(self, servers: list[str]) -> None:
        self.stay = {s: i for i, s in enumerate(servers)}
        self.next_stay = len(servers)
        self.open: dict[str, tuple[str, int]] = {}
        self.current: Counter[str] = Counter()
        self.steps = 0
        self.stale = 0
        self.problems: list[str] = []

    def __call__(self, event: Event, outcome: Outcome, state: State) -> None:
        self.steps += 1
        if isinstance(event, Acquire) and isinstance(outcome, Acquired):
            assert event.request_id is not None and event.request_id not in self.open
            self.open[event.request_id] = (outcome.server_id, self.stay[outcome.server_id])
            self.current[outcome.server_id] += 1
        elif isinstance(event, Release):
            assert event.request_id is not None and isinstance(outcome, Released)
            server, stay = self.open.pop(event.request_id)
            assert server == event.server_id
            fresh = self.stay.get(server) == stay
            expected = ReleaseResult.APPLIED if fresh else ReleaseResult.STALE_LEASE
            if outcome.result is not expected:
                self.problems.append(f"step {self.steps}: {event} gave {outcome.result}")
            if fresh:
                self.current[server] -= 1
            else:
                self.stale += 1
        elif isinstance(event, AddServers):
            for server in event.server_ids:
                if server not in self.stay:
                    self.stay[server], self.next_stay = self.next_stay, self.next_stay + 1
        elif isinstance(event, RemoveServers):
            for server in event.server_ids:
                self.stay.pop(server, None)
                self.current.pop(server, None)
        truth = {s: self.current[s] for s in self.stay}
        if dict(state.pool.items()) != truth:
            self.problems.append(f"step {self.steps}: counts {state.loads} != {truth}")


def _legacy_total(events: tuple[Event, ...], max_cache_size: int) -> int:
    """Total in flight after ``events`` in the naive model of verl (ties as drawn)."""
    model = LegacyModel.fresh(INITIAL, max_cache_size)
    for event in events:
        model = legacy_step(model, event, ties="draw").model
    return sum(load for _, load in model.pool)


@pytest.mark.parametrize("lease_accounting", [True, False], ids=["leases", "legacy"])
def test_stress_with_churn_and_full_log_replay(
    make_balancer: Any, tmp_path: Path, lease_accounting: bool
) -> None:
    log_path = tmp_path / "decisions.ndjson"
    balancer = make_balancer(
        servers=dict.fromkeys(INITIAL),
        lease_accounting=lease_accounting,
        seed=2024,
        decision_log=str(log_path),
        decision_log_max_bytes=2 << 20,  # rotates a few times; backups keep every file
        decision_log_backups=100,
    )
    clients = [SessionClient.remote(balancer, f"c{i}", seed=i) for i in range(CLIENTS)]
    churn = PoolChurn.remote(balancer, UNIVERSE, seed=99)
    try:
        churn_done = churn.run.remote()
        results = ray.get([c.run.remote(PAIRS_PER_CLIENT) for c in clients])
        ray.get(churn.stop.remote())
        churn_counts = ray.get(churn_done)
        total = ray.get(balancer.get_total_inflight.remote())
        status = ray.get(balancer.get_status.remote())
        files = ray.get(balancer.decision_log_files.remote())
    finally:
        for actor in [*clients, churn]:
            ray.kill(actor)

    assert [r["pairs"] for r in results] == [PAIRS_PER_CLIENT] * CLIENTS
    assert sum(churn_counts.values()) > 20, churn_counts  # the pool really churned

    assert len(files) >= 2, "the log should have rotated at least once"
    replay = subprocess.run(
        [sys.executable, "-m", "affinity_cli.main", "replay", "--json", *files],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr
    checked = json.loads(replay.stdout)["files"]
    assert [f["file"] for f in checked] == files
    assert not [f for f in checked if "divergence" in f or f["truncated"]]
    truth = InFlightTruth(INITIAL)
    report = replay_decision_log(files, observer=truth if lease_accounting else None)
    assert report.divergences == ()
    assert report.first_seq == 0
    calls = 2 * CLIENTS * PAIRS_PER_CLIENT + sum(churn_counts.values())
    assert len(report.events) == calls
    assert sum(f["records"] for f in checked) == calls
    assert report.final_state.pool.total == total
    assert report.final_state.affinity_kept == status["affinity_kept"]

    if lease_accounting:
        assert total == 0
        assert truth.problems == []
        assert truth.steps == calls and not truth.open
        assert status["stale_leases"] == truth.stale > 0  # late releases did happen
        assert status["unknown_leases"] == 0
        assert all(load == 0 for load in status["servers"].values())
    else:
        assert total == _legacy_total(report.events, report.config.max_cache_size)
