"""The adapter against verl 0.9.1's real code: protocol shape and lockstep behaviour.

* Shape: every method of the wheel's ``RequestLoadBalancer`` Protocol and every public
  method of its ``GlobalRequestLoadBalancer`` exists here with the same parameter names
  and defaults (verl calls them with keywords), synchronously; ``acquire_server`` adds
  only PR #6122's optional ``request_group_id=None`` after verl's parameters.
* Lockstep (R-LEG-1 through the adapter): random call sequences run on the real upstream
  class and on ``AffinityLoadBalancer`` with verl's defaults side by side, in-process; every
  return value, handle and exception must be identical. Upstream's ``random.choice`` is
  replaced by a first-candidate chooser and ours uses ``tie_break="first"`` so both pick
  the same tied server; with ``full_determinism`` both use the process's ``hash()``.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Sequence
from typing import Any, TypeVar

import pytest
from affinity_verl import NO_SERVERS_MESSAGE, AffinityLoadBalancer

from affinity_conformance.upstream import (
    load_upstream_balancer,
    load_upstream_router_module,
    patched_upstream_random,
)

T = TypeVar("T")


class FirstCandidate:
    def choice(self, seq: Sequence[T]) -> T:
        return seq[0]


def _public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def _parameters(signature: inspect.Signature) -> list[tuple[str, object]]:
    # ray.remote(cls) wraps the methods of a class in place and adds a `_ray_trace_ctx`
    # keyword once any test of the session has made an actor from it.
    return [
        (p.name, p.default) for p in signature.parameters.values()
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "_ray_trace_ctx"
    ]


def test_implements_the_request_load_balancer_protocol_and_the_older_api() -> None:
    router = load_upstream_router_module()
    ours = _public_methods(AffinityLoadBalancer)
    protocol = _public_methods(router.RequestLoadBalancer)
    legacy = _public_methods(load_upstream_balancer())
    assert len(protocol) == 10 and "get_inflight_count" in legacy
    for name, signature in {**legacy, **protocol}.items():
        assert name in ours, name
        # PR #6122's group argument, optional, so verl 0.9.1's calls bind as before
        added = [("request_group_id", None)] if name == "acquire_server" else []
        assert _parameters(ours[name]) == _parameters(signature) + added, name
        assert not inspect.iscoroutinefunction(getattr(AffinityLoadBalancer, name))
    acquire = inspect.signature(AffinityLoadBalancer.acquire_server).parameters
    assert any(p.kind is p.VAR_KEYWORD for p in acquire.values())  # **extra


def test_declared_fields_and_extra_acquire_fields() -> None:
    plain = AffinityLoadBalancer(dict.fromkeys(["s0"]))
    assert plain.require_acquire_fields() == []
    assert plain.require_release_fields() == []  # legacy: counts by server_id only
    leased = AffinityLoadBalancer(dict.fromkeys(["s0"]), lease_accounting=True)
    assert leased.require_release_fields() == ["request_id"]
    # Undeclared fields a client might still send are ignored.
    assert plain.acquire_server("a", prompt_ids=[1, 2], sampling_params={})[0] == "s0"


def test_errors_keep_verl_types_and_messages() -> None:
    empty = AffinityLoadBalancer({})
    with pytest.raises(RuntimeError) as info:
        empty.acquire_server("a")
    assert str(info.value) == NO_SERVERS_MESSAGE == "No available servers in load balancer"
    deterministic = AffinityLoadBalancer(dict.fromkeys(["s0"]), full_determinism=True)
    with pytest.raises(ValueError, match="full_determinism needs a request_id"):
        deterministic.acquire_server(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="request_id must be a non-empty string"):
        empty.acquire_server("")


def _random_call(rng: random.Random, universe: list[str]) -> tuple[str, tuple[Any, ...]]:
    kind = rng.choices(
        ["acquire", "release", "add", "remove", "drain", "clear", "status", "count", "all",
         "total"],
        weights=[30, 20, 5, 5, 1, 3, 3, 3, 2, 2],
    )[0]
    if kind == "acquire":
        return "acquire_server", (f"r{rng.randrange(12)}",)
    if kind == "release":  # verl 0.9.1 may pass the request id; legacy ignores it
        request_id = rng.choice([None, f"r{rng.randrange(12)}"])
        return "release_server", (rng.choice([*universe, "unknown"]), request_id)
    if kind == "add":
        ids = rng.sample(universe, rng.randint(1, 2))
        return "add_servers", ({sid: f"handle-{sid}-{rng.randrange(100)}" for sid in ids},)
    if kind == "remove":
        return "remove_servers", (rng.sample([*universe, "unknown"], rng.randint(1, 2)),)
    if kind == "drain":  # every server at once: the next placement finds an empty pool
        return "remove_servers", (list(universe),)
    if kind == "count":
        return "get_inflight_count", (rng.choice([*universe, "unknown"]),)
    return {"clear": "clear_sticky_cache", "status": "get_status", "all": "get_all_servers",
            "total": "get_total_inflight"}[kind], ()


def _outcome(obj: Any, method: str, args: tuple[Any, ...]) -> tuple[str, Any]:
    try:
        result = getattr(obj, method)(*args)
    except Exception as exc:  # compared by type and message
        return "raised", (type(exc).__name__, str(exc))
    if method == "get_status":
        result = {k: result[k] for k in ("servers", "total_inflight", "active_servers",
                                         "registered_handles")}
    return "returned", result


@pytest.mark.parametrize("full_determinism", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_lockstep_with_the_real_upstream_class(full_determinism: bool, seed: int) -> None:
    rng = random.Random(seed)
    universe = ["s0", "s1", "s2", "s3"]
    initial = {sid: f"handle-{sid}" for sid in universe[:3]}
    upstream = load_upstream_balancer()(
        servers=dict(initial), max_cache_size=5, full_determinism=full_determinism
    )
    ours = AffinityLoadBalancer(
        dict(initial), max_cache_size=5, full_determinism=full_determinism, tie_break="first"
    )
    kinds_seen: set[str] = set()
    with patched_upstream_random(FirstCandidate()):
        for index in range(600):
            method, args = _random_call(rng, universe)
            expected = _outcome(upstream, method, args)
            actual = _outcome(ours, method, args)
            assert actual == expected, f"call {index}: {method}{args}"
            kinds_seen.add(f"{method}:{expected[0]}")
    assert "acquire_server:raised" in kinds_seen  # the empty pool was reached
    assert {"acquire_server:returned", "clear_sticky_cache:returned"} <= kinds_seen
