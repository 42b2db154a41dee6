"""``FakeReplica``: a rollout server actor that records placements.

Theory of operation
-------------------
verl's client calls ``server.generate.remote(request_id=..., prompt_ids=...,
sampling_params=..., ...)`` on the handle the balancer returned and reads
``output.extra_fields`` from the result. A fake replica answers that call and appends one
:class:`Served` record per request, so a test can compare where each turn of each
session actually ran with what the balancer's counters say.

``sampling_params`` carries the test's bookkeeping (``session``, ``turn``) because verl
replaces the request id with a fresh uuid per turn before the server sees it. With
``hold=True`` the request stays in flight -- the balancer counts it -- until
:meth:`FakeReplica.release_holds` is called; that is how a test keeps one replica busy.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import ray

__all__ = ["FakeReplica", "FakeReplicaImpl", "FakeTokenOutput", "Served"]


@dataclass
class FakeTokenOutput:
    """The fields of verl's ``TokenOutput`` that ``LLMServerClient.generate`` touches."""

    token_ids: list[int]
    extra_fields: dict[str, Any] = field(default_factory=dict)
    stop_reason: str | None = "completed"
    log_probs: list[float] | None = None
    routed_experts: Any = None
    num_preempted: int | None = None


@dataclass(frozen=True)
class Served:
    replica: str
    session: str | None
    turn: int | None
    server_request_id: str
    prompt_len: int = 0  # len(prompt_ids) as the server received them


class FakeReplicaImpl:
    """An async actor with verl's ``generate`` signature (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._served: list[Served] = []
        self._held = 0
        self._gate = asyncio.Event()

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> FakeTokenOutput:
        self._served.append(
            Served(self._name, sampling_params.get("session"), sampling_params.get("turn"),
                   request_id, len(prompt_ids))
        )
        if sampling_params.get("hold"):
            gate = self._gate
            self._held += 1
            try:
                await gate.wait()
            finally:
                self._held -= 1
        return FakeTokenOutput(token_ids=[len(prompt_ids)], extra_fields={"replica": self._name})

    async def held(self) -> int:
        """Requests currently held in flight."""
        return self._held

    async def release_holds(self) -> int:
        """Let every held request finish; returns how many were held."""
        count, gate = self._held, self._gate
        self._gate = asyncio.Event()
        gate.set()
        return count

    async def served(self) -> list[Served]:
        return list(self._served)


FakeReplica: Any = ray.remote(num_cpus=0)(FakeReplicaImpl)
"""The Ray actor class of :class:`FakeReplicaImpl`."""
