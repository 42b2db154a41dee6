"""An exclusive, non-blocking lock on a file path, held for a writer's lifetime.

Theory of operation
-------------------
:func:`acquire` takes ``flock(LOCK_EX | LOCK_NB)`` on a sidecar file (the decision log
uses ``<log>.lock``) and returns a :class:`PathLock`; a second taker fails at once with
:class:`PathLocked`, naming the path and, when it can read it, the PID of the holder.
Nothing else is created, truncated or renamed on that failure: the lock file already
exists (its holder made it), so the loser's ``open`` changes nothing.

Why a sidecar and not the log itself: a log rotates (``log`` becomes ``log.1``), and a
lock on the file moves with its inode; a second writer opening the new ``log`` would find
it unlocked. The sidecar is never renamed.

Why ``flock`` and not ``fcntl``/``lockf`` record locks: POSIX record locks belong to the
*process*, so a second writer in the same process would get the lock again; ``flock``
locks belong to the open file description, so two writers conflict even inside one
process. The kernel drops the lock when its holder dies (``kill -9`` included), so a
lock file left behind never blocks a restart.

Removing the lock file on release is safe only because :func:`acquire` checks, after
locking, that the file it locked is still the one at the path (same device and inode)
and retries otherwise: a taker that opened the file just before the holder unlinked it
locks an orphan and notices.

The holder writes its PID into the file after locking; a loser reads it for its message
(best effort: on a shared filesystem the holder may be another host).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import weakref
from pathlib import Path

__all__ = ["PathLock", "PathLocked", "acquire"]

_RETRIES = 16  # unlink races need one retry each; more means something is wrong


class PathLocked(OSError):
    """Another writer holds the lock; the message names the path and the holder."""


class PathLock:
    """A held lock; :meth:`release` (or garbage collection) gives it up."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd
        # A lock dropped without release() (an actor that is never closed) still ends.
        self._finalizer = weakref.finalize(self, _release, path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            self._fd = None
            self._finalizer()


def _release(path: Path, fd: int) -> None:
    with contextlib.suppress(OSError):  # unlink while still holding the lock (see above)
        if _identity(os.fstat(fd)) == _identity(os.stat(path)):
            os.unlink(path)
    os.close(fd)


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _holder(path: Path) -> str:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return ""
    return f" (held by PID {text})" if text.isdigit() else ""


def acquire(path: str | os.PathLike[str], what: str) -> PathLock:
    """Lock ``path`` (created if absent) for this writer, or raise :class:`PathLocked`.

    ``what`` names the resource in messages, e.g. ``"decision log /var/log/x.ndjson"``.
    Other ``OSError`` (a directory that cannot be written) propagate with their path.
    """
    lock_path = Path(path)
    for _ in range(_RETRIES):
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise PathLocked(
                    f"{what} is in use by another writer{_holder(lock_path)}, per the "
                    f"lock file {lock_path}; stop that writer or use another path "
                    "(nothing was changed)") from None
            raise
        try:
            same = _identity(os.stat(lock_path)) == _identity(os.fstat(fd))
        except FileNotFoundError:
            same = False
        if not same:  # the holder unlinked it between our open and our flock
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        return PathLock(lock_path, fd)
    raise OSError(f"could not lock {lock_path} for {what}: the lock file kept being replaced")
