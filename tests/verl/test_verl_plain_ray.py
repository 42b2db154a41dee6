"""Way in (c): ``ray.remote(AffinityLoadBalancer).remote(servers=..., affinity_break_margin=...)``.

For scripts and other frameworks: keyword options, real actor handles passed through,
and the copy-paste example from docs/verl.md.
"""

from __future__ import annotations

from typing import Any

import pytest
import ray
from affinity_verl import AffinityLoadBalancer
from affinity_verl.testing.driving import call
from affinity_verl.testing.replicas import FakeReplica


def test_keyword_options_and_real_handles(ray_cluster: None) -> None:
    replicas = {name: FakeReplica.remote(name) for name in ("a", "b")}
    lb = ray.remote(AffinityLoadBalancer).options(num_cpus=0).remote(
        servers=replicas, affinity_break_margin=0, tie_break="hashed", seed=1
    )
    try:
        status = call(lb, "get_status")
        assert (status["affinity_break_margin"], status["tie_break"]) == (0, "hashed")
        server_id, handle = call(lb, "acquire_server", request_id="conv")
        output = ray.get(handle.generate.remote(
            request_id="x", prompt_ids=[1], sampling_params={"session": "conv", "turn": 0}))
        assert output.extra_fields["replica"] == server_id  # the handle is that replica's
    finally:
        for actor in [lb, *replicas.values()]:
            ray.kill(actor)


def test_bad_keyword_fails_at_creation(make_balancer: Any) -> None:
    lb = make_balancer(servers={"a": None}, tie_break="random")
    with pytest.raises(ray.exceptions.RayActorError,
                       match="tie_break must be one of 'first', 'draw', 'hashed', got 'random'"):
        call(lb, "get_status")


def test_docs_plain_ray_example_runs(
    ray_cluster: None, doc_examples: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    namespace: dict[str, Any] = {}
    exec(doc_examples["plain-ray"], namespace)
    try:
        assert "'affinity_break_margin': 2" in capsys.readouterr().out
        assert call(namespace["lb"], "get_total_inflight") == 0
    finally:
        ray.kill(namespace["lb"])
