"""The verl adapter's hot path equals its general path.

Theory of operation
-------------------
Without a decision log, and when an acquire's event is the request id alone (no draw,
no caller hash, no context band, no group pins or prefix placement), the balancer binds
``acquire_server`` / ``release_server`` to the engine's
:class:`affinity_engine.cursor.KeyedBalancer` on its driver's cursor, and the driver
(:class:`affinity_runtime.RoutingDriver`) steps that cursor directly instead of through
its general path. Two balancers run the same random call sequence here -- one as built,
one with both shortcuts switched off (its class's own methods, and the driver's inline
path) -- and must return the same values, raise the same errors and hold equal core
states after every call: empty pools (a rejection that still drops a stale pin,
R-ACQ-6), removed and re-added servers (with new handles), unknown servers, malformed
ids, releases at zero and sticky hits, kept and broken.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from affinity_verl import AffinityLoadBalancer


def _call(lb: AffinityLoadBalancer, op: str, arg: Any) -> tuple[str, Any]:
    try:
        return "ok", getattr(lb, op)(*arg)
    except (RuntimeError, ValueError, TypeError) as exc:
        return type(exc).__name__, str(exc)


def _call_with_extra(lb: AffinityLoadBalancer, op: str, arg: Any) -> tuple[str, Any]:
    try:
        return "ok", lb.acquire_server(*arg, prompt_ids=[1, 2], cached_prefix={"s0": 1})
    except (RuntimeError, ValueError, TypeError) as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("options", [
    {"affinity_break_margin": 2, "tie_break": "first", "max_cache_size": 6},
    {"affinity_break_margin": 0, "tie_break": "first", "max_cache_size": 50},
    {"max_cache_size": 4},  # legacy keep rule, verl 0.9.1's default tie-break off
])
def test_inline_path_equals_the_general_path(options: dict[str, Any]) -> None:
    servers = {f"s{i}": f"handle-{i}" for i in range(4)}
    fast = AffinityLoadBalancer(dict(servers), seed=3, **options)
    plain = AffinityLoadBalancer(dict(servers), seed=3, **options)
    keyed = options.get("tie_break") == "first"  # no draw: the id alone is the event
    assert ("acquire_server" in vars(plain)) is keyed
    assert ("release_server" in vars(plain)) is keyed
    if keyed:
        del plain.acquire_server, plain.release_server  # back to the class's methods
    plain._driver._plain_acquire = plain._driver._plain_release = False
    assert fast._driver._plain_acquire is keyed
    assert fast._driver._plain_release
    rng = random.Random(16)
    acquired = 0
    for _ in range(3000):
        roll = rng.random()
        arg: tuple[Any, ...]
        if roll < 0.53:
            op, arg = "acquire_server", (f"r{rng.randrange(12)}",)
        elif roll < 0.54:  # a group id, which neither path reads without group pins
            op, arg = "acquire_server", (f"r{rng.randrange(12)}", "g")
        elif roll < 0.55:  # extra fields, which neither path reads here
            op, arg = "acquire_extra", (f"r{rng.randrange(12)}",)
        elif roll < 0.56:  # malformed: an empty id, a non-str id
            op, arg = "acquire_server", (rng.choice(["", 7, None]),)
        elif roll < 0.88:
            op, arg = "release_server", (f"s{rng.randrange(6)}",)  # s4, s5: never active
        elif roll < 0.9:  # a request id, which neither path reads without leases; bad ids
            op, arg = "release_server", rng.choice([("s1", "r1"), (3,), ("",), ("s2", 4)])
        elif roll < 0.95:
            op, arg = "remove_servers", ([f"s{rng.randrange(4)}" for _ in range(2)],)
        else:
            op, arg = "add_servers", ({f"s{rng.randrange(4)}": f"h{rng.randrange(9)}"},)
        call = _call_with_extra if op == "acquire_extra" else _call
        got = call(fast, op, arg)
        assert got == call(plain, op, arg), (op, arg)
        assert fast._driver.state == plain._driver.state, (op, arg)
        acquired += op.startswith("acquire") and got[0] == "ok"
    assert acquired > 500  # the sequence exercised the hot path
    assert fast.get_status() == plain.get_status()


def test_inline_path_is_off_when_the_event_needs_more_than_the_id(tmp_path: Any) -> None:
    draw = AffinityLoadBalancer(["s0"], tie_break="draw")
    band = AffinityLoadBalancer(["s0"], affinity_break_margin=1, affinity_break_tokens=100,
                                affinity_break_band_cap=3)
    logged = AffinityLoadBalancer(["s0"], tie_break="first",
                                  decision_log=str(tmp_path / "d.ndjson"))
    drivers = draw._driver, band._driver, logged._driver
    assert not any(d._plain_acquire for d in drivers)
    assert [d._plain_release for d in drivers] == [True, True, False]
    assert logged.acquire_server("a")[0] == "s0"
    logged.release_server("s0")
    assert len(logged.decision_log_files()) == 1


def test_a_subclass_that_overrides_the_calls_keeps_its_own() -> None:
    class Counting(AffinityLoadBalancer):
        acquired = 0

        def acquire_server(self, request_id: str, request_group_id: str | None = None,
                           **extra: Any) -> tuple[str, Any]:
            self.acquired += 1
            return super().acquire_server(request_id, request_group_id, **extra)

    lb = Counting({"s0": "h0"}, tie_break="first")
    assert "acquire_server" not in vars(lb) and "release_server" not in vars(lb)
    assert lb.acquire_server("a") == ("s0", "h0") and lb.acquired == 1
    lb.release_server("s0")
    assert lb.get_inflight_count("s0") == 0
    bound = AffinityLoadBalancer({"s0": "h0"}, tie_break="first")
    assert "acquire_server" in vars(bound) and "release_server" in vars(bound)
