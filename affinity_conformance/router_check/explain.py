"""Why a router's choice diverged, and which band decisions a trace exercised.

Theory of operation
-------------------
When a router's choice lies outside the spec's allowed set (R-REL-1), the report explains
it from the spec's view of the pre-state, in the claim's own terms:

* a kept pin the router moved: under a margin claim the gap and the margin (R-KEEP-1); under
  a context-band claim the band ``min(m + c // T, cap)`` with its numbers, from
  :func:`affinity_conformance.diagnosis.explain_acquire`, and what the router did instead
  -- moved a pin above ``min + m`` that only ``c`` keeps, as a router without the band or
  one that did not count the prompt's token ids would (R-BAND-1);
* a pin the spec breaks and the router kept: under a band claim ``explain_acquire`` names
  a missing cap (R-BAND-2) or ``c / T`` rounded up (R-BAND-1); under a margin claim, if the
  request carried token ids, the words add that a router with an unclaimed context band
  would keep it;
* a re-placed pin after pool changes or failures: a hash ring that re-maps, or a circuit
  breaker (R-POOL-*);
* otherwise :func:`~affinity_conformance.diagnosis.explain_acquire`, plus the *load
  views*: the loads the router would have seen under common accounting mistakes (streams
  finished at their first chunk; failed requests never released; load = sessions placed,
  as vllm-router's sticky_least_loaded; requests ever routed). Each view under which the
  router's choice is a least-loaded server is listed, so a maintainer sees which counter
  to look at.

:func:`count_band` tallies, for a band claim, the hits decided by the band itself, so a
passing run shows that it met the decisions a margin-only router gets wrong.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import attrs

from affinity_conformance.diagnosis import explain_acquire
from affinity_engine import Acquire, Config, Lookup, State, classify

__all__ = ["Placed", "count_band", "explain_choice", "load_views"]


@attrs.define
class Placed:
    cid: str
    server: str
    session: str
    stream: bool
    task: asyncio.Task[str]
    released: bool = False
    failed: bool = False


def load_views(state: State, placed: Sequence[Placed], routed: dict[str, int]
               ) -> dict[str, dict[str, int]]:
    """The loads the router would see under each accounting (see the module docstring)."""
    active = [s for s, _ in state.pool.items()]
    spec = {s: state.pool.load(s) for s in active}
    live = [p for p in placed if p.server in spec]
    streams = {s: spec[s] - sum(1 for p in live if p.server == s and p.stream
                                and not p.released) for s in active}
    failed = {s: spec[s] + sum(1 for p in live if p.server == s and p.failed) for s in active}
    pins: dict[str, str] = {}
    for p in placed:
        pins[p.session] = p.server
    sessions = {s: sum(1 for v in pins.values() if v == s) for s in active}
    return {"in-flight requests (the spec)": spec,
            "streams counted finished at their first chunk": streams,
            "failed requests never released": failed,
            "sessions placed per backend (sticky_least_loaded's load)": sessions,
            "requests ever routed": {s: routed.get(s, 0) for s in active}}


def _minimal_views(views: dict[str, dict[str, int]], chosen: str) -> tuple[str, ...]:
    return tuple(name for name, loads in views.items()
                 if loads and chosen in loads and loads[chosen] == min(loads.values()))


def count_band(config: Config, state: State, event: Acquire, counts: dict[str, int]) -> None:
    """Tally the band decisions a trace met, so a passing run shows what it exercised:
    hits kept only because of the context (load above ``min + m``), hits broken only
    because of the cap (an uncapped band keeps) or of rounding down (``c / T`` rounded up
    keeps)."""
    if not config.context_band:
        return
    lookup, pin = classify(config, state, event.request_id, event.context_tokens)
    if lookup not in (Lookup.HIT_KEEP, Lookup.HIT_BREAK) or pin is None:
        return
    m, t = config.affinity_break_margin or 0, config.affinity_break_tokens or 1
    cap, c = config.affinity_break_band_cap or 0, event.context_tokens or 0
    gap = state.pool.load(pin) - state.pool.min_load
    counts["hits"] = counts.get("hits", 0) + 1
    if lookup is Lookup.HIT_KEEP and gap > m:
        counts["kept_by_band"] = counts.get("kept_by_band", 0) + 1
    elif lookup is Lookup.HIT_BREAK and gap <= m + c // t:
        counts["broken_by_cap"] = counts.get("broken_by_cap", 0) + 1
    elif lookup is Lookup.HIT_BREAK and gap <= min(m + -(-c // t), cap):
        counts["broken_by_rounding_down"] = counts.get("broken_by_rounding_down", 0) + 1


def _keep_reason(config: Config, state: State, pin: str) -> str:
    if config.full_determinism:
        return "under full_determinism every hit keeps its pin"
    margin = config.affinity_break_margin
    if margin is None:
        return "legacy: a pin is never moved for load"
    return (f"load {state.pool.load(pin)} <= min {state.pool.min_load} + margin {margin}")


def explain_choice(config: Config, state: State, event: Acquire, chosen: str, pool: tuple[str, ...],
             permitted: frozenset[str], views: dict[str, dict[str, int]],
             failures: dict[str, int], evicted: dict[str, tuple[int, str]],
             changes: Sequence[str] = ()) -> tuple[str, list[str], tuple[str, ...]]:
    """Words, requirement ids and consistent load views for a choice outside the set."""
    ordered = [s for s in pool if s in permitted]
    lookup, pin = classify(config, state, event.request_id, event.context_tokens)
    if lookup is Lookup.HIT_KEEP and pin is not None and config.context_band:
        return _explain_band_keep(config, state, event, chosen, pin, ordered, evicted)
    if lookup is Lookup.HIT_KEEP and pin is not None and not config.full_determinism \
            and config.affinity_break_margin is not None:
        gap = state.pool.load(pin) - state.pool.min_load
        text = (f"the router chose {chosen}, the spec requires {pin}: {event.request_id!r} is "
                f"pinned to {pin} at load {state.pool.load(pin)}, {gap} above the minimum "
                f"{state.pool.min_load}, inside the claimed margin "
                f"{config.affinity_break_margin} (inclusive, loads before this request): the "
                f"pin must be kept. The router moved it, as a router with margin < {gap} would")
        if state.pool.load(chosen) != state.pool.min_load:
            text += ", and not even to a least-loaded server"
        return text, ["R-KEEP-1", "R-KEEP-4"], ()
    if lookup is Lookup.HIT_KEEP and pin is not None:
        text = (f"the router chose {chosen}, the spec requires {pin}: {event.request_id!r} is "
                f"pinned to active {pin} and the claim keeps the pin "
                f"({_keep_reason(config, state, pin)}); the router re-placed the session "
                "although no pool change was made")
        failed = failures.get(pin, 0)
        if changes and not failed:
            text = text.replace("although no pool change was made",
                                f"after the pool changed ({'; '.join(changes)}), although its pin "
                                "stayed active: the spec's sticky map is untouched by pool "
                                "changes, so a pin on an active server is kept (a hash ring "
                                "that re-maps keys when a backend comes back breaks this)")
            return text, ["R-ACQ-2", "R-POOL-2", "R-DET-1" if config.full_determinism
                          else "R-POOL-3"], ()
        if failed:
            text += (f". {failed} request(s) failed on {pin} earlier in this trace: the router "
                     f"appears to take a backend out of rotation after failures (circuit "
                     f"breaker / health demotion) -- the spec knows only explicit pool changes, "
                     f"so such a router must report it as remove_servers, or keep pins")
            return text, ["R-ACQ-2", "R-POOL-3", "R-POOL-4"], ()
        return text, ["R-ACQ-2", "R-KEEP-1" if config.affinity_break_margin is not None
                      else "R-LEG-1", "R-LRU-2"], ()
    text, reqs = explain_acquire(config, state, event, chosen, ordered, None, evicted)
    text = text.replace("IMPL", "the router")
    if (lookup is Lookup.HIT_BREAK and chosen == pin and not config.context_band
            and event.context_tokens):
        text += (f"; the request carried a prompt of {event.context_tokens} token ids: a "
                 "router with a context band (SPEC §7.5, R-BAND-1) keeps such a pin, so the "
                 "router may apply a band that the claim does not state")
    return text, reqs, _minimal_views(views, chosen)


def _explain_band_keep(config: Config, state: State, event: Acquire, chosen: str, pin: str,
                       ordered: list[str], evicted: dict[str, tuple[int, str]]
                       ) -> tuple[str, list[str], tuple[str, ...]]:
    """A pin the claimed context band keeps and the router moved: the band's words come
    from :func:`explain_acquire` (``min(m + c // T, cap)`` with the numbers); then what
    the router did instead, as a rule it may implement."""
    m = config.affinity_break_margin or 0
    gap = state.pool.load(pin) - state.pool.min_load
    c = event.context_tokens
    if gap <= m:  # inside the margin itself: no band is needed, so a lost entry is likelier
        text, reqs = explain_acquire(config, state, event, chosen, ordered, None, evicted)
        text = text.replace("IMPL", "the router")
        text += f". The pin is within the margin {m} itself, which the band never narrows"
        return text, ["R-BAND-4", "R-KEEP-1", *reqs], ()
    # Above the margin only c keeps the pin, so the likely rule is a missing band, not a
    # lost sticky entry: ask for the band's words as if the router had kept the pin (which
    # leaves out explain_acquire's lost-entry guess), then name the real choice.
    text, reqs = explain_acquire(config, state, event, pin, ordered, None, evicted)
    text = text.replace(f"IMPL chose {pin},", f"the router chose {chosen},", 1).replace(
        "IMPL", "the router")
    text += (f". The router moved it, as a router without the context band (margin {m}) or "
             f"one that did not count the prompt's {c or 0} token ids would")
    if state.pool.load(chosen) != state.pool.min_load:
        text += ", and not even to a least-loaded server"
    return text, ["R-BAND-1", *reqs], ()


