"""Balancer configuration and its validation.

Theory of operation
-------------------
A configuration is fixed for the life of a balancer, as verl's constructor arguments
are. It is validated when it is built, never on first use (R-CFG-1): a bad value raises
:class:`ConfigError` naming the option, the value and the accepted range, and no state
exists yet that it could corrupt.

Routing policy (R-POL-1):

* ``affinity_break_margin=None`` and ``dual_threshold=None``: the legacy balancer. A
  sticky hit always keeps its pin.
* ``affinity_break_margin=m`` (PR #7435): keep a pin iff ``load[pin] <= min + m``.
* ``affinity_break_tokens=T`` with ``affinity_break_band_cap=cap`` (the context-aware
  band, an opt-in extension of the margin): keep iff ``load[pin] <= min + band`` where
  ``band = min(m + c // T, cap)`` and ``c`` is the acquire's ``context_tokens``
  (R-BAND-1). ``T = None`` is the margin rule exactly. Both new options need the margin
  set, and ``cap >= m``, so the band only ever widens the margin's and skew stays bounded
  by ``cap`` whatever the context (R-BAND-2).
* ``dual_threshold=DualThreshold(abs, rel)`` (PR #6533): keep a pin iff the pin is on a
  minimum or the pool is not imbalanced.

The two policies are mutually exclusive. Both are ignored under ``full_determinism``.

Group pins (R-GRP-1), an opt-in extension for the n samples of one prompt (GRPO's group):

* ``group_stickiness="off"`` (the default): an acquire's ``group_id`` is never read;
* ``"fallback"``: a keyed acquire that misses the sticky map joins its group's pin, kept
  under the same rule as a conversation's pin, or under ``group_break_margin`` when set;
* ``"only"``: a grouped acquire uses its group's pin alone and never reads or writes its
  own entry (PR #6122's ``GroupStickyLoadBalancer``, with the legacy policy).

``max_group_cache_size`` bounds the group map as ``max_cache_size`` bounds the sticky map.

Prefix-aware placement (R-PFX-1), an opt-in extension: ``placement_margin=m_place`` lets
a placement choose among the servers within ``min + m_place`` the one whose cache holds
the most of the request's prefix (the acquire's ``cached_prefix``). ``None`` (the default)
is least-loaded placement exactly; like the margin it is ignored under
``full_determinism``.
``balance_rel_threshold`` is an exact rational (``fractions.Fraction``), so the gate
compares integers only.
"""

from __future__ import annotations

import enum
import math
from fractions import Fraction

import attrs

__all__ = [
    "DEFAULT_MAX_CACHE_SIZE",
    "Config",
    "ConfigError",
    "DualThreshold",
    "GroupStickiness",
    "HashMode",
    "TieBreak",
    "validate_margin",
    "validate_optional_positive",
]

DEFAULT_MAX_CACHE_SIZE = 10000


class ConfigError(ValueError):
    """A configuration value is outside its accepted range."""


class TieBreak(enum.Enum):
    """How a placement picks among the least-loaded servers (R-TIE-1..4)."""

    FIRST = "first"  # first in pool order: verl Aug-2026 main and PR #7435
    DRAW = "draw"  # the event's tie_draw picks: verl 0.9.1's random.choice
    HASHED = "hashed"  # stable_hash(request_id) picks: deterministic and spreading


class HashMode(enum.Enum):
    """The server index under ``full_determinism`` (R-DET-2, R-DET-3)."""

    CALLER = "caller"  # request_hash supplied by the caller, over pool order (verl)
    STABLE = "stable"  # stable_hash(request_id) over sorted server ids (PR #7667)


class GroupStickiness(enum.Enum):
    """Whether and how an acquire's ``group_id`` pins its group (R-GRP-1)."""

    OFF = "off"  # group ids are ignored: today's balancer exactly
    FALLBACK = "fallback"  # own pin first; on a miss, the group's pin
    ONLY = "only"  # the group's pin alone (PR #6122)


def _describe(value: object) -> str:
    return f"{value!r} ({type(value).__name__})"


def _optional_int_at_least(value: object, key: str, least: int) -> int | None:
    # Checked on the value as given, so the message names what the user wrote (-2.0 stays
    # "-2.0 (float)"); integral floats such as 2.0 (YAML, JSON) are accepted as 2.
    if value is None:
        return None
    accepted = (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and (not isinstance(value, float) or (math.isfinite(value) and value.is_integer()))
        and value >= least
    )
    if not accepted:
        raise ConfigError(
            f"{key} must be null or an integer >= {least}, got {_describe(value)}"
        )
    assert isinstance(value, (int, float))
    return int(value)


def validate_margin(value: object, key: str = "affinity_break_margin") -> int | None:
    """``None`` or an integer >= 0. Integral floats such as ``2.0`` become ``2``."""
    return _optional_int_at_least(value, key, 0)


def validate_optional_positive(value: object, key: str) -> int | None:
    """``None`` or an integer >= 1 (``affinity_break_tokens``, ``affinity_break_band_cap``)."""
    return _optional_int_at_least(value, key, 1)


def _tokens(value: object) -> int | None:
    return validate_optional_positive(value, "affinity_break_tokens")


def _band_cap(value: object) -> int | None:
    return validate_optional_positive(value, "affinity_break_band_cap")


def _positive_int(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be an integer >= 1, got {_describe(value)}")
    return value


def _as_enum(kind: type[enum.Enum], key: str, value: object) -> enum.Enum:
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in kind)
        raise ConfigError(f"{key} must be one of {allowed}, got {_describe(value)}") from None


def _as_tie_break(value: object) -> TieBreak:
    result = _as_enum(TieBreak, "tie_break", value)
    assert isinstance(result, TieBreak)
    return result


def _as_hash_mode(value: object) -> HashMode:
    result = _as_enum(HashMode, "hash_mode", value)
    assert isinstance(result, HashMode)
    return result


def _as_group_stickiness(value: object) -> GroupStickiness:
    result = _as_enum(GroupStickiness, "group_stickiness", value)
    assert isinstance(result, GroupStickiness)
    return result


def _group_margin(value: object) -> int | None:
    return validate_margin(value, "group_break_margin")


def _placement_margin(value: object) -> int | None:
    return validate_margin(value, "placement_margin")


def _as_rel(value: object) -> Fraction:
    rel: Fraction | None = None
    if isinstance(value, Fraction):
        rel = value
    elif isinstance(value, bool):
        rel = None
    elif isinstance(value, int):
        rel = Fraction(value)
    elif isinstance(value, float) and math.isfinite(value):
        rel = Fraction(str(value))  # the decimal the user wrote, not its binary image
    elif isinstance(value, str):
        try:
            rel = Fraction(value)
        except (ValueError, ZeroDivisionError):
            rel = None
    if rel is None or rel < 1:
        raise ConfigError(
            f"balance_rel_threshold must be a finite number >= 1, got {_describe(value)}"
        )
    return rel


@attrs.frozen
class DualThreshold:
    """PR #6533's global gate: imbalanced iff ``max-min > abs`` and ``max > min*rel``.

    ``abs <= 0`` disables the gate (every pin is kept), as in the PR.
    """

    balance_abs_threshold: int = attrs.field()
    balance_rel_threshold: Fraction = attrs.field(default=Fraction(3, 2), converter=_as_rel)

    @balance_abs_threshold.validator
    def _check_abs(self, _a: object, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"balance_abs_threshold must be an integer, got {_describe(value)}")


@attrs.frozen(kw_only=True)
class Config:
    """Validated, immutable balancer options (see the module docstring)."""

    affinity_break_margin: int | None = attrs.field(default=None, converter=validate_margin)
    dual_threshold: DualThreshold | None = attrs.field(default=None)
    max_cache_size: int = attrs.field(default=DEFAULT_MAX_CACHE_SIZE)
    full_determinism: bool = attrs.field(default=False)
    tie_break: TieBreak = attrs.field(default=TieBreak.FIRST, converter=_as_tie_break)
    hash_mode: HashMode = attrs.field(default=HashMode.CALLER, converter=_as_hash_mode)
    lease_accounting: bool = attrs.field(default=False)
    affinity_break_tokens: int | None = attrs.field(default=None, converter=_tokens)
    affinity_break_band_cap: int | None = attrs.field(default=None, converter=_band_cap)
    group_stickiness: GroupStickiness = attrs.field(default=GroupStickiness.OFF,
                                                    converter=_as_group_stickiness)
    group_break_margin: int | None = attrs.field(default=None, converter=_group_margin)
    max_group_cache_size: int = attrs.field(default=DEFAULT_MAX_CACHE_SIZE)
    placement_margin: int | None = attrs.field(default=None, converter=_placement_margin)

    @affinity_break_band_cap.validator
    def _check_band(self, _a: object, cap: int | None) -> None:
        tokens, margin = self.affinity_break_tokens, self.affinity_break_margin
        if tokens is None and cap is None:
            return
        if margin is None:
            raise ConfigError(
                "affinity_break_tokens and affinity_break_band_cap widen the band of "
                "affinity_break_margin, which is null; set the margin too (got "
                f"affinity_break_tokens={tokens!r}, affinity_break_band_cap={cap!r})"
            )
        if tokens is None or cap is None:
            raise ConfigError(
                "affinity_break_tokens and affinity_break_band_cap are set together "
                f"(the cap bounds the skew); got affinity_break_tokens={tokens!r}, "
                f"affinity_break_band_cap={cap!r}"
            )
        if cap < margin:
            raise ConfigError(
                f"affinity_break_band_cap must be an integer >= affinity_break_margin "
                f"({margin}), got {cap!r}"
            )

    @max_cache_size.validator
    def _check_cache(self, _a: object, value: object) -> None:
        _positive_int("max_cache_size", value)

    @max_group_cache_size.validator
    def _check_group_cache(self, _a: object, value: object) -> None:
        _positive_int("max_group_cache_size", value)

    @group_break_margin.validator
    def _check_group_margin(self, _a: object, value: int | None) -> None:
        if value is not None and self.group_stickiness is GroupStickiness.OFF:
            raise ConfigError(
                "group_break_margin applies to group pins, which group_stickiness 'off' "
                f"disables; set group_stickiness to 'fallback' or 'only' (got "
                f"group_break_margin={value!r})")

    @full_determinism.validator
    def _check_det(self, _a: object, value: object) -> None:
        if not isinstance(value, bool):
            raise ConfigError(f"full_determinism must be true or false, got {_describe(value)}")

    @lease_accounting.validator
    def _check_lease(self, _a: object, value: object) -> None:
        if not isinstance(value, bool):
            raise ConfigError(f"lease_accounting must be true or false, got {_describe(value)}")

    @dual_threshold.validator
    def _check_gate(self, _a: object, value: object) -> None:
        if value is not None and not isinstance(value, DualThreshold):
            raise ConfigError(f"dual_threshold must be a DualThreshold, got {_describe(value)}")
        if value is not None and self.affinity_break_margin is not None:
            raise ConfigError(
                "affinity_break_margin and dual_threshold are alternative policies; "
                f"got both (margin={self.affinity_break_margin!r}, gate={value!r})"
            )

    @property
    def policy(self) -> str:
        """``legacy``, ``margin`` or ``dual_threshold`` (R-POL-1)."""
        if self.affinity_break_margin is not None:
            return "margin"
        if self.dual_threshold is not None:
            return "dual_threshold"
        return "legacy"

    @property
    def context_band(self) -> bool:
        """Whether the keep band widens with ``context_tokens`` (R-BAND-1)."""
        return self.affinity_break_tokens is not None and not self.full_determinism

    @property
    def groups(self) -> bool:
        """Whether an acquire's ``group_id`` is read at all (R-GRP-1)."""
        return self.group_stickiness is not GroupStickiness.OFF

    @property
    def prefix_placement(self) -> bool:
        """Whether placements read the acquire's ``cached_prefix`` (R-PFX-1, R-PFX-5)."""
        return self.placement_margin is not None and not self.full_determinism

    @property
    def evaluates_pins(self) -> bool:
        """Whether sticky hits are checked against load at all (R-DET-4)."""
        return self.policy != "legacy" and not self.full_determinism
