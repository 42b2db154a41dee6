"""Replay a balancer's decision log in-process, for tests that inspect the replayed run.

Theory of operation
-------------------
The check itself is :func:`affinity_conformance.log_replay.replay_files`, the same code
``affinity replay`` runs: every file replays from its own header, the files of a rotated
set must join up (R-LOG-1), and every record's outcome, summary and digest must be the
reference core's. This module only collects what the adapter's tests want to look at
afterwards -- the configuration, every replayed event, the final state -- and renders the
first divergence (if any) as text. An ``observer`` sees every matching record's event,
outcome and state after it, for checks that need every intermediate state.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import attrs

from affinity_conformance.log_replay import FileResult, Observer, replay_files
from affinity_engine import Config, Event, Outcome, State

__all__ = ["Observer", "ReplayReport", "replay_decision_log"]


@attrs.frozen
class ReplayReport:
    config: Config
    events: tuple[Event, ...]
    final_state: State
    first_seq: int
    divergences: tuple[str, ...]  # empty, or the first divergence rendered
    files: int


def replay_decision_log(
    paths: Sequence[str | os.PathLike[str]], observer: Observer | None = None
) -> ReplayReport:
    """Replay the log files (oldest first); a truncated last line counts as a divergence
    here (tests want whole logs), as does a file that does not continue the one before."""
    if not paths:
        raise ValueError("replay_decision_log needs at least one file")
    events: list[Event] = []

    def collect(event: Event, outcome: Outcome, state: State) -> None:
        events.append(event)
        if observer is not None:
            observer(event, outcome, state)

    results = replay_files(paths, collect)
    problems = [p for p in map(_problem, results) if p]
    first, last = results[0], results[-1]
    assert first.config is not None and last.final_state is not None
    assert first.header_seq is not None
    return ReplayReport(first.config, tuple(events), last.final_state, first.header_seq,
                        tuple(problems), len(results))


def _problem(result: FileResult) -> str:
    if result.divergence is not None:
        return result.divergence.render()
    return f"{result.path}: {result.truncated}" if result.truncated else ""
