"""Portable hashes for deterministic routing.

Theory of operation
-------------------
The core never calls Python's builtin hash function: it is salted per process unless
``PYTHONHASHSEED`` is fixed, so two processes can route the same id differently
(verl issue #7666). The spec defines one portable hash (R-HASH-1):

    stable_hash(s) = CRC-32 (ISO-HDLC, as zlib.crc32) of the UTF-8 bytes of s,

an unsigned 32-bit integer any language can compute. It drives the ``stable`` hash
mode of ``full_determinism`` (index into the *sorted* server ids, after PR #7667) and
the ``hashed`` tie-break (index into the tied servers in pool order).
"""

from __future__ import annotations

import zlib

__all__ = ["stable_hash"]


def stable_hash(text: str) -> int:
    """CRC-32 of the UTF-8 encoding: an int in ``[0, 2**32)``."""
    return zlib.crc32(text.encode("utf-8"))
