"""``full_determinism`` on verl's router-YAML path is stated, never defaulted.

verl 0.9.1's ``get_router_handle(servers, router_config_path=..., full_determinism=True)``
creates a plug-in as ``Class.remote(servers, yaml_dict)``: the trainer's
``actor_rollout_ref.rollout.full_determinism`` is dropped. A balancer that defaulted the
flag reported ``full_determinism: False`` and drew random ties in a run meant to be
reproducible. The YAML must now carry the flag, and where the trainer's choice is visible
(``VERL_FULL_DETERMINISM``, which verl's ``run_ppo`` forwards to every Ray actor, or the
trainer config handed to the pre-flight check) a disagreement is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
from affinity_verl import (
    TRAINER_DETERMINISM_ENV,
    AffinityLoadBalancer,
    OptionError,
    parse_options,
    validate_router_config,
)
from affinity_verl.testing.driving import call
from omegaconf import OmegaConf

from affinity_conformance.upstream import load_upstream_router_module

HANDLES = {"replica-0": "handle-0", "replica-1": "handle-1"}
PLAIN = "affinity_verl.AffinityLoadBalancer"
EAGER = "affinity_verl.AffinityLoadBalancerActor"
MISSING = "the router YAML must set full_determinism: true or false"
DISAGREES = "disagrees with the trainer: VERL_FULL_DETERMINISM="


def _yaml(tmp_path: Path, router_class: str, extra: str = "") -> Path:
    path = tmp_path / f"router-{len(list(tmp_path.iterdir()))}.yaml"  # one file per call
    path.write_text(f"router_class: {router_class}\naffinity_break_margin: 2\n{extra}")
    return path


@pytest.fixture(autouse=True)
def _no_trainer_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRAINER_DETERMINISM_ENV, raising=False)


def test_a_router_yaml_without_full_determinism_is_refused(tmp_path: Path) -> None:
    yaml_dict = {"router_class": PLAIN, "affinity_break_margin": 2}
    with pytest.raises(OptionError, match=MISSING):
        parse_options(yaml_dict)
    with pytest.raises(OptionError, match=MISSING):
        AffinityLoadBalancer(HANDLES, yaml_dict)  # what verl's plug-in path calls
    with pytest.raises(OptionError, match=f"router config {tmp_path}.*{MISSING}"):
        validate_router_config(_yaml(tmp_path, PLAIN))
    # Keywords alone (plain Ray, the injection factory) are not the YAML path: the
    # default stays verl's own, false.
    assert parse_options(None, {"affinity_break_margin": 2}).config.full_determinism is False


def test_full_determinism_must_be_a_yaml_boolean(tmp_path: Path) -> None:
    path = _yaml(tmp_path, PLAIN, "full_determinism: 'true'\n")
    with pytest.raises(OptionError, match=r"full_determinism must be true or false, "
                                          r"got 'true' \(str\)"):
        validate_router_config(path)


@pytest.mark.parametrize(("trainer", "stated"), [("1", False), ("0", True)])
def test_a_yaml_that_disagrees_with_the_trainer_env_is_refused(
    trainer: str, stated: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    yaml_dict = {"router_class": PLAIN, "full_determinism": stated}
    wanted = "false" if stated else "true"
    message = (f"full_determinism: {str(stated).lower()} {DISAGREES}{trainer}.*"
               f"set full_determinism: {wanted} in the router YAML")
    with pytest.raises(OptionError, match=message):
        parse_options(yaml_dict, environ={TRAINER_DETERMINISM_ENV: trainer})
    monkeypatch.setenv(TRAINER_DETERMINISM_ENV, trainer)  # as run_ppo leaves it in an actor
    with pytest.raises(OptionError, match=message):
        AffinityLoadBalancer(HANDLES, yaml_dict)
    agreeing = {**yaml_dict, "full_determinism": not stated}
    assert parse_options(agreeing).config.full_determinism is (trainer == "1")


def test_preflight_compares_the_yaml_with_the_trainer_config(tmp_path: Path) -> None:
    deterministic = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"full_determinism": True}}})
    stated_false = _yaml(tmp_path, PLAIN, "full_determinism: false\n")
    with pytest.raises(OptionError, match=r"full_determinism: false disagrees with the "
                       r"trainer config's actor_rollout_ref\.rollout\.full_determinism=True"):
        validate_router_config(stated_false, deterministic)
    stated_true = _yaml(tmp_path, PLAIN, "full_determinism: true\n")
    assert validate_router_config(stated_true, deterministic).config.full_determinism is True
    # A trainer config without the key means verl's default, false.
    with pytest.raises(OptionError, match="full_determinism=False"):
        validate_router_config(stated_true, {"actor_rollout_ref": {"rollout": {}}})


def test_verl_get_router_handle_refuses_a_yaml_without_the_flag(
    ray_cluster: None, tmp_path: Path
) -> None:
    """The user's failure, through verl's own code: full_determinism=True is passed to
    get_router_handle and dropped on the way to the plug-in."""
    router = load_upstream_router_module()
    with pytest.raises(OptionError, match=MISSING):  # the actor class checks in the driver
        router.get_router_handle(dict(HANDLES), router_config_path=str(_yaml(tmp_path, EAGER)),
                                 full_determinism=True)
    lb = router.get_router_handle(dict(HANDLES), router_config_path=str(_yaml(tmp_path, PLAIN)),
                                  full_determinism=True)
    try:
        with pytest.raises(ray.exceptions.RayActorError, match=MISSING):
            call(lb, "get_status")
    finally:
        ray.kill(lb)


def test_verl_get_router_handle_honours_a_stated_flag_and_the_trainer_env(
    ray_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    router = load_upstream_router_module()
    stated = _yaml(tmp_path, PLAIN, "full_determinism: true\n")
    lb = router.get_router_handle(dict(HANDLES), router_config_path=str(stated),
                                  full_determinism=True)
    try:
        status = call(lb, "get_status")
        assert status["full_determinism"] is True
        assert status["affinity_break_margin"] == 2
    finally:
        ray.kill(lb)

    monkeypatch.setenv(TRAINER_DETERMINISM_ENV, "1")  # run_ppo, rollout.full_determinism=true
    wrong = _yaml(tmp_path, EAGER, "full_determinism: false\n")
    with pytest.raises(OptionError, match=f"{DISAGREES}1"):
        router.get_router_handle(dict(HANDLES), router_config_path=str(wrong),
                                 full_determinism=True)
