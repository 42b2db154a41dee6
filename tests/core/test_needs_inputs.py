"""Where the core reads an acquire's tie draw and request hash (R-TIE-5, R-DET-5).

``needs_draw`` / ``needs_request_hash`` (reference and engine) say the field is unread;
then two events differing only in that field must give the same transition, on random
states. Negative control: a predicate that always says "unread" is refuted.
"""

from __future__ import annotations

import random

import affinity_core
import affinity_engine
from affinity_core import Acquire, Config, Release, initial_state, step

CONFIGS = [Config(tie_break=t) for t in ("first", "draw", "hashed")] + [
    Config(full_determinism=True, hash_mode=h, tie_break="draw") for h in ("caller", "stable")]


def _violations(needs_draw, needs_hash) -> int:  # type: ignore[no-untyped-def]
    rng = random.Random(5)
    bad = 0
    for config in CONFIGS:
        state = initial_state(config, ["a", "b", "c", "d"])
        for _ in range(300):
            rid = rng.choice([None, "r1", "r2", "r3"])
            if config.full_determinism and rid is None:
                rid = "r0"
            base = Acquire(request_id=rid, tie_draw=0, request_hash=7)
            other = Acquire(request_id=rid, tie_draw=rng.randrange(1, 9), request_hash=7)
            if not needs_draw(config, rid):
                bad += step(config, state, base) != step(config, state, other)
            hashed = Acquire(request_id=rid, tie_draw=0, request_hash=rng.randrange(1, 99))
            if not needs_hash(config):
                bad += step(config, state, base) != step(config, state, hashed)
            state = step(config, state, base).state
            if rng.random() < 0.5:
                state = step(config, state, Release(server_id=rng.choice("abcd"))).state
    return bad


def test_unread_fields_do_not_change_the_transition() -> None:
    assert _violations(affinity_core.needs_draw, affinity_core.needs_request_hash) == 0


def test_negative_control_an_always_unread_predicate_is_refuted() -> None:
    assert _violations(lambda c, r: False, lambda c: False) > 0


def test_engine_agrees_with_the_reference() -> None:
    for config in CONFIGS:
        for rid in (None, "r"):
            assert affinity_engine.needs_draw(config, rid) == affinity_core.needs_draw(config, rid)
        engine, reference = affinity_engine, affinity_core
        assert engine.needs_request_hash(config) == reference.needs_request_hash(config)
