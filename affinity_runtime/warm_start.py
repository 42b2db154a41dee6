"""Warm restart: a writer that starts on an existing decision log continues its state.

Theory of operation
-------------------
A router or balancer that restarts on the same decision log path should not start cold:
its sticky map (which backend holds which conversation's prefix cache) and its counters
are in the log. :func:`start_log` locks the path (R-LOG-2), replays the newest file of
the old log through ``step`` -- from its header's state, every logged event, each
outcome, summary and digest checked against the core's as it goes, so a damaged or
foreign file is never trusted -- and starts the new file with a header holding the state
reached, its ``seq`` one past the old file's last record and ``"restart": {"mode":
"warm", ...}``. ``affinity replay`` then checks that this header joins the old file
exactly like a rotation does: that check is what proves the restarted state equals the
replayed state (R-LOG-3). (Runtime code does not import the checker itself,
``tests/test_runtime_layering.py``; this loop is the few lines of it a restart needs.)

The dead process's requests in flight hold leases (or, without lease accounting, counts)
in that state; nothing will ever release them. The caller applies
:attr:`Resumed.abandoned` -- one ``Release`` per open lease -- as ordinary logged events
with the reason :data:`ABANDONED`, so the new run starts with nothing in flight and the
log says why each count went down.

Why only the newest file: every file is self-contained (R-LOG-1); its header holds the
full state before its first record, so replaying it alone reaches the state the dead
writer last logged. A cut last line (a writer killed mid-record) loses that one event,
as any crash does; the state before it is still exact.

A log that cannot be replayed (malformed, diverging from the spec, another program's
file) or whose configuration differs from the new one starts *cold*: a fresh state,
``"mode": "cold"`` with the reason in the header, and an error in the log. A router that
refused to start on a bad log would turn a damaged file into an outage. The restart
header also says how the old run ended (``"previous_end"``): ``stop`` with nothing in
flight, ``crash`` with requests in flight or a cut line, ``unreplayed`` when it could not
be replayed; retention (:mod:`affinity_runtime.decision_log`) keeps the newest crash and
every unreplayed run.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import attrs

from affinity_engine import (
    CodecError,
    Config,
    ConfigError,
    Release,
    State,
    config_from_json,
    config_to_json,
    event_from_json,
    outcome_to_json,
    state_digest,
    state_from_json,
    step,
)

from .decision_log import LOG_FORMAT, DecisionLogWriter, state_summary

_MAX_LINE = 256 << 20  # as the checker: a header holds the whole state

__all__ = ["ABANDONED", "Replayed", "Resumed", "Unreplayable", "abandoned_releases",
           "replay_newest", "start_log"]

ABANDONED = "abandoned: in flight when the previous run stopped"

log = logging.getLogger("affinity_runtime.warm_start")


@attrs.frozen
class Resumed:
    """What :func:`start_log` found: the state to continue from and what to release."""

    state: State
    warm: bool
    abandoned: tuple[Release, ...] = ()
    message: str = ""


class Unreplayable(ValueError):
    """The old log is not one this writer can continue (the message says why)."""


@attrs.frozen
class Replayed:
    config: Config
    state: State
    next_seq: int
    records: int
    truncated: bool


def replay_newest(path: Path) -> Replayed:
    """Replay one log file through ``step``, checking every record; raises
    :class:`Unreplayable` naming the line and the problem. A cut last line ends it."""
    try:
        with open(path, encoding="utf-8") as handle:
            return _replay(path, handle)
    except Unreplayable:
        raise
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise Unreplayable(f"{path}: {exc}") from None


def _replay(path: Path, handle: Any) -> Replayed:
    line = handle.readline(_MAX_LINE)
    if not line.endswith("\n"):
        raise Unreplayable(f"{path}:1: no complete header line")
    header = json.loads(line)
    if not isinstance(header, dict) or header.get("format") != LOG_FORMAT:
        raise Unreplayable(f"{path}:1: not a decision log of format {LOG_FORMAT}")
    try:
        config = config_from_json(header["config"])
        state = state_from_json(config, header["state"])
    except (CodecError, ConfigError) as exc:
        raise Unreplayable(f"{path}:1: header: {exc}") from None
    seq = header["seq"]
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise Unreplayable(f"{path}:1: header seq {seq!r} is not an integer >= 0")
    records, number = 0, 1
    while line := handle.readline(_MAX_LINE):
        number += 1
        if not line.endswith("\n"):
            return Replayed(config, state, seq, records, truncated=True)
        record = json.loads(line)
        if record["seq"] != seq:
            raise Unreplayable(f"{path}:{number}: seq {record['seq']!r} where {seq} was due")
        try:
            event = event_from_json(record["event"])
        except CodecError as exc:
            raise Unreplayable(f"{path}:{number}: event: {exc}") from None
        transition = step(config, state, event)
        digest = record.get("state_digest")
        if (record["outcome"] != outcome_to_json(transition.outcome)
                or record["summary"] != state_summary(transition.state)
                or (digest is not None and digest != state_digest(transition.state))):
            raise Unreplayable(f"{path}:{number}: seq {seq} does not match the spec "
                               "(affinity replay pinpoints it)")
        state, seq, records = transition.state, seq + 1, records + 1
    return Replayed(config, state, seq, records, truncated=False)


def abandoned_releases(config: Config, state: State) -> tuple[Release, ...]:
    """One ``Release`` for every request in flight in ``state``: each open lease with
    lease accounting (stale ones included), else each count of each active server."""
    if config.lease_accounting:
        return tuple(Release(server_id=sid, request_id=rid)
                     for (rid, sid), held in state.leases.held.items()
                     for _, count in held for _ in range(count))
    return tuple(Release(server_id=sid) for sid, n in state.inflight_items()
                 for _ in range(n))


def start_log(writer: DecisionLogWriter, config: Config, fresh: State, *,
              warm: bool = True) -> Resumed:
    """Lock and start ``writer``; with ``warm``, continue from the old log at its path.

    Returns the state the caller must adopt (``fresh`` when there was nothing to
    continue) and the releases it must apply next. Raises what
    :meth:`DecisionLogWriter.lock` raises when another writer holds the path.
    """
    writer.lock()
    old = writer.path if writer.path.is_file() and writer.path.stat().st_size else None
    if old is None:
        writer.start(config, fresh)
        return Resumed(fresh, warm=False)
    restart: dict[str, Any]
    try:
        result = replay_newest(old)
    except Unreplayable as exc:
        why = f"the old log cannot be replayed ({exc})"
        restart = {"mode": "cold", "previous_end": "unreplayed", "reason": why}
        return _cold(writer, config, fresh, restart)
    state = result.state
    abandoned = abandoned_releases(result.config, state)
    end = "crash" if abandoned or result.truncated else "stop"
    next_seq = result.next_seq
    if not warm or result.config != config:
        why = ("warm start is off" if not warm else
               "the configuration changed: " + _config_change(result.config, config))
        restart = {"mode": "cold", "previous_end": end, "reason": why}
        return _cold(writer, config, fresh, restart, seq=next_seq)
    restart = {"mode": "warm", "previous_end": end, "abandoned": len(abandoned)}
    writer.start(config, state, seq=next_seq, restart=restart)
    message = (f"decision log {writer.path}: warm start from {result.records} records "
               f"of the previous run ({len(state.lru)} sticky sessions, "
               f"{len(abandoned)} requests in flight released as abandoned"
               + (", its last line was cut" if result.truncated else "") + ")")
    log.info("%s", message)
    return Resumed(state, warm=True, abandoned=abandoned, message=message)


def _cold(writer: DecisionLogWriter, config: Config, fresh: State,
          restart: dict[str, Any], *, seq: int = 0) -> Resumed:
    writer.start(config, fresh, seq=seq, restart=restart)
    message = (f"decision log {writer.path}: cold start, {restart['reason']}; the "
               f"previous run is kept as {writer.path.name}.1")
    if restart["previous_end"] == "unreplayed":
        log.error("%s", message)
    else:
        log.warning("%s", message)
    return Resumed(fresh, warm=False, message=message)


def _config_change(old: Config, new: Config) -> str:
    before, after = config_to_json(old), config_to_json(new)
    changed = sorted(k for k in {*before, *after} if before.get(k) != after.get(k))
    return ", ".join(f"{k} {before.get(k)!r} -> {after.get(k)!r}" for k in changed)
