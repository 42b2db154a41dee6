"""affinity_vllm: ``affinity serve``, a session-sticky HTTP router in front of vLLM.

The router routes every request through :func:`affinity_engine.step` (acquire on
arrival, release when the response ends or fails), exposes Prometheus /metrics,
/status and /health, can feed vLLM's own load gauges to the core as ``ObserveLoads``
events, and writes decision logs that ``affinity replay`` checks. ``affinity_vllm.stub``
is the in-repo fake vLLM server used by the fast test tier.

Importing this package does not import aiohttp; the server modules do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .options import OptionsError, RouterOptions, normalise_backend_url, parse_margin

if TYPE_CHECKING:
    from .router import Router
    from .routing import Lease, RoutingTable
    from .stub import BlockPrefixCache, StubOptions, StubServer

__all__ = [
    "BlockPrefixCache",
    "Lease",
    "OptionsError",
    "Router",
    "RouterOptions",
    "RoutingTable",
    "StubOptions",
    "StubServer",
    "normalise_backend_url",
    "parse_margin",
]

_LAZY = {
    "Router": "router",
    "Lease": "routing",
    "RoutingTable": "routing",
    "BlockPrefixCache": "stub",
    "StubOptions": "stub",
    "StubServer": "stub",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'affinity_vllm' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)
