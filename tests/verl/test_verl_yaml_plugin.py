"""Way in (a): verl 0.9.1's router YAML plug-in, through the wheel's real ``get_router_handle``.

verl loads the YAML in the driver (``OmegaConf.load``, path resolved against the working
directory), imports ``router_class`` and creates ``Class.remote(servers, yaml_dict)``. A
bad option must fail at construction (R-CFG-1): with
``AffinityLoadBalancer`` the actor dies in its constructor and every call re-raises the
message; with ``AffinityLoadBalancerActor`` ``get_router_handle`` itself raises;
``validate_router_config`` checks the file before anything is created.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import ray
from affinity_verl import OptionError, validate_router_config
from affinity_verl.testing.driving import call

from affinity_conformance.upstream import load_upstream_router_module

HANDLES = {"replica-0": "handle-0", "replica-1": "handle-1"}
MARGIN_RANGE = "affinity_break_margin must be null or an integer >= 0"


def _write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


def test_router_yaml_builds_our_balancer(ray_cluster: None, tmp_path: Path) -> None:
    router = load_upstream_router_module()
    path = _write(tmp_path, "router.yaml",
                  "router_class: affinity_verl.AffinityLoadBalancer\nfull_determinism: false\n"
                  "affinity_break_margin: 2\ntie_break: first\nmax_cache_size: 64\n")
    lb = router.get_router_handle(dict(HANDLES), router_config_path=str(path))
    try:
        status = call(lb, "get_status")
        assert status["affinity_break_margin"] == 2 and status["tie_break"] == "first"
        assert status["policy"] == "margin"
        assert call(lb, "acquire_server", request_id="t1") == ("replica-0", "handle-0")
        assert call(lb, "acquire_server", request_id="t2") == ("replica-1", "handle-1")
    finally:
        ray.kill(lb)


def test_relative_path_resolves_against_the_working_directory(
    ray_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    router = load_upstream_router_module()
    _write(tmp_path, "rel.yaml", "router_class: affinity_verl.AffinityLoadBalancer\n"
                                 "full_determinism: false\n")
    monkeypatch.chdir(tmp_path)
    assert validate_router_config("rel.yaml").config.affinity_break_margin is None
    lb = router.get_router_handle(dict(HANDLES), router_config_path="rel.yaml")
    try:
        assert call(lb, "get_status")["policy"] == "legacy"
    finally:
        ray.kill(lb)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("affinity_break_margin: -1", f"{MARGIN_RANGE}, got -1"),
        ("affinity_break_margin: 0.5", f"{MARGIN_RANGE}, got 0.5"),
        ("affinity_break_margin: '2'", f"{MARGIN_RANGE}, got '2'"),
        ("affinity_margin: 2", "unknown option 'affinity_margin'; accepted options: "),
    ],
    ids=["negative", "fraction", "string", "typo"],
)
def test_bad_yaml_fails_at_construction(
    ray_cluster: None, tmp_path: Path, line: str, message: str
) -> None:
    router = load_upstream_router_module()
    path = _write(tmp_path, "bad.yaml",
                  "router_class: affinity_verl.AffinityLoadBalancer\n"
                  f"full_determinism: false\n{line}\n")

    with pytest.raises(OptionError, match=message):  # pre-flight, nothing created
        validate_router_config(path)

    lb = router.get_router_handle(dict(HANDLES), router_config_path=str(path))
    try:
        # The constructor already failed: the very first call (verl's client asks for the
        # declared fields first) re-raises the message, with no request involved.
        with pytest.raises(ray.exceptions.RayActorError, match=message):
            call(lb, "require_acquire_fields")
    finally:
        ray.kill(lb)

    eager = _write(tmp_path, "eager.yaml",
                   "router_class: affinity_verl.AffinityLoadBalancerActor\n"
                   f"full_determinism: false\n{line}\n")
    with pytest.raises(OptionError, match=message):  # raised in the driver, by verl's call
        router.get_router_handle(dict(HANDLES), router_config_path=str(eager))


def test_actor_class_router_works_when_valid(ray_cluster: None, tmp_path: Path) -> None:
    router = load_upstream_router_module()
    path = _write(tmp_path, "eager.yaml",
                  "router_class: affinity_verl.AffinityLoadBalancerActor\n"
                  "full_determinism: false\nseed: 3\n")
    lb = router.get_router_handle(dict(HANDLES), router_config_path=str(path))
    try:
        server_id, handle = call(lb, "acquire_server", request_id="t")
        assert HANDLES[server_id] == handle
    finally:
        ray.kill(lb)


def test_docs_yaml_examples_run(
    ray_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    doc_examples: dict[str, str],
) -> None:
    load_upstream_router_module()  # makes `from verl.workers.rollout.router import ...` work
    (tmp_path / "router.yaml").write_text(doc_examples["router.yaml"])
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(doc_examples["yaml-preflight"], namespace)
    exec(doc_examples["yaml-plugin"], namespace)
    try:
        assert call(namespace["lb"], "get_status")["total_inflight"] == 0  # released
    finally:
        ray.kill(namespace["lb"])
