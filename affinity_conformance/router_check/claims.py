"""The policy a router claims, as the reference core's configuration.

Theory of operation
-------------------
``affinity check-router`` judges a router against a *claim*: the spec configuration the
router's users are told it implements. The claim is parsed here, at configuration time,
into an :class:`affinity_engine.Config` with two fixed choices that an HTTP router makes
necessarily:

* ``tie_break = draw``: a router breaks ties its own way (first, random, rendezvous hash,
  ...), so each observed choice is checked for membership in ``allowed`` and then fed back
  with :func:`affinity_engine.draw_for` (refinement, R-REL-2);
* ``lease_accounting = true``: a router's load guard belongs to one request, so a request
  that was in flight on a removed backend cannot lower that backend's count after it is
  re-added (R-LEASE-3); without pool changes this is exactly verl's release rule.

Claims: ``legacy`` (verl's rule: a pin is never moved for load), ``margin=N`` (PR #7435's
``affinity_break_margin``), ``band=M,T,CAP`` (the context band of SPEC §7.5: margin ``M``,
``affinity_break_tokens = T``, ``affinity_break_band_cap = CAP``; the harness then sends
each acquire's prompt as a list of token ids, so the router can know ``c`` exactly, and
gives the same ``c`` to the core as ``context_tokens``), and ``deterministic`` --
placement by a fixed function of the session key and the pool, never by load (the spec's
``full_determinism``). The function
is the router's own (no router uses the spec's CRC-32), so the harness *learns* it: the
first placement of each key fixes its ``request_hash`` and every later placement of that
key in the same pool must agree (R-DET-1, R-DET-2, R-DET-4).
"""

from __future__ import annotations

import attrs

from affinity_engine import DEFAULT_MAX_CACHE_SIZE, Config, ConfigError, TieBreak

__all__ = ["Claim", "ClaimError", "parse_claim"]

CLAIM_FORMS = ("'legacy', 'margin=N' (N an integer >= 0), 'band=M,T,CAP' (margin M >= 0, "
               "T tokens per extra request >= 1, cap >= max(M, 1)) or 'deterministic'")


class ClaimError(ValueError):
    """A claimed policy outside the accepted forms."""


@attrs.frozen
class Claim:
    text: str
    config: Config

    @property
    def deterministic(self) -> bool:
        return self.config.full_determinism

    @property
    def band(self) -> bool:
        """Whether the claim is the context band (SPEC §7.5)."""
        return self.config.context_band


def _integer(text: str, what: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ClaimError(f"--policy {what} must be an integer >= {low}, got {text!r}") from None
    if value < low:
        raise ClaimError(f"--policy {what} must be an integer >= {low}, got {value}")
    return value


def _band(value: str) -> tuple[int, int, int]:
    parts = value.split(",")
    if len(parts) != 3:
        raise ClaimError(f"--policy band must be 'band=M,T,CAP' (three integers: margin M >= 0, "
                         f"T >= 1, CAP >= max(M, 1)), got 'band={value}'")
    margin = _integer(parts[0].strip(), "band margin M", 0)
    tokens = _integer(parts[1].strip(), "band tokens T", 1)
    cap = _integer(parts[2].strip(), "band cap CAP", max(margin, 1))
    return margin, tokens, cap


def parse_claim(text: str, cache_size: int = DEFAULT_MAX_CACHE_SIZE) -> Claim:
    """``legacy`` | ``margin=N`` | ``band=M,T,CAP`` | ``deterministic``; raises
    :class:`ClaimError` naming the value and the accepted range."""
    raw = "".join(text.split()).lower()
    margin: int | None = None
    tokens: int | None = None
    cap: int | None = None
    deterministic = False
    if raw == "legacy":
        pass
    elif raw == "deterministic":
        deterministic = True
    elif raw.startswith("margin="):
        margin = _integer(raw.split("=", 1)[1], "margin", 0)
    elif raw.startswith("band="):
        margin, tokens, cap = _band(raw.split("=", 1)[1])
    else:
        raise ClaimError(f"--policy must be {CLAIM_FORMS}, got {text!r}")
    try:
        config = Config(affinity_break_margin=margin, max_cache_size=cache_size,
                        full_determinism=deterministic, tie_break=TieBreak.DRAW,
                        lease_accounting=True, affinity_break_tokens=tokens,
                        affinity_break_band_cap=cap)
    except ConfigError as exc:  # the band is checked above, so only the cache size is left
        raise ClaimError(f"--cache-size: {exc}") from None
    return Claim(raw, config)
