"""verl 0.9.1's real ``LLMServerClient``, run inside an async Ray actor without torch.

Theory of operation
-------------------
``verl/workers/rollout/llm_server.py`` holds the client every verl agent loop uses. Its
routing code -- ``_acquire_server`` (lazy ``require_*_fields`` query, awaited
``acquire_server.remote``), ``generate`` (fresh uuid per turn for the server, release in
``finally``) and ``_release_server`` (fire-and-forget, declared fields only) -- needs only
``ray`` and ``omegaconf``. The module's *other* imports pull in torch (worker groups,
replicas, tracking), so it cannot be imported normally here.

:func:`load_real_llm_server_module` therefore executes the real file from the installed
wheel after (1) loading verl's real router module through
:mod:`affinity_conformance.upstream` (bare package shells, no ``verl/__init__``),
(2) loading the real, dependency-free ``verl.utils.ray_utils``, and (3) registering
placeholder modules for the imports the client code path never touches:

=====================================  ===============================================
``verl.single_controller.ray.base``    worker-group classes (manager only)
``verl.utils.tracking``                ``RLInsightLogger`` (manager only)
``verl.workers.rollout.replica``       replica classes (manager only); ``TokenOutput``
                                       is only an annotation in the client
``verl.workers.rollout.utils``         ``update_prometheus_config`` (manager only)
``verl.utils.rollout_trace``           ``rollout_trace_op`` = identity, which is what the
                                       real decorator does while tracing is disabled
``verl.utils.normalize_token_ids``     used by ``FullyAsyncLLMServerClient`` only
=====================================  ===============================================

The placeholders raise if anything calls them. The load mutates ``sys.modules``, so do it
only in a dedicated process: :class:`VerlClientWorker` does it in its actor.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from affinity_conformance.upstream import load_upstream_router_module, upstream_package_dir

__all__ = ["VerlClientWorker", "VerlClientWorkerImpl", "load_real_llm_server_module"]

LLM_SERVER_MODULE = "verl.workers.rollout.llm_server"


class _NotAvailable:
    """A placeholder for verl code the client path never reaches."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"{type(self).__name__} is a placeholder in this harness")


def _unavailable(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name} is a placeholder in this harness")

    return call


def _placeholder_module(name: str, **attributes: Any) -> None:
    if name in sys.modules:
        return
    module = types.ModuleType(name, "placeholder (affinity_verl.testing.verl_client)")
    module.__dict__.update(attributes)
    if "." not in name or not attributes:
        module.__path__ = []  # a package: children may be added below it
    sys.modules[name] = module
    parent, _, leaf = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], leaf, module)


def _exec_real(name: str, path: Path) -> types.ModuleType:
    existing = sys.modules.get(name)
    if existing is not None:
        return existing
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    parent, _, leaf = name.rpartition(".")
    setattr(sys.modules[parent], leaf, module)
    return module


def load_real_llm_server_module() -> types.ModuleType:
    """The real ``verl.workers.rollout.llm_server`` (see the module docstring)."""
    existing = sys.modules.get(LLM_SERVER_MODULE)
    if existing is not None:
        return existing
    load_upstream_router_module()  # shells for verl, verl.utils, verl.workers(.rollout)
    root = upstream_package_dir()
    _exec_real("verl.utils.ray_utils", root / "utils" / "ray_utils.py")
    utils = sys.modules["verl.utils"]
    if not hasattr(utils, "normalize_token_ids"):
        utils.__dict__["normalize_token_ids"] = _unavailable("verl.utils.normalize_token_ids")
    _placeholder_module("verl.single_controller")
    _placeholder_module("verl.single_controller.ray")
    _placeholder_module(
        "verl.single_controller.ray.base",
        RayResourcePool=_NotAvailable, RayWorkerGroup=_NotAvailable,
    )
    _placeholder_module("verl.utils.rollout_trace", rollout_trace_op=lambda func: func)
    _placeholder_module("verl.utils.tracking", RLInsightLogger=_NotAvailable)
    _placeholder_module(
        "verl.workers.rollout.replica",
        RolloutReplica=_NotAvailable, TokenOutput=_NotAvailable,
        get_rollout_replica_class=_unavailable("get_rollout_replica_class"),
    )
    _placeholder_module(
        "verl.workers.rollout.utils",
        update_prometheus_config=_unavailable("update_prometheus_config"),
    )
    return _exec_real(LLM_SERVER_MODULE, root / "workers" / "rollout" / "llm_server.py")


class VerlClientWorkerImpl:
    """Stands in for verl's ``AgentLoopWorker``: owns one real ``LLMServerClient``.

    ``config`` is the trainer config as a plain dict (the client reads
    ``actor_rollout_ref.rollout.name`` and ``.full_determinism``).
    """

    def __init__(self, config: dict[str, Any], load_balancer: Any) -> None:
        from omegaconf import OmegaConf

        module = load_real_llm_server_module()
        self._client_class = module.LLMServerClient
        self._client = module.LLMServerClient(
            config=OmegaConf.create(config), load_balancer_handle=load_balancer
        )
        self._load_balancer = load_balancer
        self._held: list[asyncio.Task[Any]] = []

    async def client_origin(self) -> tuple[str, str]:
        """``(module file, class qualname)`` of the client in use: proof it is verl's."""
        module = sys.modules[self._client_class.__module__]
        return str(module.__file__), self._client_class.__qualname__

    async def turn(self, request_id: str, session: str, turn: int, hold: bool = False,
                   prompt_len: int | None = None) -> str:
        """One ``LLMServerClient.generate`` call; returns the replica that served it.

        The prompt is ``[1, 2, 3, turn]``, or ``prompt_len`` token ids when given (what a
        balancer that declares ``prompt_ids`` receives through verl's client).
        """
        prompt_ids = [1, 2, 3, turn] if prompt_len is None else [turn % 7] * prompt_len
        output = await self._client.generate(
            request_id,
            prompt_ids=prompt_ids,
            sampling_params={"session": session, "turn": turn, "hold": hold},
        )
        replica: str = output.extra_fields["replica"]
        return replica

    async def conversation(self, request_id: str, first_turn: int, turns: int) -> list[str]:
        """Turns ``first_turn .. first_turn+turns-1`` of one session, one after another."""
        return [await self.turn(request_id, request_id, t) for t in range(first_turn,
                                                                          first_turn + turns)]

    async def start_held(self, requests: list[tuple[str, str, int]],
                         prompt_len: int | None = None) -> None:
        """Start ``(request_id, session, turn)`` generate calls that the replicas hold."""
        for request_id, session, turn in requests:
            self._held.append(asyncio.ensure_future(
                self.turn(request_id, session, turn, True, prompt_len)))
        await asyncio.sleep(0)

    async def finish_held(self) -> list[str]:
        """Wait for the held calls (after the replicas released them)."""
        done, self._held = self._held, []
        return list(await asyncio.gather(*done))

    async def barrier(self) -> int:
        """An awaited call after this actor's fire-and-forget releases: Ray runs calls
        from one submitter in order, so every earlier release has been applied."""
        total: int = await self._load_balancer.get_total_inflight.remote()
        return total


VerlClientWorker: Any = ray.remote(num_cpus=0)(VerlClientWorkerImpl)
"""The Ray actor class of :class:`VerlClientWorkerImpl`."""
