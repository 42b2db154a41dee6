"""Balancer options: one validated record from verl's keywords, a router YAML, or both.

Theory of operation
-------------------
The balancer is configured from three places, and all three go through
:func:`parse_options` so they accept the same keys and fail the same way:

* verl's constructor keywords (``servers``, ``max_cache_size``, ``full_determinism``);
* the router YAML of verl's plug-in path, passed whole as the second positional argument
  (it still holds ``router_class``, which is accepted and ignored);
* our own keywords (``affinity_break_margin``, ``tie_break``, ...), including the context
  band's ``affinity_break_tokens`` and ``affinity_break_band_cap`` (SPEC §7.5; the core's
  :class:`~affinity_engine.Config` checks that both come together, with a margin, and
  ``cap >= margin``) and the group pins' ``group_stickiness``, ``group_break_margin`` and
  ``max_group_cache_size`` (SPEC §7.6; the core refuses a group margin with
  ``group_stickiness: off``), and prefix-aware placement's ``placement_margin`` (SPEC
  §8.1) with the adapter's index bounds ``prefix_block_size`` (tokens a block, as vLLM's
  ``block_size``) and ``prefix_index_blocks`` (blocks remembered per server).

Validation happens here, at construction or config load, never on the first request
(R-CFG-1): an unknown key names itself and the accepted keys, and a bad
value names the key, the value and the accepted range. Routing options are checked by
:class:`affinity_engine.Config` itself; this module adds the adapter-only options (the
decision log, whether routing requires it, and the tie-draw seed) and maps names.

Defaults equal verl 0.9.1's ``GlobalRequestLoadBalancer`` exactly, with one choice the
core leaves open: ties are broken by a *draw* (``tie_break="draw"``), which is what 0.9.1's
``random.choice`` does; the draw comes from the adapter's own seeded generator, never
from the core. ``"first"`` reproduces Aug-2026 main and PR #7435 and puts every new
session of an idle pool on the first replica (hazard R-HAZ-1, the avalanche);
``"hashed"`` is deterministic and still spreads.

**Determinism on the router-YAML path.** verl 0.9.1 forwards the trainer's
``actor_rollout_ref.rollout.full_determinism`` only to its own balancer; a plug-in gets
``(servers, yaml_dict)`` and nothing else, so a default here would silently turn a
deterministic run into one with random ties. A router YAML (recognised by its
``router_class`` key, which verl requires) must therefore set ``full_determinism`` itself.
The one trace of the trainer's choice the balancer can see is ``VERL_FULL_DETERMINISM``:
verl's ``run_ppo`` sets it to ``1`` when a rollout's ``full_determinism`` is true and
forwards it (``0`` otherwise) to every Ray actor, this one included. When it is set, a
YAML that disagrees is refused.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from affinity_engine import DEFAULT_MAX_CACHE_SIZE, Config, ConfigError, DualThreshold

__all__ = [
    "ACCEPTED_KEYS",
    "DEFAULT_DECISION_LOG_BACKUPS",
    "DEFAULT_DECISION_LOG_MAX_BYTES",
    "DEFAULT_TIE_BREAK",
    "ROUTER_YAML_MARKER",
    "TRAINER_DETERMINISM_ENV",
    "BalancerOptions",
    "OptionError",
    "parse_options",
]

DEFAULT_TIE_BREAK = "draw"
DEFAULT_DECISION_LOG_MAX_BYTES = 64 << 20
DEFAULT_DECISION_LOG_BACKUPS = 10  # the newest crash and unreplayed runs are kept beyond it
MIN_DECISION_LOG_BYTES = 4096  # the writer's own floor: one header plus a few records
DEFAULT_PREFIX_BLOCK_SIZE = 16  # vLLM's default block_size, in tokens
# Blocks remembered per server: 65,536 blocks of 16 tokens are ~1M tokens of prompt, about
# a large replica's KV pool, in about 8 MiB of index per server.
DEFAULT_PREFIX_INDEX_BLOCKS = 65536

ROUTING_KEYS = (
    "affinity_break_band_cap",
    "affinity_break_margin",
    "affinity_break_tokens",
    "balance_abs_threshold",
    "balance_rel_threshold",
    "full_determinism",
    "group_break_margin",
    "group_stickiness",
    "hash_mode",
    "lease_accounting",
    "max_cache_size",
    "max_group_cache_size",
    "placement_margin",
    "tie_break",
)
ADAPTER_KEYS = ("decision_log", "decision_log_backups", "decision_log_max_bytes",
                "decision_log_required", "prefix_block_size", "prefix_index_blocks", "seed")
IGNORED_KEYS = ("router_class",)  # verl's plug-in path passes the whole YAML dict
ACCEPTED_KEYS: tuple[str, ...] = tuple(sorted((*ROUTING_KEYS, *ADAPTER_KEYS, *IGNORED_KEYS)))
ROUTER_YAML_MARKER = "router_class"  # present in every dict verl's plug-in path passes
# verl's run_ppo exports "1" (a rollout's full_determinism is true) or "0" to every actor.
TRAINER_DETERMINISM_ENV = "VERL_FULL_DETERMINISM"


class OptionError(ConfigError):
    """A balancer option is unknown or out of range (a ``ValueError``)."""


@attrs.frozen
class BalancerOptions:
    """Everything the balancer needs besides its servers."""

    config: Config
    decision_log: Path | None = None
    decision_log_max_bytes: int = DEFAULT_DECISION_LOG_MAX_BYTES
    decision_log_backups: int = DEFAULT_DECISION_LOG_BACKUPS
    decision_log_required: bool = False
    seed: int | None = None
    prefix_block_size: int = DEFAULT_PREFIX_BLOCK_SIZE
    prefix_index_blocks: int = DEFAULT_PREFIX_INDEX_BLOCKS


def _describe(value: object) -> str:
    return f"{value!r} ({type(value).__name__})"


def _int_at_least(key: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise OptionError(f"{key} must be an integer >= {low}, got {_describe(value)}")
    return value


def _log_path(value: object) -> Path | None:
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)) and os.fspath(value) not in ("", b""):
        text = os.fspath(value)
        return Path(text if isinstance(text, str) else os.fsdecode(text))
    raise OptionError(
        f"decision_log must be null or a non-empty file path, got {_describe(value)}"
    )


def _required(value: object, log: Path | None) -> bool:
    if not isinstance(value, bool):
        raise OptionError(f"decision_log_required must be true or false, got {_describe(value)}")
    if value and log is None:
        raise OptionError("decision_log_required: true needs a decision_log path")
    return value


def _seed(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionError(f"seed must be null or an integer, got {_describe(value)}")
    return value


def _gate(merged: Mapping[str, Any]) -> DualThreshold | None:
    abs_threshold = merged.get("balance_abs_threshold")
    rel = merged.get("balance_rel_threshold")
    if abs_threshold is None:
        if rel is not None:
            raise OptionError(
                f"balance_rel_threshold={rel!r} needs balance_abs_threshold "
                "(PR #6533's gate is off without it)"
            )
        return None
    if rel is None:
        return DualThreshold(abs_threshold)
    return DualThreshold(abs_threshold, rel)  # the converter checks rel >= 1


def _merge(
    config: Mapping[str, Any] | None, overrides: Mapping[str, Any], source: str
) -> dict[str, Any]:
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise OptionError(
            f"{source}: the router config must be a mapping of option names to values, "
            f"got {_describe(config)}"
        )
    merged: dict[str, Any] = {}
    for where in (config, overrides):
        for key, value in where.items():
            if not isinstance(key, str) or key not in ACCEPTED_KEYS:
                raise OptionError(
                    f"{source}: unknown option {key!r}; accepted options: "
                    f"{', '.join(ACCEPTED_KEYS)}"
                )
            if key in merged and merged[key] != value:
                raise OptionError(
                    f"{source}: option {key!r} is given twice with different values "
                    f"({merged[key]!r} in the router config, {value!r} as a keyword)"
                )
            merged[key] = value
    return merged


def _router_yaml_determinism(
    merged: Mapping[str, Any], source: str, environ: Mapping[str, str]
) -> None:
    """A router YAML states ``full_determinism``, and agrees with the trainer's when
    ``VERL_FULL_DETERMINISM`` shows it (see the module docstring)."""
    if "full_determinism" not in merged:
        raise OptionError(
            f"{source}: the router YAML must set full_determinism: true or false, to the "
            "value of actor_rollout_ref.rollout.full_determinism; verl 0.9.1 does not pass "
            "the trainer's full_determinism to a router plug-in, so leaving it out would "
            "silently route without determinism"
        )
    chosen = merged["full_determinism"]
    if not isinstance(chosen, bool):
        raise OptionError(
            f"{source}: full_determinism must be true or false, got {_describe(chosen)}")
    trainer = environ.get(TRAINER_DETERMINISM_ENV)
    if trainer not in ("0", "1") or chosen == (trainer == "1"):
        return
    wanted = "true" if trainer == "1" else "false"
    raise OptionError(
        f"{source}: full_determinism: {str(chosen).lower()} disagrees with the trainer: "
        f"{TRAINER_DETERMINISM_ENV}={trainer}, which verl's run_ppo sets to 1 when "
        "actor_rollout_ref.rollout.full_determinism (or reward.reward_model.rollout."
        f"full_determinism) is true and to 0 otherwise; set full_determinism: {wanted} in "
        "the router YAML (accepted values: true, false)"
    )


def parse_options(
    config: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    source: str = "AffinityLoadBalancer",
    environ: Mapping[str, str] | None = None,
) -> BalancerOptions:
    """Validate and map options; raises :class:`OptionError` naming key, value and range.

    ``config`` is a router YAML dict (or None); ``overrides`` are keyword options. A key
    may appear in both only with the same value. ``source`` prefixes every message, e.g.
    the YAML path, so the user knows which file to fix. A router YAML (a ``config`` with
    ``router_class``) must set ``full_determinism``, and it must agree with
    ``VERL_FULL_DETERMINISM`` in ``environ`` (default: ``os.environ``) when that is set.
    """
    merged = _merge(config, overrides or {}, source)
    if config is not None and ROUTER_YAML_MARKER in config:
        _router_yaml_determinism(merged, source, os.environ if environ is None else environ)
    try:
        routing = Config(
            affinity_break_margin=merged.get("affinity_break_margin"),
            dual_threshold=_gate(merged),
            max_cache_size=merged.get("max_cache_size", DEFAULT_MAX_CACHE_SIZE),
            full_determinism=merged.get("full_determinism", False),
            tie_break=merged.get("tie_break", DEFAULT_TIE_BREAK),
            hash_mode=merged.get("hash_mode", "caller"),
            lease_accounting=merged.get("lease_accounting", False),
            affinity_break_tokens=merged.get("affinity_break_tokens"),
            affinity_break_band_cap=merged.get("affinity_break_band_cap"),
            group_stickiness=merged.get("group_stickiness", "off"),
            group_break_margin=merged.get("group_break_margin"),
            max_group_cache_size=merged.get("max_group_cache_size",
                                            DEFAULT_MAX_CACHE_SIZE),
            placement_margin=merged.get("placement_margin"),
        )
        log_path = _log_path(merged.get("decision_log"))
        return BalancerOptions(
            config=routing,
            decision_log=log_path,
            decision_log_max_bytes=_int_at_least(
                "decision_log_max_bytes",
                merged.get("decision_log_max_bytes", DEFAULT_DECISION_LOG_MAX_BYTES),
                MIN_DECISION_LOG_BYTES,
            ),
            decision_log_backups=_int_at_least(
                "decision_log_backups",
                merged.get("decision_log_backups", DEFAULT_DECISION_LOG_BACKUPS),
                0,
            ),
            decision_log_required=_required(merged.get("decision_log_required", False),
                                            log_path),
            seed=_seed(merged.get("seed")),
            prefix_block_size=_int_at_least(
                "prefix_block_size",
                merged.get("prefix_block_size", DEFAULT_PREFIX_BLOCK_SIZE), 1),
            prefix_index_blocks=_int_at_least(
                "prefix_index_blocks",
                merged.get("prefix_index_blocks", DEFAULT_PREFIX_INDEX_BLOCKS), 1),
        )
    except ConfigError as exc:  # OptionError included: add the source once
        message = str(exc)
        if not message.startswith(f"{source}: "):
            message = f"{source}: {message}"
        raise OptionError(message) from None
