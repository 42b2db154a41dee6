"""Ways in that need more than the plain class: the ``load_balancer_cls`` factory and
router-YAML pre-flight checks.

Theory of operation
-------------------
**Injection (``load_balancer_cls=``).** verl builds the routing actor as
``ray.remote(cls).remote(servers=..., max_cache_size=10000)`` and forwards
``full_determinism`` only when ``cls`` is its own ``GlobalRequestLoadBalancer``; a subclass
receives neither that flag nor any margin. :func:`balancer_class_from_config` therefore
reads the margin and ``full_determinism`` from the trainer config itself, validates them
*now* (when the config is loaded, R-CFG-1), and returns a subclass with the options
bound. Bound options take precedence over constructor keywords, because verl passes
``max_cache_size`` unconditionally.

Where the margin lives. PR #7435 adds ``actor_rollout_ref.rollout.affinity_break_margin``
to verl's schema; verl 0.9.1 has no such field. On 0.9.1 a Hydra override
``+actor_rollout_ref.rollout.affinity_break_margin=2`` composes, but verl later builds its
``RolloutConfig`` dataclass from that section (``omega_conf_to_dataclass`` in the agent
loop and rollout workers) and an unknown field fails there. 0.9.1's dataclass has an
extension point for exactly this, ``custom: Optional[dict]``, so the factory also reads
``actor_rollout_ref.rollout.custom.affinity_break_margin`` (override
``+actor_rollout_ref.rollout.custom.affinity_break_margin=2``). If both are set they must
agree. The context band's ``affinity_break_tokens`` and ``affinity_break_band_cap``
(SPEC §7.5) are read the same way, from either place.

The returned class is created inside a function, so Ray's cloudpickle ships it by value;
its base :class:`AffinityLoadBalancer` is shipped by reference (``affinity_verl`` must be
importable in the Ray workers, which an installed package is).

**Router YAML (``router_config_path``).** verl loads the YAML in the driver and creates
the actor with ``Class.remote(servers, yaml_dict)``. With ``router_class:
affinity_verl.AffinityLoadBalancer`` the options are validated in the actor's
constructor: the actor fails at creation, and every call on it re-raises the error.
verl does not pass the trainer's ``full_determinism`` on this path, so the YAML must state
it (:mod:`affinity_verl.options`). :func:`validate_router_config` runs the same validation
in the calling process, for a pre-flight check before training starts, and given the
trainer config also refuses a ``full_determinism`` that differs from the trainer's.
``router_class: affinity_verl.AffinityLoadBalancerActor`` (see :mod:`affinity_verl.actor`)
does that check inside verl's own ``get_router_handle``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .balancer import AffinityLoadBalancer
from .options import BalancerOptions, OptionError, parse_options

__all__ = [
    "ROUTER_CLASS_NAMES",
    "balancer_class_from_config",
    "load_router_config",
    "options_from_verl_config",
    "validate_router_config",
]

ROUTER_CLASS_NAMES = (
    "affinity_verl.AffinityLoadBalancer",
    "affinity_verl.AffinityLoadBalancerActor",
)
ROLLOUT_PATH = ("actor_rollout_ref", "rollout")
BAND_KEYS = ("affinity_break_tokens", "affinity_break_band_cap")  # SPEC §7.5
EXTENSION_KEYS = ("affinity_break_margin", *BAND_KEYS)  # also read from rollout.custom
VERL_CONFIG_KEYS = (*EXTENSION_KEYS, "full_determinism")
EXTENSION_SECTION = "custom"  # verl 0.9.1 RolloutConfig.custom: Optional[dict]

_MISSING = object()


def _child(node: Any, key: str) -> Any:
    """``node[key]`` for mappings (OmegaConf DictConfig included), else an attribute."""
    if isinstance(node, Mapping):
        return node.get(key, _MISSING)
    return getattr(node, key, _MISSING)


def _rollout_section(config: Any) -> Any:
    """The ``actor_rollout_ref.rollout`` section; a rollout section is accepted as is."""
    if _child(config, ROLLOUT_PATH[0]) is _MISSING:
        return config
    node = config
    for key in ROLLOUT_PATH:
        node = _child(node, key)
        if node is _MISSING:
            return {}
    return node


def options_from_verl_config(config: Any) -> dict[str, Any]:
    """The balancer options a verl trainer config sets.

    ``config`` is the root config (OmegaConf ``DictConfig`` or a plain dict) or its
    ``actor_rollout_ref.rollout`` section. Reads ``affinity_break_margin``,
    ``affinity_break_tokens`` and ``affinity_break_band_cap`` (each also as
    ``custom.<key>``) and ``full_determinism``; missing keys are left out (defaults
    apply).
    """
    if config is None:
        return {}
    rollout = _rollout_section(config)
    found: dict[str, Any] = {}
    for key in VERL_CONFIG_KEYS:
        value = _child(rollout, key)
        if value is not _MISSING:
            found[key] = value
    custom = _child(rollout, EXTENSION_SECTION)
    if custom is not _MISSING and custom is not None:
        for key in EXTENSION_KEYS:
            value = _child(custom, key)
            if value is _MISSING:
                continue
            if key in found and found[key] != value:
                raise OptionError(
                    f"actor_rollout_ref.rollout: {key}={found[key]!r} and custom.{key}="
                    f"{value!r} disagree; set one of them"
                )
            found[key] = value
    return found


def balancer_class_from_config(
    config: Any = None, /, **overrides: Any
) -> type[AffinityLoadBalancer]:
    """A balancer class for ``load_balancer_cls=`` with the config's options bound.

    Reads the margin, the band options and ``full_determinism`` (see
    :func:`options_from_verl_config`) from
    ``config``; ``overrides`` may set any other option (``tie_break``,
    ``lease_accounting``, ``decision_log``, ...) and win over the config. Raises
    :class:`OptionError` here, at config load, for a bad value.
    """
    bound = {**options_from_verl_config(config), **overrides}
    parse_options(None, bound, source="actor_rollout_ref.rollout")  # validate now

    class ConfiguredAffinityLoadBalancer(AffinityLoadBalancer):
        __doc__ = f"AffinityLoadBalancer with options {bound!r} bound by the factory."

        def __init__(
            self,
            servers: Mapping[str, Any] | None = None,
            config: Mapping[str, Any] | None = None,
            **options: Any,
        ) -> None:
            super().__init__(servers, config, **{**options, **bound})

    ConfiguredAffinityLoadBalancer.bound_options = dict(bound)  # type: ignore[attr-defined]
    return ConfiguredAffinityLoadBalancer


def _resolve(path: str | os.PathLike[str]) -> Path:
    candidate = Path(path)
    if not candidate.is_absolute():
        candidate = Path.cwd() / candidate
    if not candidate.is_file():
        raise FileNotFoundError(f"Router config file not found: {candidate}")
    return candidate


def load_router_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The YAML as verl's plug-in path loads it (OmegaConf, interpolations resolved).

    A relative path is resolved against the working directory (verl also tries its
    package root as a fallback). A file that is not valid YAML (or not UTF-8, or whose
    interpolations do not resolve) raises :class:`OptionError` naming the file and, for
    YAML, the line and column.
    """
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    full_path = _resolve(path)
    try:
        loaded = OmegaConf.to_container(OmegaConf.load(full_path), resolve=True)
    except yaml.YAMLError as exc:  # one line: the problem and where, not yaml's excerpt
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise OptionError(f"router config {full_path}: invalid YAML{at}: "
                          f"{getattr(exc, 'problem', None) or exc}") from None
    except UnicodeDecodeError as exc:
        raise OptionError(f"router config {full_path}: not UTF-8 text ({exc.reason} at "
                          f"byte {exc.start})") from None
    except OmegaConfBaseException as exc:  # an interpolation that does not resolve
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise OptionError(f"router config {full_path}: {reason}") from None
    if not isinstance(loaded, dict):
        raise OptionError(f"router config {full_path}: expected a mapping, got {loaded!r}")
    return {str(k): v for k, v in loaded.items()}


def validate_router_config(
    path: str | os.PathLike[str], trainer_config: Any = None
) -> BalancerOptions:
    """Pre-flight check of a router YAML: raises on any error verl would hit later.

    Checks that ``router_class`` names this package's balancer, that the file sets
    ``full_determinism`` and that every option is accepted and in range; returns the
    parsed options. With ``trainer_config`` (the root config or its
    ``actor_rollout_ref.rollout`` section), the file's ``full_determinism`` must also
    equal the trainer's ``actor_rollout_ref.rollout.full_determinism`` (verl's default,
    false, when the config leaves it out): verl 0.9.1 never passes that flag to a
    router plug-in, so this is the place to catch a mismatch.
    """
    data = load_router_config(path)
    source = f"router config {os.fspath(path)}"
    router_class = data.get("router_class")
    if router_class not in ROUTER_CLASS_NAMES:
        raise OptionError(
            f"{source}: router_class must be one of {', '.join(ROUTER_CLASS_NAMES)}, "
            f"got {router_class!r}"
        )
    parsed = parse_options(data, None, source=source)
    if trainer_config is not None:
        trainer = options_from_verl_config(trainer_config).get("full_determinism", False)
        if trainer != parsed.config.full_determinism:
            raise OptionError(
                f"{source}: full_determinism: {str(parsed.config.full_determinism).lower()} "
                "disagrees with the trainer config's actor_rollout_ref.rollout."
                f"full_determinism={trainer!r}; set full_determinism: "
                f"{str(trainer).lower()} in the router YAML"
            )
    return parsed
