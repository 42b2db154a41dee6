"""NDJSON decision logs: the record format and the writer the adapters run.

Theory of operation
-------------------
A log is a sequence of files; each file is self-contained (R-LOG-1):

* line 1, the header: ``{"format": "affinity-log/1", "config": {...}, "state": {...},
  "seq": n}`` -- the configuration and the full state *before* event ``n``, in the
  canonical codec of :mod:`affinity_engine.codec`;
* every further line: ``{"seq": n, "event": {...}, "outcome": {...}, "summary": {...}}``
  -- the event the adapter applied, the outcome it acted on, and a constant-size summary
  of the state after it (:func:`state_summary`);
* on the first record of every file and then every ``digest_every`` records, also
  ``"state_digest"``: the SHA-256 of the canonical JSON of the whole state after it.

Why not a digest on every line: the full digest serializes the whole sticky map, so it
costs time linear in the sticky entries; the summary is O(1), and the periodic digest
bounds how long a silent divergence of the sticky map can go unnoticed. The checker
(:mod:`affinity_conformance.log_replay`, ``affinity replay``) reads this format; this
module only writes it, so runtime code never imports conformance tooling.

**One writer per path (R-LOG-2).** :meth:`DecisionLogWriter.start` first takes an
exclusive lock on ``<log>.lock`` (:mod:`affinity_runtime.path_lock`); only under that lock
does it look at, rotate or write any file of the log. A second writer on the same path --
a second router, a second actor, a second writer in the same process -- fails with
:class:`DecisionLogLocked` naming the path and the holder's PID, and changes nothing.

**Durability.** Each record is one unbuffered ``write`` of one complete line, so a crash
can lose or truncate at most the last line, and nothing is left in a buffer to be written
later. Size cap: when a file would exceed ``max_bytes`` it is rotated (``log.1`` ...
``log.K``, oldest dropped) and the new file starts with a fresh header holding the
current state, so every kept file replays alone. A writer that starts where a log already
exists (a restart with the same path) rotates the old file away first; its new header
(``seq`` 0, a fresh state) does not continue the old file, and ``affinity replay`` says so.

**Failures are reported, not raised, once the log runs.** A failed write, or the live
file deleted, renamed or replaced under the writer (checked at most every
``check_interval`` seconds by comparing the open file's link count and inode with the
path: two ``stat`` calls, not one per record), closes the file, sets :attr:`problem`,
counts the failure by kind in :attr:`errors` and logs it. The next record (at most every
``retry_interval`` seconds while failing) resumes with a new file whose header holds the
current state, after rotating away whatever is at the path; the lost records show up in
``affinity replay`` as a set that does not join. :meth:`DecisionLogWriter.record` returns
False for a record it could not write, so a caller that must not act without a log
(``--require-decision-log``) can undo the step it just took.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import IO, Any

from affinity_engine import (
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

from .path_lock import PathLock, PathLocked, acquire

__all__ = [
    "DEFAULT_DIGEST_EVERY",
    "LOG_FORMAT",
    "PROBLEM_KINDS",
    "DecisionLogLocked",
    "DecisionLogWriter",
    "state_summary",
]

LOG_FORMAT = "affinity-log/1"
DEFAULT_DIGEST_EVERY = 1024  # R-LOG-1's bound: a digest at least every 1,024 records
# write: a record or header failed; rotate: the size rotation failed; deleted / moved /
# replaced: the live file is no longer the one at the path; reopen: resuming failed.
PROBLEM_KINDS = ("write", "rotate", "deleted", "moved", "replaced", "reopen")

DecisionLogLocked = PathLocked  # the error a second writer on the same path gets

log = logging.getLogger("affinity_runtime.decision_log")


def state_summary(state: State) -> dict[str, int]:
    """The constant-size part of a state every record carries."""
    return {
        "inflight_total": state.inflight_total,
        "affinity_kept": state.affinity_kept,
        "affinity_broken": state.affinity_broken,
        "sticky_entries": len(state.lru),
    }


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


class DecisionLogWriter:
    """Appends one canonical JSON line per event; locks its path; rotates by size."""

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = 64 << 20,
                 backups: int = 3, digest_every: int = DEFAULT_DIGEST_EVERY,
                 check_interval: float = 1.0, retry_interval: float = 1.0) -> None:
        if max_bytes < 4096:
            raise ValueError(f"decision log max_bytes must be >= 4096, got {max_bytes}")
        if backups < 0:
            raise ValueError(f"decision log backups must be >= 0, got {backups}")
        if not 1 <= digest_every <= DEFAULT_DIGEST_EVERY:  # sparser logs fail replay (R-LOG-1)
            raise ValueError(f"decision log digest_every must be in [1, "
                             f"{DEFAULT_DIGEST_EVERY}], got {digest_every}")
        for name, value in (("check_interval", check_interval),
                            ("retry_interval", retry_interval)):
            if not 0 <= value <= 3600:
                raise ValueError(f"decision log {name} must be in [0, 3600] seconds, "
                                 f"got {value!r}")
        # Nothing touches the filesystem before start(): a router builds its writer, binds
        # its port, and only then starts the log.
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self.digest_every = digest_every
        self.check_interval = check_interval
        self.retry_interval = retry_interval
        self.errors: dict[str, int] = {}  # PROBLEM_KINDS -> count
        self.problem: str | None = None  # why the log is not working now, if it is not
        self._lock: PathLock | None = None
        self._file: IO[bytes] | None = None
        self._size = 0
        self._seq = 0
        self._since_digest = 0
        self._next_check = 0.0
        self._next_retry = 0.0

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    @property
    def ok(self) -> bool:
        """True unless a failure is outstanding (also True before start)."""
        return self.problem is None

    def health(self) -> dict[str, Any]:
        """What /metrics and get_status report: path, ok, errors by kind, problem."""
        return {"path": str(self.path), "ok": self.ok, "errors": dict(self.errors),
                "problem": self.problem}

    # ------------------------------------------------------------------ lifecycle
    def start(self, config: Config, state: State) -> None:
        """Lock the path, then open a fresh file whose header holds ``state``.

        Raises :class:`DecisionLogLocked` when another writer holds the path (nothing
        is changed), or ``OSError`` when the file cannot be written (lock released).
        An existing non-empty file at the path is rotated away, never overwritten.
        """
        if self._lock is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._lock = acquire(self.lock_path, f"decision log {self.path}")
            except PathLocked:
                raise
            except OSError as exc:
                raise self._cannot_open(exc) from None
        try:
            if self._file is None and self.path.is_file() and self.path.stat().st_size > 0:
                self._rotate()
            self._open_new(config, state)
        except OSError as exc:
            self.close()
            raise self._cannot_open(exc) from None

    def _cannot_open(self, exc: OSError) -> OSError:
        where = f" ({exc.filename})" if exc.filename else ""
        return OSError(exc.errno, f"cannot open decision log {self.path}: "
                       f"{exc.strerror or exc}{where}")

    def close(self) -> None:
        """Close the file and release the lock (a later start() takes it again)."""
        self._close_file()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def files(self) -> list[Path]:
        """Existing log files, oldest first."""
        rotated = [self.path.with_name(f"{self.path.name}.{i}")
                   for i in range(self.backups, 0, -1)]
        return [p for p in [*rotated, self.path] if p.exists()]

    # -------------------------------------------------------------------- records
    def record(self, config: Config, pre: State, event: Event, outcome: Outcome,
               post: State) -> bool:
        """Log one applied event; False (reported, not raised) if it was not written.

        ``pre`` is the state before the event: the header of a new file (rotation or
        resumption after a failure) holds it.
        """
        if self._lock is None:
            self.start(config, pre)
        elif not self.ready(config, pre):
            self._seq += 1  # the event happened; its number stays taken
            return False
        record: dict[str, Any] = {
            "seq": self._seq, "event": event_to_json(event),
            "outcome": outcome_to_json(outcome), "summary": state_summary(post),
        }
        if self._since_digest % self.digest_every == 0:
            record["state_digest"] = state_digest(post)
        written = self._append(config, pre, post, record)
        self._seq += 1  # taken whether or not the record reached the file
        self._since_digest += written
        return written

    def _append(self, config: Config, pre: State, post: State,
                record: dict[str, Any]) -> bool:
        line = canonical_dumps(record).encode("utf-8") + b"\n"
        if self._size + len(line) > self.max_bytes:
            try:
                self._rotate()
                self._open_new(config, pre)
            except OSError as exc:
                self._failed("rotate", f"cannot rotate decision log {self.path}: {exc}")
                return False
            if "state_digest" not in record:
                record["state_digest"] = state_digest(post)
                line = canonical_dumps(record).encode("utf-8") + b"\n"
        try:
            self._write(line)
        except OSError as exc:
            self._failed("write", f"cannot write decision log {self.path}: {exc}")
            return False
        return True

    def ready(self, config: Config, state: State) -> bool:
        """True if the next record can be written: checks the live file when a check is
        due and, while failing, tries to resume with a header holding ``state``."""
        if self._lock is None:
            return self.problem is None
        if self._file is not None:
            now = time.monotonic()
            if now >= self._next_check:
                self._next_check = now + self.check_interval
                self.check()
        return self._file is not None or self._resume(config, state)

    def check(self) -> bool:
        """Is the open file still the one at the path? Reports it if not (cheap: two
        ``stat`` calls; call it on a status scrape, not per record)."""
        if self._file is None:
            return self.problem is None
        try:
            opened = os.fstat(self._file.fileno())
            if opened.st_nlink == 0:
                self._failed("deleted", f"decision log {self.path} was deleted while "
                             "being written")
                return False
            at_path = os.stat(self.path)
        except FileNotFoundError:
            self._failed("moved", f"decision log {self.path} was moved away (renamed) "
                         "while being written")
            return False
        except OSError as exc:
            self._failed("write", f"cannot check decision log {self.path}: {exc}")
            return False
        if _identity(at_path) != _identity(opened):
            self._failed("replaced", f"decision log {self.path} was replaced by another "
                         "file while being written")
            return False
        return True

    # ------------------------------------------------------------------ internals
    def _failed(self, kind: str, message: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.problem = message
        self._close_file()
        self._next_retry = 0.0  # the next record tries to resume at once
        log.error("%s; records are not being logged until a new file can be started",
                  message)

    def _resume(self, config: Config, state: State) -> bool:
        now = time.monotonic()
        if now < self._next_retry:
            return False
        self._next_retry = now + self.retry_interval
        try:
            if self.path.is_file() and self.path.stat().st_size > 0:
                self._rotate()  # keep whatever is there: our partial file or another's
            self._open_new(config, state)
        except OSError as exc:
            self.errors["reopen"] = self.errors.get("reopen", 0) + 1
            self.problem = f"cannot resume decision log {self.path}: {exc}"
            log.error("%s; will retry in %gs", self.problem, self.retry_interval)
            return False
        log.warning("decision log %s resumed: a new file starts at seq %d with the current "
                    "state (after: %s)", self.path, self._seq, self.problem)
        self.problem = None
        return True

    def _open_new(self, config: Config, state: State) -> None:
        self._close_file()
        handle = open(self.path, "wb", buffering=0)  # noqa: SIM115 (kept open)
        self._size = 0
        self._since_digest = 0  # the first record of every file carries a full digest
        header = {"format": LOG_FORMAT, "config": config_to_json(config),
                  "state": state_to_json(state), "seq": self._seq}
        self._file = handle
        try:
            self._write(canonical_dumps(header).encode("utf-8") + b"\n")
        except OSError:
            self._close_file()
            self.path.unlink(missing_ok=True)  # a file without a whole header is no log
            raise

    def _write(self, line: bytes) -> None:
        assert self._file is not None
        view = memoryview(line)
        while view:  # one write() for a line in practice; a short write continues it
            written = self._file.write(view)
            if not written:
                raise OSError(f"wrote 0 of {len(view)} bytes")
            view = view[written:]
        self._size += len(line)

    def _close_file(self) -> None:
        handle, self._file = self._file, None
        if handle is not None:
            with contextlib.suppress(OSError):  # already reported; a close must not raise
                handle.close()

    def _rotate(self) -> None:
        self._close_file()
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
            return
        for i in range(self.backups, 0, -1):
            src = self.path if i == 1 else self.path.with_name(f"{self.path.name}.{i - 1}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i}"))
