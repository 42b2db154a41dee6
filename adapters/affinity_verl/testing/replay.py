"""Replay a balancer's decision log through the reference core.

Theory of operation
-------------------
A decision log (:mod:`affinity_conformance.decision_log`) is a sequence of files, each
opening with a header (config, full state, first ``seq``) followed by one record per
event (event, outcome, summary and periodic digest of the state after).
:func:`replay_decision_log` checks a whole log, given its files oldest first:

* every file replays alone from its header;
* the files join up: each header's ``seq`` continues the previous file and its state has
  the digest the previous file ended on (so rotation lost nothing);
* for every record, ``step`` on the replayed state gives the same outcome and the same
  state digest the balancer logged; a mismatch is a *divergence*.

This is the check ``affinity replay`` performs; it lives here so the adapter's tests can
run it in-process and inspect the final replayed state.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import attrs

from affinity_conformance.decision_log import read_log, state_summary
from affinity_core import (
    Config,
    Event,
    Outcome,
    State,
    config_from_json,
    event_from_json,
    outcome_to_json,
    state_digest,
    state_from_json,
    step,
)

__all__ = ["Observer", "ReplayReport", "replay_decision_log"]


@attrs.frozen
class ReplayReport:
    config: Config
    events: tuple[Event, ...]
    final_state: State
    first_seq: int
    divergences: tuple[str, ...]
    files: int


Observer = Callable[[Event, Outcome, State], None]


def replay_decision_log(
    paths: Sequence[str | os.PathLike[str]], observer: Observer | None = None
) -> ReplayReport:
    """Replay the log files (oldest first); see the module docstring.

    ``observer(event, outcome, state_after)`` is called for every replayed record, for
    checks that need every intermediate state.
    """
    if not paths:
        raise ValueError("replay_decision_log needs at least one file")
    divergences: list[str] = []
    events: list[Event] = []
    config: Config | None = None
    state: State | None = None
    first_seq = -1
    next_seq = 0
    for path in paths:
        records = iter(read_log(path))
        header = next(records).data
        file_config = config_from_json(header["config"])
        file_state = state_from_json(file_config, header["state"])
        if config is None:
            first_seq = next_seq = int(header["seq"])
        else:
            if file_config != config:
                divergences.append(f"{path}: header config differs from the previous file")
            if header["seq"] != next_seq:
                divergences.append(f"{path}: header seq {header['seq']}, expected {next_seq}")
            assert state is not None
            if state_digest(file_state) != state_digest(state):
                divergences.append(f"{path}: header state is not where the previous file ended")
        config, state = file_config, file_state
        for record in records:
            data = record.data
            where = f"{path}:{record.line}"
            if data["seq"] != next_seq:
                divergences.append(f"{where}: seq {data['seq']}, expected {next_seq}")
            event = event_from_json(data["event"])
            transition = step(config, state, event)
            if outcome_to_json(transition.outcome) != data["outcome"]:
                divergences.append(
                    f"{where}: outcome {data['outcome']} but the core gives "
                    f"{outcome_to_json(transition.outcome)}"
                )
            if state_summary(transition.state) != data["summary"]:
                divergences.append(f"{where}: state summary differs after {data['event']}")
            if "state_digest" in data and state_digest(transition.state) != data["state_digest"]:
                divergences.append(f"{where}: state digest differs after {data['event']}")
            state = transition.state
            if observer is not None:
                observer(event, transition.outcome, state)
            events.append(event)
            next_seq += 1
    assert config is not None and state is not None
    return ReplayReport(config, tuple(events), state, first_seq, tuple(divergences), len(paths))
