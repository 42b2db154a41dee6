"""NDJSON decision logs: the record format and the writer the adapters run.

Theory of operation
-------------------
A log is a sequence of files; each file is self-contained (R-LOG-1):

* line 1, the header: ``{"format": "affinity-log/1", "config": {...}, "state": {...},
  "seq": n}`` -- the configuration and the full state *before* event ``n``, in the
  canonical codec of :mod:`affinity_engine.codec`;
* every further line: ``{"seq": n, "event": {...}, "outcome": {...}, "summary": {...},
  "ts": t}`` -- the event the adapter applied, the outcome it acted on, a constant-size
  summary of the state after it (:func:`state_summary`) and the wall-clock time it was
  written (Unix milliseconds, for people correlating a log with other logs; replay ignores
  it); a pool change or a release the adapter made on its own also has ``"reason"``;
* on the first record of every file and then every ``digest_every`` records, also
  ``"state_digest"``: the SHA-256 of the canonical JSON of the whole state after it.

Why not a digest on every line: the full digest serializes the whole sticky map, so it
costs time linear in the sticky entries; the summary is O(1), and the periodic digest
bounds how long a silent divergence of the sticky map can go unnoticed. The checker
(:mod:`affinity_conformance.log_replay`, ``affinity replay``) reads this format; this
module only writes it (a restart replays an old log through that same checker, in
:mod:`affinity_runtime.warm_start`).

**One writer per path (R-LOG-2).** :meth:`DecisionLogWriter.lock` (which
:meth:`~DecisionLogWriter.start` calls) takes two exclusive locks before it looks at,
rotates or writes any file of the log: ``flock`` on ``<log>.lock``
(:mod:`affinity_runtime.path_lock`, which names the holder's PID), and ``flock`` on the
live log file itself. A second writer on the same path -- a second router, a second
actor, a second writer in the same process -- fails with :class:`DecisionLogLocked`
naming the path, and changes nothing. Why two: anyone can delete the ``.lock`` file, and
a second writer would then lock a new one; the live file cannot be taken away the same
way, because the writer never lets the path be without a file it holds locked -- a new
file is written and locked under a temporary name, the current one is kept as ``log.1``
by a hard link, and the new one is renamed over the path in one atomic step.

**Durability.** Each record is one unbuffered ``write`` of one complete line, so a crash
can lose or truncate at most the last line, and nothing is left in a buffer to be written
later. Size cap: when a file would exceed ``max_bytes`` it is rotated (``log.1`` ...
``log.K``, oldest dropped) and the new file starts with a fresh header holding the
current state, so every kept file replays alone. A writer that starts where a log already
exists (a restart with the same path) rotates the old file away and starts a new *run*:
its header carries ``"restart"`` (R-LOG-3; :mod:`affinity_runtime.warm_start` replays the
old file so the new run continues from its state).

**Retention.** Rotation keeps at most ``backups`` old files and, with ``keep_bytes``, at
most that many bytes of them, deleting the oldest first -- but never a file of a run that
could not be replayed at a restart (``"previous_end": "unreplayed"`` in the next run's
restart header), and, unless ``keep_last_crash`` is False, never a file of the newest run
that crashed (``"crash"``: it ended with requests in flight or in a cut line) -- nor the
first file of the run after each, whose header records that. Those are kept beyond the
limits, so a string of clean restarts cannot delete a crash's log.

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
import errno
import fcntl
import json
import logging
import os
import re
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
    "DEFAULT_BACKUPS",
    "DEFAULT_DIGEST_EVERY",
    "LOG_FORMAT",
    "PREVIOUS_ENDS",
    "PROBLEM_KINDS",
    "DecisionLogLocked",
    "DecisionLogWriter",
    "read_restart",
    "state_summary",
]

LOG_FORMAT = "affinity-log/1"
DEFAULT_DIGEST_EVERY = 1024  # R-LOG-1's bound: a digest at least every 1,024 records
DEFAULT_BACKUPS = 10
# How the run before a restart ended, as its successor's restart header says (R-LOG-3):
# stop -- nothing in flight; crash -- requests in flight or a cut last line; unreplayed --
# the restart could not replay it (malformed, diverging, or a foreign file).
PREVIOUS_ENDS = ("stop", "crash", "unreplayed")
_HEADER_PREFIX = 1 << 16  # "restart" sorts before "state": it is in the header's first bytes
_RESTART_KEY = re.compile(rb'"restart":')
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
                 backups: int = DEFAULT_BACKUPS, keep_bytes: int | None = None,
                 keep_last_crash: bool = True, digest_every: int = DEFAULT_DIGEST_EVERY,
                 check_interval: float = 1.0, retry_interval: float = 1.0) -> None:
        if max_bytes < 4096:
            raise ValueError(f"decision log max_bytes must be >= 4096, got {max_bytes}")
        if backups < 0:
            raise ValueError(f"decision log backups must be >= 0, got {backups}")
        if keep_bytes is not None and keep_bytes < 0:
            raise ValueError(f"decision log keep_bytes must be >= 0 (or None for no byte "
                             f"limit), got {keep_bytes}")
        if not 1 <= digest_every <= DEFAULT_DIGEST_EVERY:  # sparser logs fail replay (R-LOG-1)
            raise ValueError(f"decision log digest_every must be in [1, "
                             f"{DEFAULT_DIGEST_EVERY}], got {digest_every}")
        for name, value in (("check_interval", check_interval),
                            ("retry_interval", retry_interval)):
            if not 0 <= value <= 3600:
                raise ValueError(f"decision log {name} must be in [0, 3600] seconds, "
                                 f"got {value!r}")
        # Nothing touches the filesystem before lock()/start(): a router builds its
        # writer, binds its port, and only then starts the log.
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self.keep_bytes = keep_bytes
        self.keep_last_crash = keep_last_crash
        self.digest_every = digest_every
        self.check_interval = check_interval
        self.retry_interval = retry_interval
        self.errors: dict[str, int] = {}  # PROBLEM_KINDS -> count
        self.problem: str | None = None  # why the log is not working now, if it is not
        self._lock: PathLock | None = None
        # Holds flock on the live file's inode; a file object, so a writer dropped without
        # close() (an actor that is never closed) still lets the lock go when collected.
        self._live_lock: IO[bytes] | None = None
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
    def _staging_path(self) -> Path:
        return self.path.with_name(f".{self.path.name}.new")

    @property
    def ok(self) -> bool:
        """True unless a failure is outstanding (also True before start)."""
        return self.problem is None

    @property
    def next_seq(self) -> int:
        """The ``seq`` the next record gets."""
        return self._seq

    def health(self) -> dict[str, Any]:
        """What /metrics and get_status report: path, ok, errors by kind, problem."""
        return {"path": str(self.path), "ok": self.ok, "errors": dict(self.errors),
                "problem": self.problem}

    # ------------------------------------------------------------------ lifecycle
    def lock(self) -> None:
        """Take the path's locks (R-LOG-2) without writing anything; idempotent.

        Raises :class:`DecisionLogLocked` when another writer holds the path (nothing
        is changed), or ``OSError`` naming the path when it cannot be locked.
        """
        if self._lock is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock = acquire(self.lock_path, f"decision log {self.path}")
        except PathLocked:
            raise
        except OSError as exc:
            raise self._cannot_open(exc) from None
        try:
            self._live_lock = _lock_live_file(self.path)
        except PathLocked:
            self._lock.release()
            self._lock = None
            raise
        except OSError as exc:
            self._lock.release()
            self._lock = None
            raise self._cannot_open(exc) from None

    def start(self, config: Config, state: State, *, seq: int | None = None,
              restart: dict[str, Any] | None = None) -> None:
        """Lock the path, then open a fresh file whose header holds ``state``.

        ``seq``: the header's ``seq`` (default: where this writer's numbering stands, 0
        for a new writer). ``restart``: the header's ``"restart"`` object (R-LOG-3); a
        writer that finds an old log at the path marks its header ``{"mode": "cold"}``
        when the caller gave none. Raises :class:`DecisionLogLocked` when another writer
        holds the path (nothing is changed), or ``OSError`` when the file cannot be
        written (lock released). An existing non-empty file at the path is kept as
        ``log.1``, never overwritten.
        """
        self.lock()
        if seq is not None:
            if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
                raise ValueError(f"decision log seq must be an integer >= 0, got {seq!r}")
            self._seq = seq
        try:
            if self._file is None and restart is None and self._live_size() > 0:
                restart = {"mode": "cold"}
            self._open_new(config, state, restart)
        except OSError as exc:
            self.close()
            raise self._cannot_open(exc) from None

    def _live_size(self) -> int:
        try:
            return self.path.stat().st_size if self.path.is_file() else 0
        except OSError:
            return 0

    def _cannot_open(self, exc: OSError) -> OSError:
        where = f" ({exc.filename})" if exc.filename else ""
        return OSError(exc.errno, f"cannot open decision log {self.path}: "
                       f"{exc.strerror or exc}{where}")

    def close(self) -> None:
        """Close the file and release the locks (a later start() takes them again)."""
        self._close_file()
        live, self._live_lock = self._live_lock, None
        if live is not None:
            with contextlib.suppress(OSError):
                live.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def rotated(self) -> list[Path]:
        """The rotated files ``log.1``, ``log.2``, ... that exist, newest first."""
        prefix = self.path.name + "."
        found: list[tuple[int, Path]] = []
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.path.parent):
                rest = entry.name[len(prefix):] if entry.name.startswith(prefix) else ""
                if rest.isdigit() and rest == str(int(rest)) and int(rest) > 0:
                    found.append((int(rest), Path(entry.path)))
        return [p for _, p in sorted(found)]

    def files(self) -> list[Path]:
        """Existing log files, oldest first."""
        return [*reversed(self.rotated()), *([self.path] if self.path.exists() else [])]

    # -------------------------------------------------------------------- records
    def record(self, config: Config, pre: State, event: Event, outcome: Outcome,
               post: State, *, reason: str | None = None) -> bool:
        """Log one applied event; False (reported, not raised) if it was not written.

        ``pre`` is the state before the event: the header of a new file (rotation or
        resumption after a failure) holds it. ``reason``: why the adapter made the
        event on its own (a pool change, an abandoned request), written as ``"reason"``.
        """
        if self._lock is None:
            self.start(config, pre)
        elif not self.ready(config, pre):
            self._seq += 1  # the event happened; its number stays taken
            return False
        record: dict[str, Any] = {
            "seq": self._seq, "event": event_to_json(event),
            "outcome": outcome_to_json(outcome), "summary": state_summary(post),
            # Unix milliseconds, an integer: canonical JSON carries no floats (R-CODEC-1)
            "ts": time.time_ns() // 1_000_000,
        }
        if reason is not None:
            record["reason"] = reason
        if self._since_digest % self.digest_every == 0:
            record["state_digest"] = state_digest(post)
        written = self._append(config, pre, post, record)
        self._seq += 1  # taken whether or not the record reached the file
        self._since_digest += written
        return written

    def _append(self, config: Config, pre: State, post: State,
                record: dict[str, Any]) -> bool:
        line = _line(record)
        if self._size + len(line) > self.max_bytes:
            try:
                self._open_new(config, pre)
            except OSError as exc:
                self._failed("rotate", f"cannot rotate decision log {self.path}: {exc}")
                return False
            if "state_digest" not in record:
                record["state_digest"] = state_digest(post)
                line = _line(record)
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
            self._open_new(config, state)  # keeps whatever is at the path as log.1
        except OSError as exc:
            self.errors["reopen"] = self.errors.get("reopen", 0) + 1
            self.problem = f"cannot resume decision log {self.path}: {exc}"
            log.error("%s; will retry in %gs", self.problem, self.retry_interval)
            return False
        log.warning("decision log %s resumed: a new file starts at seq %d with the current "
                    "state (after: %s)", self.path, self._seq, self.problem)
        self.problem = None
        return True

    def _open_new(self, config: Config, state: State,
                  restart: dict[str, Any] | None = None) -> None:
        """Make a new file with a header holding ``state`` the live one.

        The new file is written and locked under a staging name first; then the rotated
        files shift up (retention applied), the current file, if it has anything, gets
        the name ``log.1`` as a second link, and the staging file is renamed over the
        path. The path never names a file this writer does not hold locked.
        """
        self._close_file()
        staging = self._staging_path
        header: dict[str, Any] = {"format": LOG_FORMAT, "config": config_to_json(config),
                                  "state": state_to_json(state), "seq": self._seq}
        if restart is not None:
            header["restart"] = restart
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT, 0o644)
        handle = open(fd, "wb", buffering=0)  # noqa: SIM115 (kept open)
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(handle.fileno(), 0)  # only once it is ours
            self._file = handle
            self._size = 0
            self._write(_line(header))
            size = self._live_size()
            fits = self.backups > 0 and (self.keep_bytes is None or size <= self.keep_bytes)
            keep_current = size > 0 and (fits or self._protected_current())
            if keep_current:
                self._make_room()
                first = self.path.with_name(f"{self.path.name}.1")
                try:
                    os.link(self.path, first)
                except OSError as exc:  # a filesystem without hard links: a short window
                    if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV,
                                         errno.EMLINK):
                        raise
                    os.replace(self.path, first)
            os.replace(staging, self.path)
        except OSError:
            self._file = None
            with contextlib.suppress(OSError):
                handle.close()
            staging.unlink(missing_ok=True)  # a file without a whole header is no log
            raise
        self._since_digest = 0  # the first record of every file carries a full digest
        old, self._live_lock = self._live_lock, open(  # noqa: SIM115 (kept open)
            os.dup(handle.fileno()), "rb", buffering=0)
        if old is not None:
            with contextlib.suppress(OSError):
                old.close()  # the old file is log.1 now; its lock is no longer needed

    def _protected_current(self) -> bool:
        """Is the live file, though over the limits, one retention must keep?"""
        files = [*reversed(self.rotated()), self.path]
        return self.path in _protected(files, self.keep_last_crash)

    def _make_room(self) -> None:
        """Shift ``log.1``... up by one so ``log.1`` is free, deleting what retention
        drops: beyond ``backups`` files (the current file, about to become ``log.1``,
        counts) or ``keep_bytes`` bytes, oldest first, except protected runs."""
        rotated = self.rotated()  # newest first
        protected = _protected([*reversed(rotated), self.path], self.keep_last_crash)
        count = 1  # the current file, soon log.1
        total = self._live_size()
        kept: list[Path] = []
        for path in rotated:
            try:
                size = path.stat().st_size
            except OSError:
                continue
            within = count < self.backups and (self.keep_bytes is None
                                               or total + size <= self.keep_bytes)
            if within or path in protected:
                kept.append(path)
                count += 1
                total += size
            else:
                path.unlink(missing_ok=True)
        # Renumber the kept files to log.2, log.3, ...: first the ones that move up (from
        # the top down), then the ones that close a gap below them (from the bottom up).
        moves = [(path, self.path.with_name(f"{self.path.name}.{i + 2}"))
                 for i, path in enumerate(kept)]
        up = [(a, b) for a, b in moves if _index(b) > _index(a)]
        down = [(a, b) for a, b in moves if _index(b) < _index(a)]
        for src, dst in reversed(up):
            os.replace(src, dst)
        for src, dst in down:
            os.replace(src, dst)

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


def _line(data: dict[str, Any]) -> bytes:
    return canonical_dumps(data).encode("utf-8") + b"\n"


def _index(path: Path) -> int:
    return int(path.name.rsplit(".", 1)[1])


def _lock_live_file(path: Path) -> IO[bytes] | None:
    """``flock`` the file at ``path`` if there is one; the open file, or None if none.

    A writer that holds the path never lets it be without a locked file (see
    :meth:`DecisionLogWriter._open_new`), so a second writer that got past a deleted
    ``.lock`` file still fails here, before it reads or rotates anything.
    """
    for _ in range(16):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise PathLocked(
                    f"decision log {path} is in use by another writer: the log file "
                    "itself is locked (its .lock file was deleted or replaced); stop "
                    "that writer or use another path (nothing was changed)") from None
            raise
        try:
            same = _identity(os.stat(path)) == _identity(os.fstat(fd))
        except FileNotFoundError:
            same = False
        if same:
            return open(fd, "rb", buffering=0)  # kept open: it holds the lock
        os.close(fd)  # renamed between our open and our flock: look again
    raise OSError(f"could not lock decision log {path}: the file kept being replaced")


def read_restart(path: Path) -> dict[str, Any] | None:
    """The ``"restart"`` object of a log file's header, or None (no header, or none in
    it). Reads only the header's first bytes: canonical JSON sorts ``restart`` before
    the ``state`` that makes a header big."""
    try:
        with open(path, "rb") as handle:
            prefix = handle.read(_HEADER_PREFIX)
    except OSError:
        return None
    first_line = prefix.split(b"\n", 1)[0]
    match = _RESTART_KEY.search(first_line)
    if match is None or not first_line.startswith(b'{"config":'):
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(
            first_line[match.end():].decode("utf-8", errors="replace"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _protected(files: list[Path], keep_last_crash: bool) -> set[Path]:
    """Files (oldest first in ``files``) retention must not delete: every run that a
    restart could not replay, and the newest run that crashed."""
    runs: list[list[Path]] = [[]]
    ends: list[str | None] = []  # how runs[i] ended, per runs[i + 1]'s restart header
    for path in files:
        restart = read_restart(path)
        if restart is not None and runs[-1]:
            ends.append(str(restart.get("previous_end")))
            runs.append([])
        runs[-1].append(path)
    protected: set[Path] = set()
    last_crash: list[Path] = []
    # A run's end is written in the first file of the run after it: keep that file too,
    # or the next rotation would forget why the run is kept.
    for run, end, after in zip(runs, ends, runs[1:], strict=False):
        if end == "unreplayed":
            protected.update([*run, after[0]])
        elif end == "crash":
            last_crash = [*run, after[0]]
    if keep_last_crash:
        protected.update(last_crash)
    return protected
