"""Reading NDJSON decision logs: the decoded lines ``affinity replay`` checks.

Theory of operation
-------------------
The format and the writer live with the runtime, in :mod:`affinity_runtime.decision_log`
(the adapters write logs at run time; only their warm start replays one, through
:mod:`affinity_conformance.log_replay`); this
module is the checker's side. :func:`read_log` decodes one file line by line: the first
line must be a header of format :data:`~affinity_runtime.decision_log.LOG_FORMAT`, every
further line a record with ``seq``, ``event``, ``outcome`` and ``summary``. Anything else
is a :class:`LogError` naming the file and line; a last line without its newline is
reported as truncation (a writer that stopped mid-record), not as corruption. Replaying
the records through the core is :mod:`affinity_conformance.log_replay`.

The file is streamed with one line of lookahead (to tell the last line from the others),
never read whole, and a line is read at most :data:`MAX_LINE_CHARS` at a time: a log
written with a huge ``--decision-log-max-bytes``, or a path like ``/dev/zero``, ends in
a :class:`LogError`, not a ``MemoryError`` traceback. Devices are refused outright.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from typing import Any

import attrs

from affinity_runtime.decision_log import LOG_FORMAT

__all__ = ["MAX_LINE_CHARS", "LogError", "LogRecord", "read_log"]

# The longest line read: a header holds the whole state (about 50 bytes per sticky entry,
# so some 5 million sessions); records are constant-size.
MAX_LINE_CHARS = 256 << 20


class LogError(ValueError):
    """A decision log line is malformed; the message names the file and line."""


@attrs.frozen
class LogRecord:
    line: int
    data: dict[str, Any]
    is_header: bool


def read_log(path: str | os.PathLike[str]) -> Iterator[LogRecord]:
    """Decoded lines of one log file. Raises :class:`LogError` naming file and line."""
    name = os.fspath(path)
    with open(name, encoding="utf-8") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            raise LogError(f"{name}: a device, not a log file")
        yield from _records(name, handle)


def _records(name: str, handle: Any) -> Iterator[LogRecord]:
    raw = handle.readline(MAX_LINE_CHARS)
    if not raw:
        raise LogError(f"{name}: empty file, expected a header line")
    index = 0
    while raw:
        index += 1
        if len(raw) == MAX_LINE_CHARS and not raw.endswith("\n"):
            raise LogError(f"{name}:{index}: line longer than {MAX_LINE_CHARS} characters; "
                           "not a decision log")
        following = handle.readline(MAX_LINE_CHARS)
        last = not following
        if not raw.endswith("\n"):
            raise LogError(f"{name}:{index}: truncated last line (no newline): "
                           "the writer stopped mid-record")
        try:
            # Without its newline: a line cut short mid-value would otherwise be reported
            # at "column 1" of the line after it.
            data = json.loads(raw[:-1])
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
        else:
            missing = [k for k in ("seq", "event", "outcome", "summary") if k not in data]
            if missing:
                raise LogError(f"{name}:{index}: record is missing {missing}")
            yield LogRecord(index, data, False)
        raw = following
