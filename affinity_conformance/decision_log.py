"""NDJSON decision logs: what an adapter decided, in a form ``affinity replay`` checks.

Theory of operation
-------------------
A log is a sequence of files; each file is self-contained (R-LOG-1):

* line 1, the header: ``{"format": "affinity-log/1", "config": {...}, "state": {...},
  "seq": n}`` -- the configuration and the full state *before* event ``n``, in the
  canonical codec of :mod:`affinity_core.codec`;
* every further line: ``{"seq": n, "event": {...}, "outcome": {...}, "summary": {...}}``
  -- the event the adapter applied, the outcome it acted on, and a constant-size summary
  of the state after it (``inflight_total``, ``affinity_kept``, ``affinity_broken``,
  ``sticky_entries``);
* on the first record of every file and then every ``digest_every`` records, also
  ``"state_digest"``: the SHA-256 of the canonical JSON of the whole state after it.

Why not a digest on every line: the full digest serializes the whole sticky map, so it
costs time linear in the sticky entries; on every decision that made the log dominate the
balancer (tens of milliseconds per call at 10k entries). The summary is O(1), and the
periodic digest bounds how long a silent divergence of the sticky map can go unnoticed.

Replaying a file means: decode the header, then for every line apply ``event`` with the
reference core and compare the outcome, the summary and, where present, the digest
(:func:`read_log` yields the decoded records; the comparison lives in
:mod:`affinity_conformance.log_replay`).

Durability: each record is one ``write`` of one complete line followed by ``flush``, so
a crash can lose or truncate at most the last line, and a reader reports a truncated
last line as truncation rather than as corruption. Size cap: when a file would exceed
``max_bytes`` it is rotated (``log.1`` ... ``log.K``, oldest dropped) and the new file
starts with a fresh header holding the current state, so every kept file replays alone.
Restarts: a writer that starts where a log already exists (a restarted actor or router
given the same path) rotates the old file away first instead of overwriting it, so the
previous run's log survives as ``log.1``; its new header (``seq`` 0, a fresh state) does
not continue the old file, and ``affinity replay`` says so at that header.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import attrs

from affinity_core import (
    Config,
    Event,
    Outcome,
    State,
    canonical_dumps,
    config_to_json,
    event_to_json,
    outcome_to_json,
    state_digest,
    state_to_json,
)

__all__ = [
    "DEFAULT_DIGEST_EVERY",
    "LOG_FORMAT",
    "DecisionLogWriter",
    "LogError",
    "LogRecord",
    "read_log",
    "state_summary",
]

LOG_FORMAT = "affinity-log/1"
DEFAULT_DIGEST_EVERY = 1024


def state_summary(state: State) -> dict[str, int]:
    """The constant-size part of a state every record carries."""
    return {
        "inflight_total": state.inflight_total,
        "affinity_kept": state.affinity_kept,
        "affinity_broken": state.affinity_broken,
        "sticky_entries": len(state.lru),
    }


class LogError(ValueError):
    """A decision log line is malformed; the message names the file and line."""


@attrs.frozen
class LogRecord:
    line: int
    data: dict[str, Any]
    is_header: bool


class DecisionLogWriter:
    """Appends one canonical JSON line per event; rotates by size."""

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = 64 << 20,
                 backups: int = 3, digest_every: int = DEFAULT_DIGEST_EVERY) -> None:
        if max_bytes < 4096:
            raise ValueError(f"decision log max_bytes must be >= 4096, got {max_bytes}")
        if backups < 0:
            raise ValueError(f"decision log backups must be >= 0, got {backups}")
        if digest_every < 1:
            raise ValueError(f"decision log digest_every must be >= 1, got {digest_every}")
        self.digest_every = digest_every
        self._since_digest = 0
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self._file: IO[str] | None = None
        self._size = 0
        self._seq = 0

    def start(self, config: Config, state: State) -> None:
        """Open a fresh log file whose header holds ``state``; an existing non-empty
        file at the path (an earlier run's log) is rotated away, never overwritten."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self._file is None and self.path.is_file() and self.path.stat().st_size > 0:
            self._rotate()
        self._open_new(config, state)

    def _open_new(self, config: Config, state: State) -> None:
        if self._file is not None:
            self._file.close()
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (kept open)
        self._size = 0
        self._since_digest = 0  # the first record of every file carries a full digest
        header = {"format": LOG_FORMAT, "config": config_to_json(config),
                  "state": state_to_json(state), "seq": self._seq}
        self._write_line(canonical_dumps(header))

    def _write_line(self, text: str) -> None:
        assert self._file is not None
        line = text + "\n"
        self._file.write(line)
        self._file.flush()
        self._size += len(line.encode("utf-8"))

    def record(self, config: Config, pre: State, event: Event, outcome: Outcome,
               post: State) -> None:
        """Log one applied event (``pre`` is needed only when the file rotates)."""
        if self._file is None:
            self.start(config, pre)
        record: dict[str, Any] = {
            "seq": self._seq, "event": event_to_json(event),
            "outcome": outcome_to_json(outcome), "summary": state_summary(post),
        }
        if self._since_digest % self.digest_every == 0:
            record["state_digest"] = state_digest(post)
        line = canonical_dumps(record)
        if self._size + len(line) + 1 > self.max_bytes:
            self._rotate()
            self._open_new(config, pre)
            if "state_digest" not in record:
                record["state_digest"] = state_digest(post)
                line = canonical_dumps(record)
        self._write_line(line)
        self._seq += 1
        self._since_digest += 1

    def _rotate(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
            return
        for i in range(self.backups, 0, -1):
            src = self.path if i == 1 else self.path.with_name(f"{self.path.name}.{i - 1}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i}"))

    def files(self) -> list[Path]:
        """Existing log files, oldest first."""
        rotated = [self.path.with_name(f"{self.path.name}.{i}")
                   for i in range(self.backups, 0, -1)]
        return [p for p in [*rotated, self.path] if p.exists()]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_log(path: str | os.PathLike[str]) -> Iterator[LogRecord]:
    """Decoded lines of one log file. Raises :class:`LogError` naming file and line."""
    name = os.fspath(path)
    with open(name, encoding="utf-8") as handle:
        lines = handle.readlines()
    if not lines:
        raise LogError(f"{name}: empty file, expected a header line")
    for index, raw in enumerate(lines, start=1):
        last = index == len(lines)
        if not raw.endswith("\n"):
            raise LogError(f"{name}:{index}: truncated last line (no newline): "
                           "the writer stopped mid-record")
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            # Only a record after the header can be a crash's truncated tail; a file whose
            # first line is not JSON is not a decision log at all.
            what = "truncated or corrupt" if last and index > 1 else "not valid JSON"
            raise LogError(f"{name}:{index}: {what}: {exc.msg} at column {exc.colno}") from None
        if not isinstance(data, dict):
            raise LogError(f"{name}:{index}: expected a JSON object, got {type(data).__name__}")
        if index == 1:
            if data.get("format") != LOG_FORMAT:
                raise LogError(f"{name}:1: expected header with format {LOG_FORMAT!r}, "
                               f"got {data.get('format')!r}")
            yield LogRecord(index, data, True)
            continue
        missing = [k for k in ("seq", "event", "outcome", "summary") if k not in data]
        if missing:
            raise LogError(f"{name}:{index}: record is missing {missing}")
        yield LogRecord(index, data, False)
