"""Test doubles and load generators for running the balancer under real Ray and verl.

Used by ``tests/verl`` and ``benchmarks/bench_actor.py``; importing this package imports
Ray (the rest of :mod:`affinity_verl` does not).

* :mod:`.replicas` -- ``FakeReplica``, a server actor that records which replica served
  each turn and can hold requests in flight on demand;
* :mod:`.verl_client` -- verl 0.9.1's real ``LLMServerClient`` running inside an async
  actor, loaded from the installed wheel without torch;
* :mod:`.load` -- ``SessionClient`` (verl's acquire / fire-and-forget release pattern)
  and ``PoolChurn`` (random add / remove / clear);
* :mod:`.driving` -- ``call`` and ``set_loads`` for driving a balancer actor;
* :mod:`.replay` -- replays a rotated decision log through the core in-process, checks
  that its files join up, and hands every intermediate state to an observer (the
  ``affinity replay`` command checks each file on its own).
"""

from __future__ import annotations

__all__: list[str] = []
