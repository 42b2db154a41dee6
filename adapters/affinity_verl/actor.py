"""``AffinityLoadBalancerActor``: the balancer as a Ray actor class that fails fast.

Theory of operation
-------------------
Ray creates actors asynchronously: ``ray.remote(cls).remote(...)`` returns a handle at
once and runs the constructor in a worker. If the constructor raises, the actor is dead
from birth, but the caller only sees the error on its first call -- for verl, the first
``acquire_server`` of the first rollout.

verl's router plug-in uses ``router_class`` *as is* when it already is a
``ray.actor.ActorClass``. This module builds one, ``ray.remote(AffinityLoadBalancer)``,
whose ``remote`` first parses the options in the calling process (the driver, inside
verl's ``get_router_handle``) and only then creates the actor. A bad option therefore
raises :class:`~affinity_verl.OptionError` from ``get_router_handle`` itself.

Ray is imported on first use (``affinity_verl`` does not need Ray to be imported).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from .balancer import AffinityLoadBalancer, _handles
from .options import parse_options

__all__ = ["make_actor_class", "validate_arguments"]


def validate_arguments(
    servers: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    **options: Any,
) -> None:
    """Run the constructor's validation without building a balancer."""
    parse_options(config, options, source="AffinityLoadBalancer")
    _handles(servers, "AffinityLoadBalancer")


@functools.cache
def make_actor_class() -> Any:
    """``ray.remote(AffinityLoadBalancer)`` whose ``.remote()`` validates first (cached)."""
    import ray

    actor_class = ray.remote(AffinityLoadBalancer)
    create = actor_class.remote

    def remote(*args: Any, **kwargs: Any) -> Any:
        validate_arguments(*args, **kwargs)
        return create(*args, **kwargs)

    # Only .remote() is wrapped; .options(...).remote() validates in the actor as usual.
    actor_class.remote = remote  # type: ignore[method-assign]
    return actor_class
