"""affinity_verl: bounded sticky routing for verl 0.9.1 with one line of config.

Three ways in (docs/verl.md has copy-paste examples):

* verl's router YAML: ``router_class: affinity_verl.AffinityLoadBalancer``,
  ``full_determinism`` (required there: verl does not pass it) and other options;
* ``load_balancer_cls=balancer_class_from_config(config)`` for ``LLMServerManager`` or
  ``get_router_handle``;
* ``ray.remote(AffinityLoadBalancer).remote(servers=..., affinity_break_margin=2)``.

All routing decisions are made by :func:`affinity_engine.step`; this package only adapts
verl's calls to core events and the outcomes back to verl's return values and errors.
"""

from __future__ import annotations

from typing import Any

from affinity_engine import NO_SERVERS_MESSAGE

from .balancer import AffinityLoadBalancer
from .factory import (
    ROUTER_CLASS_NAMES,
    balancer_class_from_config,
    load_router_config,
    options_from_verl_config,
    validate_router_config,
)
from .options import (
    ACCEPTED_KEYS,
    DEFAULT_TIE_BREAK,
    TRAINER_DETERMINISM_ENV,
    BalancerOptions,
    OptionError,
    parse_options,
)

__all__ = [
    "ACCEPTED_KEYS",
    "DEFAULT_TIE_BREAK",
    "NO_SERVERS_MESSAGE",
    "ROUTER_CLASS_NAMES",
    "TRAINER_DETERMINISM_ENV",
    "AffinityLoadBalancer",
    "AffinityLoadBalancerActor",
    "BalancerOptions",
    "OptionError",
    "balancer_class_from_config",
    "load_router_config",
    "options_from_verl_config",
    "parse_options",
    "validate_router_config",
]


def __getattr__(name: str) -> Any:
    # AffinityLoadBalancerActor needs Ray; build it only when someone asks for it.
    if name == "AffinityLoadBalancerActor":
        from .actor import make_actor_class

        return make_actor_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
