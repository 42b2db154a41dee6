"""Way in (b): ``load_balancer_cls=`` injection with the config-reading factory.

verl 0.9.1's real ``get_router_handle(servers, load_balancer_cls=cls)`` creates
``ray.remote(cls).remote(servers=..., max_cache_size=10000)`` and does not forward
``full_determinism`` to a class that is not its own. The factory reads the margin and
``full_determinism`` from the trainer config -- here verl 0.9.1's own generated trainer
config from the wheel, in OmegaConf struct mode as Hydra hands it over -- and validates
them when it runs (R-CFG-1).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import ray
from affinity_verl import OptionError, balancer_class_from_config, options_from_verl_config
from affinity_verl.testing.driving import call
from omegaconf import DictConfig, OmegaConf

from affinity_conformance.upstream import load_upstream_router_module, upstream_package_dir

SERVERS = {"replica-0": None, "replica-1": None}
MARGIN = "actor_rollout_ref.rollout.affinity_break_margin"
CUSTOM_MARGIN = "actor_rollout_ref.rollout.custom.affinity_break_margin"


def _verl_trainer_config() -> DictConfig:
    path = upstream_package_dir() / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    config = OmegaConf.load(path)
    assert isinstance(config, DictConfig)
    OmegaConf.set_struct(config, True)  # Hydra composes configs in struct mode
    return config


def _hydra_append(config: DictConfig, key: str, value: object) -> None:
    """What the Hydra override ``+key=value`` does: add a key the schema lacks."""
    OmegaConf.update(config, key, value, force_add=True)


def test_verl_091_schema_has_custom_but_not_the_margin() -> None:
    rollout = _verl_trainer_config().actor_rollout_ref.rollout
    assert "full_determinism" in rollout and "router_config_path" in rollout
    assert "affinity_break_margin" not in rollout and "custom" not in rollout
    with pytest.raises(Exception, match="not in struct"):  # so the override needs a `+`
        OmegaConf.update(_verl_trainer_config(), MARGIN, 2)

    # RolloutConfig (built from this section by omega_conf_to_dataclass) has the
    # `custom: Optional[dict]` extension point and no margin field in 0.9.1.
    source = upstream_package_dir() / "workers" / "config" / "rollout.py"
    tree = ast.parse(source.read_text())
    rollout_class = next(node for node in tree.body
                         if isinstance(node, ast.ClassDef) and node.name == "RolloutConfig")
    fields = {node.target.id for node in rollout_class.body
              if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
    assert "custom" in fields and "full_determinism" in fields
    assert "affinity_break_margin" not in fields


@pytest.mark.parametrize("key", [CUSTOM_MARGIN, MARGIN], ids=["custom", "pr7435"])
def test_factory_reads_the_hydra_override(key: str) -> None:
    config = _verl_trainer_config()
    _hydra_append(config, key, 2)
    assert options_from_verl_config(config) == {
        "affinity_break_margin": 2, "full_determinism": False}
    assert options_from_verl_config(config.actor_rollout_ref.rollout)["affinity_break_margin"] == 2
    assert options_from_verl_config({}) == {} and options_from_verl_config(None) == {}


def test_both_margin_keys_must_agree() -> None:
    config = _verl_trainer_config()
    _hydra_append(config, MARGIN, 2)
    _hydra_append(config, CUSTOM_MARGIN, 3)
    with pytest.raises(OptionError, match="disagree"):
        balancer_class_from_config(config)


@pytest.mark.parametrize("bad", [-1, 1.5, "two"])
def test_bad_margin_fails_when_the_config_is_loaded(bad: Any) -> None:
    config = _verl_trainer_config()
    _hydra_append(config, CUSTOM_MARGIN, bad)
    with pytest.raises(OptionError, match=f"affinity_break_margin .*got {bad!r}"):
        balancer_class_from_config(config)
    with pytest.raises(OptionError, match="unknown option 'margin'"):
        balancer_class_from_config(None, margin=2)


def test_get_router_handle_with_the_injected_class(ray_cluster: None) -> None:
    router = load_upstream_router_module()
    config = _verl_trainer_config()
    _hydra_append(config, CUSTOM_MARGIN, 2)
    OmegaConf.update(config, "actor_rollout_ref.rollout.full_determinism", True)
    balancer_cls = balancer_class_from_config(config, hash_mode="stable", lease_accounting=True)
    # verl passes full_determinism=False here; our class takes it from the config instead.
    lb = router.get_router_handle(dict(SERVERS), full_determinism=False,
                                  load_balancer_cls=balancer_cls)
    try:
        status = call(lb, "get_status")
        assert status["affinity_break_margin"] == 2
        assert status["full_determinism"] is True and status["hash_mode"] == "stable"
        assert call(lb, "require_release_fields") == ["request_id"]
        placed = {call(lb, "acquire_server", request_id=f"r{i}")[0] for i in range(8)}
        assert placed <= set(SERVERS)
    finally:
        ray.kill(lb)


def test_docs_injection_example_runs(
    ray_cluster: None, doc_examples: dict[str, str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    load_upstream_router_module()
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(doc_examples["injection"], namespace)
    ray.kill(namespace["lb"])
    assert namespace["balancer_cls"].bound_options == {
        "affinity_break_margin": 2, "full_determinism": False}
