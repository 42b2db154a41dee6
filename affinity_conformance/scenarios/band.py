"""Suite ``band``: the context-aware keep band (SPEC section 7.5, R-BAND-1..5).

With margin ``m``, ``affinity_break_tokens = T`` and ``affinity_break_band_cap = cap``, a
sticky hit on an active pin ``p`` is kept iff ``L[p] <= min(L) + min(m + c // T, cap)``,
where ``c`` is the acquire's ``context_tokens`` (absent counts as 0). Most cases pin
session ``a`` to ``s0``, raise ``s0`` to a chosen height above an idle pool with filler
requests, and send one hit with a chosen ``c``; the expected path (``kept`` on ``s0`` or
``broken`` to ``s1``) was worked out by hand from that formula. The boundaries are those a
wrong implementation gets wrong: ``c = T - 1`` (a ceiling rounds up and keeps), ``c = T``
and ``kT`` (exactly one / k more requests of band), a huge ``c`` (an uncapped band keeps
anything), ``c`` absent (a band that guesses). Every case needs feature ``context_band``,
so an implementation without the band reports the suite unsupported, not failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from affinity_conformance.scenario import Scenario, ScenarioError
from affinity_engine import DualThreshold

SUITE = "band"
HUGE = 10**12  # beyond any real prompt, still exact as a double for non-Python consumers


def _s(case: str, description: str, reqs: str, **options: Any) -> Scenario:
    return Scenario(SUITE, case, description, requirements=reqs.split(), **options)


def _band(m: int, t: int, cap: int, **options: Any) -> dict[str, Any]:
    return {"affinity_break_margin": m, "affinity_break_tokens": t,
            "affinity_break_band_cap": cap, **options}


def _hit(case: str, description: str, reqs: str, options: dict[str, Any], height: int,
         context: int | None, path: str) -> Scenario:
    """Pin ``a`` to s0, raise s0 to ``height`` over an idle s1, s2, then hit with ``c``."""
    expect = "s0" if path == "kept" else "s1"
    return (_s(case, description, reqs, **options)
            .acquire("a", expect="s0").fill(s0=height, s1=0, s2=0)
            .acquire("a", context=context, expect=expect, path=path).check())


def cases() -> Iterator[Scenario]:
    yield from _boundaries()
    yield from _cap()
    yield from _monotone()
    yield from _ignored()
    yield from _determinism()
    yield _malformed()


def _boundaries() -> Iterator[Scenario]:
    """R-BAND-1: m = 1, T = 100, cap = 4; the pin sits 2 above the minimum unless stated."""
    opts = _band(1, 100, 4)
    for name, context, path, why in (
            ("absent_counts_as_zero", None, "broken",
             "an acquire without context_tokens counts as c = 0: band = m = 1 < 2, the band "
             "never widens on a guess"),
            ("zero_is_the_margin", 0, "broken", "c = 0: band = m = 1 < 2"),
            ("t_minus_1_rounds_down", 99, "broken",
             "c = T - 1 = 99: 99 // 100 = 0, band 1 < 2 (a ceiling would give 2 and keep)"),
            ("t_widens_by_one", 100, "kept",
             "c = T = 100: band = 1 + 1 = 2, the pin at min + 2 is kept (inclusive bound)"),
            ("just_over_t", 101, "kept", "c = T + 1: band 2, kept")):
        yield _hit(f"context_{name}", f"Margin 1, T 100, cap 4, pin 2 above the minimum: "
                   f"{why}.", "R-BAND-1 R-KEEP-2 R-BREAK-1", opts, 2, context, path)
    for context, path in ((299, "broken"), (300, "kept")):
        yield _hit(f"context_3t_{'minus_1_' if context % 100 else ''}{path}",
                   f"Margin 1, T 100, cap 4, pin 4 above the minimum: c = {context} gives "
                   f"band min(1 + {context // 100}, 4) = {min(1 + context // 100, 4)}, so the "
                   f"hit is {path} (c = kT widens by exactly k).",
                   "R-BAND-1 R-KEEP-2 R-BREAK-1", opts, 4, context, path)
    yield (_s("context_never_moves_a_placement",
              "New requests with any context go to a least-loaded server: the band judges "
              "sticky hits only, never where a miss is placed.",
              "R-BAND-1 R-PLACE-1 R-ACQ-4", **opts)
           .acquire("a", context=HUGE, expect="s0").acquire("b", context=0, expect="s1")
           .acquire("c", context=100, expect="s2").acquire("d", expect="s0")
           .acquire("a", context=HUGE, expect="s0", path="kept").check())
    yield (_s("broken_hit_repins_and_later_hits_judge_the_new_pin",
              "A hit broken for want of context moves to a least-loaded server; the next hit, "
              "with enough context, is judged against the new pin and kept.",
              "R-BAND-1 R-BREAK-1 R-BREAK-2 R-CNT-1", **opts)
           .acquire("a", expect="s0").fill(s0=3, s1=0, s2=0)
           .acquire("a", context=50, expect="s1", path="broken").fill(s1=3, s2=1)
           .acquire("a", context=100, expect="s1", path="kept").assert_counters(1, 1).check())


def _cap() -> Iterator[Scenario]:
    """R-BAND-2: the cap bounds the band, whatever c."""
    opts = _band(1, 100, 4)
    yield _hit("huge_context_kept_at_cap",
               f"Margin 1, T 100, cap 4, c = {HUGE}: band min(1 + 10^10, 4) = 4; the pin at "
               "exactly min + 4 is kept.", "R-BAND-2 R-BAND-1 R-KEEP-2", opts, 4, HUGE, "kept")
    yield _hit("huge_context_broken_past_cap",
               f"Margin 1, T 100, cap 4, c = {HUGE}: band 4; the pin at min + 5 breaks "
               "(an uncapped band would keep it: skew must stay within min + cap).",
               "R-BAND-2 R-BAND-1 R-BREAK-1", opts, 5, HUGE, "broken")
    yield _hit("cap_equal_to_margin_never_widens",
               "cap = m = 2 (T 1, c 1000): the band stays at the margin, so a pin at min + 3 "
               "breaks as with the margin alone.", "R-BAND-2 R-CFG-6 R-BREAK-1",
               _band(2, 1, 2), 3, 1000, "broken")
    arrivals = _s("arrivals_with_huge_context_stay_within_cap_plus_1",
                  "Margin 0, T 1, cap 2, every acquire with a huge context, no releases: every "
                  "kept pin is within min + 2 before its acquire, so max - min <= cap + 1 "
                  "throughout.", "R-BAND-2 R-SKEW-1", **_band(0, 1, 2))
    for rid in "abcaabbaaacbbbaaaa":
        arrivals.acquire(rid, context=HUGE).assert_spread(3)
    yield arrivals


def _monotone() -> Iterator[Scenario]:
    """R-BAND-4: monotone in c and in 1/T; never below the margin (selectivity)."""
    for context in (0, 10, 19, 20, 35, HUGE):
        band = min(context // 10, 3)
        path = "kept" if band >= 2 else "broken"
        yield _hit(f"monotone_in_context_{'huge' if context == HUGE else context}_{path}",
                   f"Monotonicity in c (margin 0, T 10, cap 3, pin 2 above the minimum): "
                   f"c = {context} gives band {band}, {path}; every larger c keeps what a "
                   "smaller c keeps.", "R-BAND-4 R-BAND-1", _band(0, 10, 3), 2, context, path)
    for tokens in (1, 5, 10, 11, 20):
        band = min(20 // tokens, 3)
        path = "kept" if band >= 2 else "broken"
        yield _hit(f"monotone_in_tokens_t{tokens}_{path}",
                   f"Monotonicity in 1/T (margin 0, cap 3, c = 20, pin 2 above the minimum): "
                   f"T = {tokens} gives band {band}, {path}; a smaller T keeps what a larger "
                   "T keeps.", "R-BAND-4 R-BAND-1", _band(0, tokens, 3), 2, 20, path)
    select = _s("pin_within_margin_is_never_broken",
                "Selectivity: margin 2 (T 1000, cap 5): a pin at min + 2 is kept with c "
                "absent, 0 or 999 -- the band is never narrower than the margin.",
                "R-BAND-4 R-KEEP-1", **_band(2, 1000, 5))
    select.acquire("a", expect="s0").fill(s0=2, s1=0, s2=0)
    for given in (None, 0, 999):
        select.acquire("a", context=given, expect="s0", path="kept").release("s0")
    yield select.check()


def _same_outcomes(make: Callable[[], Scenario],
                   script: Callable[[Scenario, bool], Scenario]) -> Scenario:
    """Run ``script`` with and without contexts; the outcomes must agree (R-BAND-3)."""
    plain, carried = script(make(), False), script(make(), True)
    carried.hand_checks += 1
    if plain.outcomes != carried.outcomes:
        raise ScenarioError(f"{carried.case}: context_tokens changed outcomes without a band: "
                            f"{plain.outcomes} vs {carried.outcomes}")
    return carried


def _ignored_script(run: Scenario, carry: bool) -> Scenario:
    def c(value: int) -> int | None:
        return value if carry else None
    return (run.acquire("a", context=c(0)).acquire("b", context=c(HUGE))
            .fill(s0=3, s1=1, s2=0).acquire("a", context=c(HUGE)).acquire("b", context=c(7))
            .acquire("x", context=c(HUGE)).release("s0").acquire("a", context=c(1)).check())


def _ignored() -> Iterator[Scenario]:
    """R-BAND-3: with affinity_break_tokens null, context_tokens is ignored everywhere."""
    for name, options, reqs in (
            ("legacy", {}, "R-LEG-1"),
            ("margin", {"affinity_break_margin": 1}, "R-KEEP-1 R-BREAK-1"),
            ("gate", {"dual_threshold": DualThreshold(1, 1)}, "R-GATE-1")):
        def make(name: str = name, options: dict[str, Any] = options,
                 reqs: str = reqs) -> Scenario:
            return _s(f"ignored_without_tokens_{name}",
                      f"Policy {name}, affinity_break_tokens null: the same trace with and "
                      "without context_tokens (0, huge, 7, 1) has the same outcomes and states "
                      "(the generator ran both).", f"R-BAND-3 {reqs}", **options)
        yield _same_outcomes(make, _ignored_script)
    yield _hit("margin_without_tokens_breaks_whatever_the_context",
               f"Margin 1, T null, pin 2 above the minimum, c = {HUGE}: broken, as with "
               "no context (R-KEEP-1 exactly).", "R-BAND-3 R-KEEP-1 R-BREAK-1",
               {"affinity_break_margin": 1}, 2, HUGE, "broken")


def _determinism() -> Iterator[Scenario]:
    """R-BAND-5: under full_determinism the band is ignored like the margin."""
    for context in (0, HUGE):
        yield (_s(f"full_determinism_ignores_band_c{'huge' if context else 0}",
                  f"full_determinism with margin 0, T 1, cap 1 and c = {context}: every hit "
                  "keeps its pin, however loaded (R-DET-4), whatever the context.",
                  "R-BAND-5 R-DET-4 R-DET-1", full_determinism=True, **_band(0, 1, 1))
               .acquire("a", request_hash=0, expect="s0").fill(s0=5)
               .acquire("a", request_hash=0, context=context, expect="s0", path="kept")
               .check())


def _malformed() -> Scenario:
    """R-EV-2: context_tokens must be null or an integer >= 0 (booleans are not integers)."""
    run = _s("malformed_context_tokens_are_refused",
             "Ill-formed context_tokens are refused by the decoder, naming the field; the "
             "well-formed acquires around them run normally.",
             "R-EV-2 R-CODEC-1 R-BAND-1", **_band(0, 10, 2))
    run.acquire("a", context=0, expect="s0")
    for bad in (-1, True, 1.5, "12", [12]):
        run.bad_event({"op": "acquire", "request_id": "a", "context_tokens": bad},
                      "context_tokens")
    return run.acquire("a", context=10, expect="s0", path="kept").check()
