"""Every reachable state survives the codec that decision logs and vectors rely on.

``affinity replay`` compares ``state_digest`` after every logged event, and a decision log
header stores ``state_to_json``; both must work for every state the core can reach, and
``state_from_json(state_to_json(s)) == s`` (R-CODEC-1). Checked on 60 seeded traces of
every trace family (2,400 states each).
"""

from __future__ import annotations

import pytest

from affinity_conformance.trace_gen import FAMILIES, Family, SplitMix64, random_trace
from affinity_engine import initial_state, state_digest, state_from_json, state_to_json, step


@pytest.mark.parametrize("family", [pytest.param(f, id=f.name) for f in FAMILIES])
def test_reachable_states_round_trip(family: Family) -> None:
    config = family.config()
    for seed in range(60):
        state = initial_state(config, family.servers)
        for event in random_trace(family, SplitMix64(seed), 40):
            state = step(config, state, event).state
            assert len(state_digest(state)) == 64
            assert state_from_json(config, state_to_json(state)) == state
