"""The optional access log of ``affinity serve`` (``--access-log PATH``; ``-`` for stdout).

One JSON object per line per request, written when the request ends::

    {"ts": 1733338800123, "method": "POST", "path": "/v1/completions", "status": 200,
     "duration_ms": 84.2, "ttfb_ms": 12.9, "backend": "http://10.0.0.5:8000",
     "decision": "kept", "session": "9f3a11c2", "client": "10.0.0.9"}

``ts`` is the wall clock at the end (Unix milliseconds, as in the decision log);
``backend`` and ``decision`` (the core's acquire path: new, kept, broken, reselected,
unkeyed) are null for requests that were never routed (a 400, /metrics, ...); ``ttfb_ms``
is the time to the backend's response head. ``session`` is a hash of the session key
(CRC-32, the router's portable hash), never the key itself: keys may be user ids, and an
access log travels further than the decision log. JSON because keys, paths and backend
URLs need no escaping rules of their own.

Why a file and not the logging module: one line per request at thousands of requests a
second; a plain buffered file write costs a fraction of a log record. The file is
flushed after each line so ``tail -f`` sees requests as they end.
"""

from __future__ import annotations

import json
import sys
import time
from typing import IO

from affinity_engine import stable_hash

from .http_messages import IncomingRequest

__all__ = ["AccessLog", "session_hash"]


def session_hash(key: str) -> str:
    """What the access log shows for a session key: 8 hex digits of its stable hash."""
    try:
        return f"{stable_hash(key) & 0xFFFFFFFF:08x}"
    except UnicodeEncodeError:  # a lone surrogate from a JSON body field
        return "unencodable"


class AccessLog:
    """Appends one JSON line per finished request (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._own = path != "-"
        try:
            self._file: IO[str] = (open(path, "a", encoding="utf-8")  # noqa: SIM115
                                   if self._own else sys.stdout)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot open access log {path}: "
                          f"{exc.strerror or exc}") from None

    def write(self, request: IncomingRequest, status: int, session: str | None,
              ended: float) -> None:
        started = request.received_at
        line = {
            "ts": time.time_ns() // 1_000_000, "method": request.method,
            "path": request.path, "status": status,
            "duration_ms": round((ended - started) * 1000, 3),
            "ttfb_ms": None if request.first_byte_at is None
            else round((request.first_byte_at - started) * 1000, 3),
            "backend": request.backend, "decision": request.decision,
            "session": None if session is None else session_hash(session),
            "client": request.client,
        }
        try:
            self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
            self._file.flush()
        except (OSError, ValueError):  # a full disk must not fail the request
            pass

    def close(self) -> None:
        if self._own:
            self._file.close()
