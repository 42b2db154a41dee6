"""Warm restart: a writer that starts on an existing decision log continues its state.

Theory of operation
-------------------
A router or balancer that restarts on the same decision log path should not start cold:
its sticky map (which backend holds which conversation's prefix cache) and its counters
are in the log. :func:`start_log` locks the path (R-LOG-2), replays the newest file of
the old log through ``step`` -- the very replay ``affinity replay`` runs
(:func:`affinity_conformance.log_replay.replay_file`), so the restarted state *is* the
replayed state, by construction (R-LOG-3) -- and starts the new file with a header
holding that state, its ``seq`` one past the old file's last record and
``"restart": {"mode": "warm", ...}``. Replay checks that header joins the old file like
a rotation does.

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

import logging
from typing import Any

import attrs

from affinity_core import Config, Release, State, config_to_json

from .decision_log import DecisionLogWriter

__all__ = ["ABANDONED", "Resumed", "abandoned_releases", "start_log"]

ABANDONED = "abandoned: in flight when the previous run stopped"

log = logging.getLogger("affinity_runtime.warm_start")


@attrs.frozen
class Resumed:
    """What :func:`start_log` found: the state to continue from and what to release."""

    state: State
    warm: bool
    abandoned: tuple[Release, ...] = ()
    message: str = ""


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
    from affinity_conformance.log_replay import LogError, replay_file

    restart: dict[str, Any]
    try:
        result = replay_file(old)
    except (LogError, OSError) as exc:
        why = f"the old log cannot be replayed ({exc})"
        restart = {"mode": "cold", "previous_end": "unreplayed", "reason": why}
        return _cold(writer, config, fresh, restart)
    if result.divergence is not None or result.final_state is None or result.config is None:
        where = "" if result.divergence is None else f": {result.divergence.problem}"
        why = f"the old log does not replay against the spec{where}"
        restart = {"mode": "cold", "previous_end": "unreplayed", "reason": why}
        return _cold(writer, config, fresh, restart)
    state = result.final_state
    abandoned = abandoned_releases(result.config, state)
    end = "crash" if abandoned or result.truncated else "stop"
    next_seq = result.next_seq if result.next_seq is not None else 0
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
