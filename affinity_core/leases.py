"""Lease accounting: releases matched to the acquires they end (SPEC §12, opt-in).

Theory of operation
-------------------
verl's ``release_server(server_id)`` decrements whatever count the server has now, so a
double release undercounts and a late release from before a remove/re-add decrements the
fresh count of the re-added server. With ``lease_accounting`` every successful acquire
grants a lease ``(request_id, server_id, epoch)``; the epoch numbers the server's current
stay in the pool, from one counter in order of joining (R-LEASE-2, R-LEASE-4). A release
settles the **oldest** open lease of its ``(request_id, server_id)`` pair (R-LEASE-3):

* of the server's current epoch: the count goes down (``current``);
* of an earlier epoch: it is consumed and nothing else moves (``stale``);
* none: nothing moves and ``unknown_leases`` counts it (``unknown``).

``held`` maps each pair to its open leases as ``((epoch, count), ...)``, oldest epoch
first, every count >= 1.
"""

from __future__ import annotations

import enum

import attrs
from immutables import Map

__all__ = ["LeaseBook", "Settlement", "close_epochs", "grant", "open_epochs", "settle"]

LeaseKey = tuple["str | None", str]
Held = tuple[tuple[int, int], ...]


class Settlement(enum.Enum):
    CURRENT = "current"
    STALE = "stale"
    UNKNOWN = "unknown"


@attrs.frozen
class LeaseBook:
    held: Map[LeaseKey, Held] = attrs.field(factory=Map)
    epoch: Map[str, int] = attrs.field(factory=Map)  # current epoch of each active server
    next_epoch: int = 0
    unknown_leases: int = 0
    stale_leases: int = 0


def open_epochs(book: LeaseBook, server_ids: tuple[str, ...]) -> LeaseBook:
    """A new epoch for each id that joins the pool; active ids keep theirs (R-LEASE-4)."""
    epoch, next_epoch = book.epoch, book.next_epoch
    for server_id in server_ids:
        if server_id not in epoch:
            epoch, next_epoch = epoch.set(server_id, next_epoch), next_epoch + 1
    return attrs.evolve(book, epoch=epoch, next_epoch=next_epoch)


def close_epochs(book: LeaseBook, server_ids: tuple[str, ...]) -> LeaseBook:
    """End the epochs of removed servers; their leases stay and become stale."""
    epoch = book.epoch
    for server_id in server_ids:
        if server_id in epoch:
            epoch = epoch.delete(server_id)
    return attrs.evolve(book, epoch=epoch)


def grant(book: LeaseBook, request_id: str | None, server_id: str) -> LeaseBook:
    key = (request_id, server_id)
    current = book.epoch[server_id]
    held = dict(book.held.get(key, ()))  # epoch -> count; dicts keep insertion order
    held[current] = held.get(current, 0) + 1
    return attrs.evolve(book, held=book.held.set(key, tuple(held.items())))


def settle(book: LeaseBook, request_id: str | None, server_id: str
           ) -> tuple[LeaseBook, Settlement]:
    key = (request_id, server_id)
    held = book.held.get(key)
    if held is None:
        return attrs.evolve(book, unknown_leases=book.unknown_leases + 1), Settlement.UNKNOWN
    (epoch, count), rest = held[0], held[1:]
    if count > 1:
        rest = ((epoch, count - 1), *rest)
    held_after = book.held.set(key, rest) if rest else book.held.delete(key)
    if epoch == book.epoch.get(server_id):
        return attrs.evolve(book, held=held_after), Settlement.CURRENT
    return (attrs.evolve(book, held=held_after, stale_leases=book.stale_leases + 1),
            Settlement.STALE)
