"""The verl adapter's inline hot path equals its general path.

Theory of operation
-------------------
Without a decision log, and when an acquire's event is the request id alone (no draw,
no caller hash, no context band), the balancer's driver
(:class:`affinity_runtime.RoutingDriver`) steps the core inline for ``acquire_server`` /
``release_server`` instead of through its general path. Two balancers run the same
random call sequence here -- one as built, one with the inline path switched off -- and
must return the same
values, raise the same errors and hold equal core states after every call: empty pools
(a rejection that still drops a stale pin, R-ACQ-6), removed and re-added servers,
unknown servers, releases at zero and sticky hits, kept and broken.
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


@pytest.mark.parametrize("options", [
    {"affinity_break_margin": 2, "tie_break": "first", "max_cache_size": 6},
    {"affinity_break_margin": 0, "tie_break": "first", "max_cache_size": 50},
    {"max_cache_size": 4},  # legacy keep rule, verl 0.9.1's default tie-break off
])
def test_inline_path_equals_the_general_path(options: dict[str, Any]) -> None:
    servers = {f"s{i}": f"handle-{i}" for i in range(4)}
    fast = AffinityLoadBalancer(dict(servers), seed=3, **options)
    plain = AffinityLoadBalancer(dict(servers), seed=3, **options)
    plain._driver._plain_acquire = plain._driver._plain_release = False
    assert fast._driver._plain_acquire == (options.get("tie_break") == "first")
    assert fast._driver._plain_release
    rng = random.Random(16)
    acquired = 0
    for _ in range(3000):
        roll = rng.random()
        arg: tuple[Any, ...]
        if roll < 0.55:
            op, arg = "acquire_server", (f"r{rng.randrange(12)}",)
        elif roll < 0.9:
            op, arg = "release_server", (f"s{rng.randrange(6)}",)  # s4, s5: never active
        elif roll < 0.95:
            op, arg = "remove_servers", ([f"s{rng.randrange(4)}" for _ in range(2)],)
        else:
            op, arg = "add_servers", ({f"s{rng.randrange(4)}": "h"},)
        got = _call(fast, op, arg)
        assert got == _call(plain, op, arg), (op, arg)
        assert fast._driver.state == plain._driver.state, (op, arg)
        acquired += op == "acquire_server" and got[0] == "ok"
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
