"""The canonical JSON codec (SPEC §16) for engine states.

Theory of operation
-------------------
Configurations, events and outcomes are the reference's values, so their codec is the
reference's (:mod:`affinity_core.codec`, re-exported here). A state is encoded as the
reference state it stands for (:mod:`.abstraction`), so an engine state and the reference
state it represents have the same text and the same digest.
"""

from __future__ import annotations

from affinity_core import codec as reference_codec
from affinity_core.codec import (
    JSON,
    CodecError,
    canonical_dumps,
    config_from_json,
    config_to_json,
    event_from_json,
    event_to_json,
    outcome_to_json,
)
from affinity_core.config import Config

from .abstraction import from_reference, to_reference
from .state import State

__all__ = [
    "CodecError",
    "canonical_dumps",
    "config_from_json",
    "config_to_json",
    "event_from_json",
    "event_to_json",
    "outcome_to_json",
    "state_digest",
    "state_from_json",
    "state_to_json",
]


def state_to_json(state: State) -> JSON:
    return reference_codec.state_to_json(to_reference(state))


def state_from_json(config: Config, data: object) -> State:
    """A state as a vector's ``initial_state`` describes it (validated against config)."""
    return from_reference(config, reference_codec.state_from_json(config, data))


def state_digest(state: State) -> str:
    return reference_codec.state_digest(to_reference(state))
