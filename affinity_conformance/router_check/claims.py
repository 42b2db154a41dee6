"""The policy a router claims, as the reference core's configuration.

Theory of operation
-------------------
``affinity check-router`` judges a router against a *claim*: the spec configuration the
router's users are told it implements. The claim is parsed here, at configuration time,
into an :class:`affinity_core.Config` with two fixed choices that an HTTP router makes
necessarily:

* ``tie_break = draw``: a router breaks ties its own way (first, random, rendezvous hash,
  ...), so each observed choice is checked for membership in ``allowed`` and then fed back
  with :func:`affinity_core.draw_for` (refinement, R-REL-2);
* ``lease_accounting = true``: a router's load guard belongs to one request, so a request
  that was in flight on a removed backend cannot lower that backend's count after it is
  re-added (R-LEASE-3); without pool changes this is exactly verl's release rule.

Claims: ``legacy`` (verl's rule: a pin is never moved for load), ``margin=N`` (PR #7435's
``affinity_break_margin``), and ``deterministic`` -- placement by a fixed function of the
session key and the pool, never by load (the spec's ``full_determinism``). The function
is the router's own (no router uses the spec's CRC-32), so the harness *learns* it: the
first placement of each key fixes its ``request_hash`` and every later placement of that
key in the same pool must agree (R-DET-1, R-DET-2, R-DET-4).
"""

from __future__ import annotations

import attrs

from affinity_core import DEFAULT_MAX_CACHE_SIZE, Config, ConfigError, TieBreak

__all__ = ["Claim", "ClaimError", "parse_claim"]

CLAIM_FORMS = "'legacy', 'margin=N' (N an integer >= 0) or 'deterministic'"


class ClaimError(ValueError):
    """A claimed policy outside the accepted forms."""


@attrs.frozen
class Claim:
    text: str
    config: Config

    @property
    def deterministic(self) -> bool:
        return self.config.full_determinism


def parse_claim(text: str, cache_size: int = DEFAULT_MAX_CACHE_SIZE) -> Claim:
    """``legacy`` | ``margin=N`` | ``deterministic``; raises :class:`ClaimError`."""
    raw = text.strip().lower()
    margin: int | None = None
    deterministic = False
    if raw == "legacy":
        pass
    elif raw == "deterministic":
        deterministic = True
    elif raw.startswith("margin="):
        value = raw.split("=", 1)[1]
        try:
            margin = int(value)
        except ValueError:
            raise ClaimError(f"--policy margin must be an integer >= 0, got {value!r}") from None
        if margin < 0:
            raise ClaimError(f"--policy margin must be an integer >= 0, got {margin}")
    else:
        raise ClaimError(f"--policy must be {CLAIM_FORMS}, got {text!r}")
    try:
        config = Config(affinity_break_margin=margin, max_cache_size=cache_size,
                        full_determinism=deterministic, tie_break=TieBreak.DRAW,
                        lease_accounting=True)
    except ConfigError as exc:
        raise ClaimError(f"--cache-size: {exc}") from None
    return Claim(raw, config)
