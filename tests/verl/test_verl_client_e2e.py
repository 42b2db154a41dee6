"""End to end with verl 0.9.1's own client: LLMServerClient -> our balancer -> replicas.

What is real verl code here:

* ``LLMServerClient`` (``_acquire_server``, ``generate``, ``_release_server``), executed
  from the installed wheel's ``verl/workers/rollout/llm_server.py`` inside an async actor
  (:class:`affinity_verl.testing.verl_client.VerlClientWorker`); only imports that its
  client path never touches are placeholders (see that module);
* ``get_router_handle`` from the wheel's ``router.py``, which creates the balancer actor
  both through the YAML plug-in and through ``load_balancer_cls``.

What is fake: the rollout replicas (:class:`~affinity_verl.testing.replicas.FakeReplica`),
which record the replica that served each turn and can hold requests in flight.

Scenario (same for both configurations): six sessions start together, so least-loaded
placement spreads them two per replica; then one request id ("hog") sends three
concurrent turns that the replicas hold, which keeps one replica at load 3 while the
others are idle; then every session plays turns 1-3, one at a time. With margin None
every session stays on its replica (R-KEEP-1 never applies, R-CNT-1 counts kept hits).
With margin 2 the two sessions pinned to the busy replica move once (3 > 0 + 2,
R-BREAK-1), never back (R-BREAK-2), and ``affinity_broken`` equals the moves the
replicas recorded.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import attrs
import ray
from affinity_verl import balancer_class_from_config
from affinity_verl.testing.driving import wait_until
from affinity_verl.testing.replicas import FakeReplica, Served
from affinity_verl.testing.verl_client import VerlClientWorker
from omegaconf import OmegaConf

from affinity_conformance.upstream import load_upstream_router_module, upstream_package_dir

REPLICAS = ("r0", "r1", "r2")
SESSIONS = tuple(f"session-{i}" for i in range(6))
LATER_TURNS = 3
HOG_TURNS = 3


@attrs.frozen
class Observed:
    first: dict[str, str]  # session -> replica of its first turn
    later: dict[str, list[str]]  # session -> replicas of turns 1..3
    busy: str  # the replica the hog held
    served: list[Served]  # every request, as the replicas recorded it
    status: dict[str, Any]
    total_after: int
    client_origin: tuple[str, str]


def _run_scenario(load_balancer: Any, replicas: dict[str, Any], margin: int | None) -> Observed:
    config = {"actor_rollout_ref": {"rollout": {
        "name": "vllm", "full_determinism": False, "affinity_break_margin": margin}}}
    worker = VerlClientWorker.remote(config, load_balancer)
    handles = list(replicas.values())

    def held() -> list[int]:
        return list(ray.get([r.held.remote() for r in handles]))

    try:
        origin = ray.get(worker.client_origin.remote())
        ray.get(worker.start_held.remote([(s, s, 0) for s in SESSIONS]))
        wait_until(lambda: sum(held()) == len(SESSIONS), "all first turns are in flight")
        ray.get([r.release_holds.remote() for r in handles])
        first = dict(zip(SESSIONS, ray.get(worker.finish_held.remote()), strict=True))

        ray.get(worker.start_held.remote([("hog", "hog", t) for t in range(HOG_TURNS)]))
        wait_until(lambda: sum(held()) == HOG_TURNS, "the hog's turns are in flight")
        counts = dict(zip(replicas, held(), strict=True))
        busy = max(counts, key=lambda name: counts[name])

        later = {s: ray.get(worker.conversation.remote(s, 1, LATER_TURNS)) for s in SESSIONS}
        ray.get([r.release_holds.remote() for r in handles])
        ray.get(worker.finish_held.remote())
        total_after = ray.get(worker.barrier.remote())
        status = ray.get(load_balancer.get_status.remote())
        served = [s for part in ray.get([r.served.remote() for r in handles]) for s in part]
    finally:
        ray.kill(worker)
    return Observed(first, later, busy, served, status, total_after, origin)


def _replicas() -> dict[str, Any]:
    return {name: FakeReplica.remote(name) for name in REPLICAS}


def _placements_by_session(served: list[Served]) -> dict[str, list[str]]:
    by_session: dict[str, list[tuple[int, str]]] = {}
    for record in served:
        assert record.session is not None and record.turn is not None
        by_session.setdefault(record.session, []).append((record.turn, record.replica))
    return {s: [replica for _, replica in sorted(turns)] for s, turns in by_session.items()}


def _moves(placements: list[str]) -> int:
    return sum(a != b for a, b in itertools.pairwise(placements))


def _check_common(observed: Observed) -> dict[str, list[str]]:
    module_file, qualname = observed.client_origin
    wheel_file = upstream_package_dir() / "workers" / "rollout" / "llm_server.py"
    assert Path(module_file).resolve() == wheel_file.resolve()
    assert qualname == "LLMServerClient"

    assert sorted(observed.first.values()) == sorted(REPLICAS * 2)  # least-loaded spread
    hog = [r for r in observed.served if r.session == "hog"]
    assert [r.replica for r in hog] == [observed.busy] * HOG_TURNS  # held together: kept

    placements = _placements_by_session(observed.served)
    for session in SESSIONS:  # what the client saw is what the replicas recorded
        assert placements[session] == [observed.first[session], *observed.later[session]]
    # verl sends the server a fresh uuid per turn, never the sticky request id.
    assert all(r.server_request_id not in (*SESSIONS, "hog") for r in observed.served)

    hits = sum(len(p) - 1 for p in placements.values())  # sticky hits on active servers
    status = observed.status
    assert status["affinity_kept"] + status["affinity_broken"] == hits  # R-CNT-1
    assert status["affinity_broken"] == sum(_moves(p) for p in placements.values())
    assert observed.total_after == 0 and status["total_inflight"] == 0
    return placements


def test_margin_none_keeps_every_conversation_on_one_replica(
    ray_cluster: None, tmp_path: Path
) -> None:
    router = load_upstream_router_module()
    yaml_path = tmp_path / "router.yaml"
    yaml_path.write_text("router_class: affinity_verl.AffinityLoadBalancer\n"
                         "full_determinism: false\nseed: 11\n")
    replicas = _replicas()
    load_balancer = router.get_router_handle(replicas, router_config_path=str(yaml_path))
    try:
        observed = _run_scenario(load_balancer, replicas, margin=None)
    finally:
        ray.kill(load_balancer)
        for handle in replicas.values():
            ray.kill(handle)

    placements = _check_common(observed)
    assert observed.status["affinity_break_margin"] is None
    assert observed.status["policy"] == "legacy"
    for session in SESSIONS:
        assert placements[session] == [observed.first[session]] * (1 + LATER_TURNS)
    assert observed.status["affinity_broken"] == 0
    assert observed.status["affinity_kept"] == len(SESSIONS) * LATER_TURNS + HOG_TURNS - 1


def test_margin_two_moves_sessions_off_the_busy_replica(ray_cluster: None) -> None:
    router = load_upstream_router_module()
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "name": "vllm", "full_determinism": False}}})
    OmegaConf.set_struct(config, True)
    OmegaConf.update(config, "actor_rollout_ref.rollout.affinity_break_margin", 2,
                     force_add=True)  # what the Hydra override +...affinity_break_margin=2 does
    balancer_cls = balancer_class_from_config(config, seed=11)
    replicas = _replicas()
    load_balancer = router.get_router_handle(replicas, load_balancer_cls=balancer_cls)
    try:
        observed = _run_scenario(load_balancer, replicas, margin=2)
    finally:
        ray.kill(load_balancer)
        for handle in replicas.values():
            ray.kill(handle)

    placements = _check_common(observed)
    assert observed.status["affinity_break_margin"] == 2
    moved = [s for s in SESSIONS if observed.first[s] == observed.busy]
    assert len(moved) == 2
    for session in SESSIONS:
        later = observed.later[session]
        if session in moved:  # broken once at its second turn, then kept on the new pin
            assert later[0] != observed.busy
            assert later == [later[0]] * LATER_TURNS
        else:
            assert later == [observed.first[session]] * LATER_TURNS
        assert _moves(placements[session]) == (1 if session in moved else 0)
    assert observed.status["affinity_broken"] == len(moved)
    assert observed.status["affinity_kept"] == (
        len(SESSIONS) * LATER_TURNS + HOG_TURNS - 1 - len(moved)
    )
