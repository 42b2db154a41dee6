"""Negative controls of the input tables (obligation 19: events, encoding, derived flags).

Theory of operation
-------------------
:mod:`.input_table` checks three things no BFS edge sees: which event field values the
constructors refuse (R-EV-2), the encoding's round trip and omissions (R-CODEC-1), and the
flags a configuration derives (``policy``, ``context_band``, ``evaluates_pins``). Each
check has a control here that patches the real core where it does that job, and the same
check, in the same run, must find a problem with it applied:

* ``tie_draw_negative_accepted``: the events' integer check is a no-op, so an acquire
  takes ``tie_draw = -1`` (the check of R-EV-2 reaches the constructors through the
  module, as every event's ``__init__`` does);
* ``request_hash_zero_not_encoded``: the encoder treats ``request_hash = 0`` as absent,
  so a caller hash of 0 decodes as null and a ``full_determinism`` replay is rejected;
* ``context_band_under_determinism``: ``Config.context_band`` forgets R-BAND-5;
* ``needs_draw_forgets_hashed_unkeyed``: ``needs_draw`` (the reference's and the
  engine's) says an unkeyed acquire under ``hashed`` needs no draw, so a driver would
  send every such request to the first of the tied servers (R-TIE-5);
* ``cache_default_shifted``: a configuration that names no ``max_cache_size`` gets 10001
  (the third audit's survivor ``operator_cache_default``: no check read SPEC's Default column).

They belong to obligation 19 only, which has no BFS search, so they add no BFS job.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

from affinity_engine import Config

from .mutants_base import Mutant, patched

__all__ = ["INPUT_MUTANTS"]

events_mod = importlib.import_module("affinity_core.events")
config_mod = importlib.import_module("affinity_core.config")
codec_mod = importlib.import_module("affinity_engine.codec")


def _tie_draw_negative_accepted() -> Iterator[None]:
    def lenient(instance: object, field: object, value: object) -> None:
        return None

    # attrs' generated __init__ reads each field's validator from its own globals at call
    # time, so the reference's validator is replaced where Acquire calls it.
    validators = events_mod.Acquire.__init__.__globals__
    with patched(validators, "__attr_validator_tie_draw", lenient):
        yield


def _request_hash_zero_not_encoded() -> Iterator[None]:
    original = codec_mod.event_to_json

    def mutated(event: Any) -> dict[str, Any]:
        out: dict[str, Any] = original(event)
        if out.get("request_hash") == 0:
            del out["request_hash"]
        return out

    with patched(codec_mod, "event_to_json", mutated):
        yield


def _context_band_under_determinism() -> Iterator[None]:
    def context_band(self: Config) -> bool:
        return self.affinity_break_tokens is not None

    with patched(Config, "context_band", property(context_band)):
        yield


def _needs_draw_forgets_hashed_unkeyed() -> Iterator[None]:
    import affinity_core
    import affinity_engine
    from affinity_core.config import TieBreak

    def narrow(config: Config, request_id: str | None) -> bool:
        return not config.full_determinism and config.tie_break is TieBreak.DRAW

    with patched(affinity_core, "needs_draw", narrow), \
            patched(affinity_engine, "needs_draw", narrow):
        yield


def _cache_default_shifted() -> Iterator[None]:
    original = config_mod.Config

    def shifted(**kwargs: Any) -> Config:
        kwargs.setdefault("max_cache_size", 10001)
        built: Config = original(**kwargs)
        return built

    with patched(config_mod, "Config", shifted):
        yield


INPUT_MUTANTS: tuple[Mutant, ...] = (
    Mutant("tie_draw_negative_accepted", "an acquire accepts a negative tie_draw", (19,),
           _tie_draw_negative_accepted),
    Mutant("request_hash_zero_not_encoded", "the encoding omits request_hash 0 (decodes as "
           "null)", (19,), _request_hash_zero_not_encoded),
    Mutant("context_band_under_determinism", "Config.context_band is true under "
           "full_determinism", (19,), _context_band_under_determinism),
    Mutant("needs_draw_forgets_hashed_unkeyed", "needs_draw is false for an unkeyed acquire "
           "under hashed ties", (19,), _needs_draw_forgets_hashed_unkeyed),
    Mutant("cache_default_shifted", "max_cache_size defaults to 10001, not SPEC's 10000",
           (19,), _cache_default_shifted),
)
