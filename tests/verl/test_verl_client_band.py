"""The context band end to end through verl 0.9.1's own client (SPEC §7.5, R-BAND-1/3).

Real verl code: ``LLMServerClient`` from the installed wheel (``_acquire_server`` queries
``require_acquire_fields`` once and sends the declared fields of each ``generate`` call)
and ``get_router_handle`` (the router-YAML plug-in creates our balancer actor). Fake:
the replicas, which record where each turn ran and how many prompt ids they received.

Scenario, same for both router YAMLs: two conversations, "long" (2500-token prompts)
and "short" (10-token prompts), both first placed on r0; then a third conversation holds
two turns on r0 (its second turn is kept at load 1 <= 0 + 1), so r0 is at load 2 and r1,
r2 are idle; then each conversation plays one more turn.

* With the band (margin 1, T = 1000, cap 3) the balancer declares ``prompt_ids``, so
  verl's client sends them: "long" has band min(1 + 2500 // 1000, 3) = 3 and stays on r0
  (2 <= 0 + 3); "short" has band 1 and moves (2 > 0 + 1). The decision log shows
  ``context_tokens`` equal to the lengths each replica received.
* With margin 1 alone (the control) nothing is declared, no prompt reaches the balancer,
  and both conversations move.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import ray
from affinity_verl.testing.driving import wait_until
from affinity_verl.testing.replay import replay_decision_log
from affinity_verl.testing.replicas import FakeReplica, Served
from affinity_verl.testing.verl_client import VerlClientWorker

from affinity_conformance.upstream import load_upstream_router_module, upstream_package_dir
from affinity_engine import Acquire

REPLICAS = ("r0", "r1", "r2")
LONG, SHORT, HOG = 2500, 10, 5000  # prompt lengths in tokens
BAND_YAML = ("affinity_break_margin: 1\naffinity_break_tokens: 1000\n"
             "affinity_break_band_cap: 3\n")
MARGIN_YAML = "affinity_break_margin: 1\n"


def _run(tmp_path: Path, options_yaml: str) -> tuple[dict[str, list[Served]], dict[str, Any],
                                                     list[str], Path, tuple[str, str]]:
    log = tmp_path / "lb.ndjson"
    yaml_path = tmp_path / "router.yaml"
    yaml_path.write_text("router_class: affinity_verl.AffinityLoadBalancer\n"
                         "full_determinism: false\n"
                         f"tie_break: first\ndecision_log: {log}\n" + options_yaml)
    router = load_upstream_router_module()
    replicas = {name: FakeReplica.remote(name) for name in REPLICAS}
    handles = list(replicas.values())
    balancer = router.get_router_handle(replicas, router_config_path=str(yaml_path))
    config = {"actor_rollout_ref": {"rollout": {"name": "vllm", "full_determinism": False}}}
    worker = VerlClientWorker.remote(config, balancer)
    try:
        origin = ray.get(worker.client_origin.remote())
        fields = ray.get(balancer.require_acquire_fields.remote())
        ray.get(worker.turn.remote("long", "long", 0, prompt_len=LONG))
        ray.get(worker.turn.remote("short", "short", 0, prompt_len=SHORT))
        ray.get(worker.start_held.remote([("hog", "hog", 0), ("hog", "hog", 1)],
                                         prompt_len=HOG))
        wait_until(lambda: sum(ray.get([r.held.remote() for r in handles])) == 2,
                    "the hog's two turns are in flight")
        ray.get(worker.turn.remote("short", "short", 1, prompt_len=SHORT))
        ray.get(worker.turn.remote("long", "long", 1, prompt_len=LONG))
        ray.get([r.release_holds.remote() for r in handles])
        ray.get(worker.finish_held.remote())
        assert ray.get(worker.barrier.remote()) == 0  # every release applied
        status = ray.get(balancer.get_status.remote())
        served = [s for part in ray.get([r.served.remote() for r in handles]) for s in part]
    finally:
        for handle in (worker, balancer, *handles):
            ray.kill(handle)
    by_session: dict[str, list[Served]] = {}
    for record in sorted(served, key=lambda r: (r.session or "", r.turn or 0)):
        by_session.setdefault(record.session or "", []).append(record)
    return by_session, status, list(fields), log, origin


def _replicas(turns: list[Served]) -> list[str]:
    return [t.replica for t in turns]


@pytest.mark.parametrize("band", [True, False], ids=["band", "margin-only-control"])
def test_prompt_ids_reach_the_band_through_verls_client(
    ray_cluster: None, tmp_path: Path, band: bool
) -> None:
    served, status, fields, log, origin = _run(tmp_path, BAND_YAML if band else MARGIN_YAML)

    module_file, qualname = origin  # the client is the wheel's own
    wheel_file = upstream_package_dir() / "workers" / "rollout" / "llm_server.py"
    assert Path(module_file).resolve() == wheel_file.resolve()
    assert qualname == "LLMServerClient"

    # The replicas received the prompts in both runs (verl always sends them there).
    assert [t.prompt_len for t in served["long"]] == [LONG, LONG]
    assert [t.prompt_len for t in served["short"]] == [SHORT, SHORT]
    assert _replicas(served["hog"]) == ["r0", "r0"]
    assert _replicas(served["short"]) == ["r0", "r1"]  # band 1 either way: moved

    report = replay_decision_log([log])
    assert report.divergences == ()
    contexts = [e.context_tokens for e in report.events if isinstance(e, Acquire)]
    if band:
        assert fields == ["prompt_ids"]
        # What the balancer saw is the length verl's client was given, turn by turn.
        assert contexts == [LONG, SHORT, HOG, HOG, SHORT, LONG]
        assert _replicas(served["long"]) == ["r0", "r0"]  # kept: 2 <= 0 + 3
        assert (status["affinity_kept"], status["affinity_broken"]) == (2, 1)
        assert status["affinity_break_tokens"] == 1000
    else:
        assert fields == []
        assert contexts == [None] * 6  # nothing declared, nothing sent
        assert _replicas(served["long"]) == ["r0", "r1"]  # the margin alone moves it
        assert (status["affinity_kept"], status["affinity_broken"]) == (1, 2)
    assert status["total_inflight"] == 0
