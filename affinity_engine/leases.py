"""Lease accounting: releases matched to the acquires they end (opt-in).

Theory of operation
-------------------
verl's release is ``release_server(server_id)``: it decrements whatever count the server
has now. Two hazards follow (upstream-verl.md section 6): a double release undercounts,
and a late release for a request started before a remove/re-add decrements the *fresh*
count of the re-added server. verl 0.9.1's client can also pass the ``request_id``.

With ``lease_accounting=True`` (R-LEASE-1..6) every successful acquire grants a lease
``(request_id, server_id, epoch)``, where the epoch numbers the server's current stay in
the pool (each add of an inactive server opens a new epoch). A release settles a lease:

* leases of one ``(request_id, server)`` pair are settled oldest epoch first, because a
  release cannot say which of a conversation's turns it ends and turns are sequential;
* if that oldest lease is of the current epoch, the count goes down (``applied``);
* if it is of an earlier epoch, it is consumed and no count moves (``stale_lease``);
* no lease: nothing moves, ``unknown_leases`` counts it (``unknown_lease``).

So for every active server ``load == open leases of its current epoch`` (R-LEASE-5), and
no release can drive a count below the requests really in flight on it, provided a
pair's releases arrive in acquire order and are not duplicated while a later turn of the
pair is in flight (a release cannot name the turn it ends).
Unkeyed requests hold leases under the key ``None``; a release without a request id
settles one of them.
"""

from __future__ import annotations

from typing import final

from immutables import Map

from .values import Value, register

__all__ = ["LeaseBook"]

_Key = tuple["str | None", str]
# Open leases per (request_id, server): ((epoch, count), ...) with count >= 1.
_Held = tuple[tuple[int, int], ...]


_NO_LEASES: Map[_Key, _Held] = Map()
_NO_EPOCHS: Map[str, int] = Map()


@final
class LeaseBook(Value):
    __slots__ = ("epoch", "held", "next_epoch", "stale_leases", "unknown_leases")
    __match_args__ = ("held", "epoch", "next_epoch", "unknown_leases", "stale_leases")
    held: Map[_Key, _Held]
    epoch: Map[str, int]
    next_epoch: int
    unknown_leases: int
    stale_leases: int

    def __init__(self, held: Map[_Key, _Held] = _NO_LEASES, epoch: Map[str, int] = _NO_EPOCHS,
                 next_epoch: int = 0, unknown_leases: int = 0, stale_leases: int = 0) -> None:
        object.__setattr__(self, "held", held)
        object.__setattr__(self, "epoch", epoch)
        object.__setattr__(self, "next_epoch", next_epoch)
        object.__setattr__(self, "unknown_leases", unknown_leases)
        object.__setattr__(self, "stale_leases", stale_leases)

    def _with(self, held: Map[_Key, _Held], unknown: int, stale: int) -> LeaseBook:
        return LeaseBook(held, self.epoch, self.next_epoch, unknown, stale)

    def open_count(self, server_id: str) -> int:
        """Open leases on the server's current epoch (O(leases); for invariants)."""
        current = self.epoch.get(server_id)
        return sum(
            count
            for (_, sid), held in self.held.items()
            if sid == server_id
            for epoch, count in held
            if epoch == current
        )

    def opened(self, server_ids: tuple[str, ...]) -> LeaseBook:
        """New epochs for servers that join the pool (already-active ones keep theirs)."""
        epoch, nxt = self.epoch, self.next_epoch
        for sid in server_ids:
            if sid not in epoch:
                epoch, nxt = epoch.set(sid, nxt), nxt + 1
        return LeaseBook(self.held, epoch, nxt, self.unknown_leases, self.stale_leases)

    def closed(self, server_ids: tuple[str, ...]) -> LeaseBook:
        epoch = self.epoch
        for sid in server_ids:
            if sid in epoch:
                epoch = epoch.delete(sid)
        return LeaseBook(self.held, epoch, self.next_epoch, self.unknown_leases,
                         self.stale_leases)

    def grant(self, request_id: str | None, server_id: str) -> LeaseBook:
        key = (request_id, server_id)
        current = self.epoch[server_id]
        held = self.held.get(key, ())
        for i, (epoch, count) in enumerate(held):
            if epoch == current:
                held = (*held[:i], (epoch, count + 1), *held[i + 1 :])
                break
        else:
            held = (*held, (current, 1))
        return self._with(self.held.set(key, held), self.unknown_leases, self.stale_leases)

    def settle(self, request_id: str | None, server_id: str) -> tuple[LeaseBook, str]:
        """Match a release; returns the new book and ``current``, ``stale`` or ``unknown``."""
        key = (request_id, server_id)
        held = self.held.get(key)
        if held is None:
            return self._with(self.held, self.unknown_leases + 1, self.stale_leases), "unknown"
        # Releases of one (request_id, server) pair end its leases in acquire order: the
        # oldest epoch first. A release cannot say which turn it ends, and a conversation's
        # turns are sequential, so a late release after a remove/re-add belongs to the
        # older stay -- consuming the fresh lease instead would re-create the drift.
        epoch, count = held[0]
        verdict = "current" if epoch == self.epoch.get(server_id) else "stale"
        rest = (*(((epoch, count - 1),) if count > 1 else ()), *held[1:])
        held_after = self.held.set(key, rest) if rest else self.held.delete(key)
        stale = self.stale_leases + 1 if verdict == "stale" else self.stale_leases
        return self._with(held_after, self.unknown_leases, stale), verdict


register(LeaseBook)
