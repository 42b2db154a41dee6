"""Explain a divergence in words, with the requirement ids it violates.

Theory of operation
-------------------
When an implementation's choice differs from what the spec allows, the most useful
report says *why the spec decided as it did*, from the spec's own view of the pre-state:
how the acquire classifies (unkeyed, miss, kept hit, broken hit, removed-server hit),
the loads, the band ``min + margin``, the pinned server, and the sticky map's recency
order. Each class maps to the requirements that govern it, and a few recognisable
mistakes are named outright:

* a kept pin at exactly ``min + margin`` that the implementation moved: a strict ``<``
  instead of the inclusive ``<=`` (R-KEEP-1);
* a hit the implementation treated as a miss (it chose a least-loaded server instead of
  the pin): it lost the entry -- usually recency not refreshed on lookup (R-LRU-2);
* a miss the implementation routed to the id's old server: it kept an entry the spec
  evicted (R-LRU-3, and R-LRU-2 for the refresh that decided the eviction order);
* a hit moved under ``full_determinism`` that the margin (band, gate) would break without
  it: the keep rule applied where the spec ignores it (R-DET-4);
* a hit routed to the server the id was pinned to before a break: the break did not
  re-pin (R-BREAK-1, R-BREAK-2), given the ids' earlier pins (``repinned``);
* a different tie than the configured tie-break's (R-TIE-2, R-TIE-3, R-TIE-4);
* with the context band, the band ``min(m + c // T, cap)`` replaces the margin in the
  words: a pin kept where ``c / T`` rounded *up* would keep it is named as a ceiling
  (R-BAND-1), one kept beyond ``min + cap`` as a missing cap (R-BAND-2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from affinity_engine import (
    Acquire,
    Acquired,
    Config,
    Event,
    Lookup,
    Path,
    State,
    classify,
    event_to_json,
)
from affinity_engine.policy import keep_band, keep_pin, tie_index

__all__ = ["describe_event", "explain_acquire", "explain_counters", "explain_state_change",
           "note_repin"]


def describe_event(event: Event) -> str:
    data = event_to_json(event)
    op = data.pop("op")
    data.pop("tie_draw", None)
    data.pop("request_hash", None)
    if op == "acquire":
        context = data.get("context_tokens")
        tail = "" if context is None else f", context_tokens={context}"
        return f"acquire({data.get('request_id')!r}{tail})"
    if op == "release":
        rid = data.get("request_id")
        return f"release({data['server_id']!r}" + (f", request_id={rid!r})" if rid else ")")
    if op in ("add_servers", "remove_servers"):
        return f"{op}({data['server_ids']!r})"
    if op == "observe_loads":
        return f"observe_loads({data['observed']!r})"
    return f"{op}()"


def note_repin(repinned: dict[str, tuple[str, str]], event: Event, outcome: object,
               where: str) -> None:
    """Keep ``repinned`` (id -> (where, pin before)) as :func:`explain_acquire` reads it: a
    break records the pin it overwrote; any other placement of the id forgets it."""
    if not (isinstance(outcome, Acquired) and isinstance(event, Acquire)
            and event.request_id is not None):
        return
    if outcome.path is Path.BROKEN and outcome.previous is not None:
        repinned[event.request_id] = (where, outcome.previous)
    elif outcome.path is not Path.KEPT:
        repinned.pop(event.request_id, None)


def _set(servers: Sequence[str]) -> str:
    return "{" + ", ".join(servers) + "}"


def explain_acquire(config: Config, pre: State, event: Acquire, chosen: str | None,
                    permitted: Sequence[str], reference: str | None,
                    evicted: Mapping[str, tuple[int, str]],
                    repinned: Mapping[str, tuple[str, str]] | None = None,
                    tie_hint: str = "with random ties run --tie-break any",
                    ) -> tuple[str, list[str]]:
    """Words and requirement ids for an acquire whose outcome diverged.

    ``evicted``: request id -> (step index, server) of the spec's evictions so far;
    ``repinned``: request id -> (where, server it was pinned to before) of the spec's last
    break of that id (``where`` as the caller names a step: ``"step 3"``, ``"seq 7"``);
    ``tie_hint``: what to do about random ties, appended to a wrong-tie diagnosis.
    """
    rid = event.request_id
    lookup, pin = classify(config, pre, rid, event.context_tokens)
    loads = dict(pre.pool.items())
    low = pre.pool.min_load if loads else None
    ties = [s for s in loads if loads[s] == low]
    # Did IMPL route as the spec would if ``rid`` were still pinned where it was before
    # the spec's last break of it? Then the break did not re-pin (R-BREAK-1).
    earlier = None if rid is None or repinned is None else repinned.get(rid)
    before = None if earlier is None else earlier[1]
    stale_pin = stale_moved = False
    if (before is not None and before in loads and pin is not None and before != pin
            and chosen is not None and chosen != pin
            and lookup in (Lookup.HIT_KEEP, Lookup.HIT_BREAK)):
        old_kept = keep_pin(config, pre.pool, before, event.context_tokens)
        stale_pin = old_kept and chosen == before
        stale_moved = not old_kept and chosen in ties
    head = "IMPL raised instead of routing" if chosen is None else f"IMPL chose {chosen}"
    if reference is not None:
        spec = f"the spec requires {reference}"
    elif len(permitted) == 1:
        spec = f"the spec requires {permitted[0]}"
    else:
        spec = f"the spec allows {_set(permitted)}"
    words = [f"{head}, {spec}"]
    reqs: list[str] = []
    margin = config.affinity_break_margin
    band = keep_band(config, event.context_tokens) if config.context_band else margin
    band = band if band is not None else 0
    if lookup is Lookup.UNKEYED:
        words.append(f"an unkeyed request goes to a least-loaded server, loads {loads}")
        reqs += ["R-ACQ-8", "R-PLACE-1"]
    elif lookup is Lookup.HIT_REMOVED:
        words.append(f"{rid!r} is pinned to removed server {pin}: the entry is deleted and "
                     "the request placed anew")
        reqs += ["R-ACQ-3", "R-POOL-4"]
    elif lookup is Lookup.MISS:
        if config.full_determinism:
            words.append(f"{rid!r} has no sticky entry: placement ignores load "
                         f"(hash mode {config.hash_mode.value})")
            reqs += ["R-DET-1", "R-DET-2" if config.hash_mode.value == "caller" else "R-DET-3"]
        else:
            words.append(f"{rid!r} has no sticky entry: a least-loaded server, loads {loads}")
            reqs += ["R-ACQ-4", "R-PLACE-1"]
        if rid is not None and rid in evicted and chosen == evicted[rid][1]:
            at, old = evicted[rid]
            words.append(f"{rid!r} (pinned to {old}) was evicted at step {at + 1} because it "
                         "was the least recently used entry; IMPL still routes it to "
                         f"{old}, so it evicted a different entry: recency must follow "
                         "lookups (sticky map oldest first: "
                         f"{[k for k, _ in pre.lru.items()]})")
            reqs += ["R-LRU-3", "R-LRU-2"]
    elif lookup is Lookup.HIT_KEEP:
        assert pin is not None
        if config.full_determinism:
            words.append(f"{rid!r} is pinned to {pin}: under full_determinism every hit keeps "
                         "its pin")
            reqs += ["R-DET-1", "R-DET-4"]
        elif margin is not None:
            bound = (low or 0) + band
            words.append(f"{rid!r} is pinned to {pin}, load {loads[pin]} <= min {low} + "
                         f"{_band_words(config, event, band)} = {bound}: the pin is kept "
                         "(inclusive bound, loads read before the increment)")
            reqs += ["R-BAND-1", "R-KEEP-2"] if config.context_band else ["R-KEEP-1", "R-KEEP-2"]
        elif config.dual_threshold is not None:
            words.append(f"{rid!r} is pinned to {pin}: the gate keeps it (pin on the minimum "
                         "or pool not imbalanced)")
            reqs += ["R-GATE-1"]
        else:
            words.append(f"{rid!r} is pinned to active {pin}: a sticky hit stays, whatever "
                         "the load (margin null)")
            reqs += ["R-ACQ-2", "R-LEG-1"]
        moved_to_minimum = chosen is not None and chosen != pin and chosen in ties
        on_edge = (margin is not None and not config.full_determinism
                   and loads[pin] == (low or 0) + band)
        if (stale_pin or stale_moved) and not (moved_to_minimum and on_edge):
            pass  # named below: the id's pin before a break, not a keep-rule mistake
        elif moved_to_minimum and config.full_determinism and _breaks_without_determinism(
                config, pre, pin, event):
            rule = ("context band" if config.context_band else "margin"
                    if config.affinity_break_margin is not None else "gate")
            words.append(f"IMPL applied the keep rule anyway: at load {loads[pin]} (min "
                         f"{low}) the {rule} would break this pin without full_determinism, "
                         "but under full_determinism the margin, the context band and the "
                         "gate are ignored")
            reqs += ["R-DET-4", "R-BAND-5"] if config.context_band else ["R-DET-4"]
        elif moved_to_minimum and on_edge:
            words.append("the pin sits exactly on the band's edge: a '<' comparison breaks "
                         "here, the spec's '<=' keeps")
        elif moved_to_minimum:
            words.append(f"IMPL behaved as if {rid!r} had no sticky entry; the spec's sticky "
                         f"map (oldest first) is {[k for k, _ in pre.lru.items()]}: a lookup "
                         "must refresh recency, so a recently used entry is not evicted")
            reqs += ["R-LRU-2", "R-LRU-3"]
    else:  # HIT_BREAK
        assert pin is not None
        if margin is not None:
            words.append(f"{rid!r} is pinned to {pin}, load {loads[pin]} > min {low} + "
                         f"{_band_words(config, event, band)} = {(low or 0) + band}: the pin "
                         "must move to a least-loaded server")
            reqs += ["R-KEEP-1", "R-BREAK-1"]
            if config.context_band and chosen == pin:
                found = _band_mistake(config, event, loads[pin] - (low or 0))
                words += found[0]
                reqs = found[1] + reqs
        else:
            words.append(f"{rid!r} is pinned to {pin} in an imbalanced pool and not on the "
                         "minimum: the gate re-pins to a least-loaded server")
            reqs += ["R-GATE-1", "R-BREAK-1"]
    if stale_pin or stale_moved:
        assert earlier is not None
        assert before is not None and pin is not None
        if stale_pin:
            did = f"IMPL still routes it to {before}"
        else:
            did = f"IMPL moved it as a hit on {before} (load {loads[before]}) would move"
        # A pin on the band's edge moved to a least-loaded server: a '<' does that too.
        ambiguous = lookup is Lookup.HIT_KEEP and chosen in ties and margin is not None \
            and not config.full_determinism and loads[pin] == (low or 0) + band
        lead = "or, if IMPL compares with '<=', " if ambiguous else ""
        words.append(f"{lead}the break at {earlier[0]} re-pinned {rid!r} from {before} to "
                     f"{pin}, but {did}: IMPL did not re-pin; a break overwrites the sticky "
                     "entry, and later hits are judged against the new pin only")
        moved = ["R-BREAK-1", "R-BREAK-2"]
        reqs = [*reqs, *moved] if ambiguous else [*moved, *reqs]
    elif (chosen is not None and reference is not None and chosen != reference
            and chosen in permitted):
        which, req = _tie_words(config, event, ties)
        words.append(f"{chosen} is tied at the minimum but the configured tie-break picks "
                     f"{reference} ({which}); {tie_hint}")
        reqs += [req]
    return ": ".join(words[:2]) + ("; " + "; ".join(words[2:]) if words[2:] else ""), reqs


def _tie_words(config: Config, event: Acquire, ties: Sequence[str]) -> tuple[str, str]:
    """How the configured tie-break chooses among ``ties`` (R-TIE-2..4)."""
    mode = config.tie_break.value
    t = len(ties)
    index = tie_index(config, t, event)  # the core's own choice, only put into words here
    if mode == "first":
        return "first in pool order", "R-TIE-2"
    if mode == "hashed" and event.request_id is not None:
        return (f"'hashed': stable_hash({event.request_id!r}) mod {t} = index {index} of the "
                f"tie set {_set(ties)}", "R-TIE-4")
    return (f"'{mode}': tie_draw {event.tie_draw} mod {t} = index {index} of the tie set "
            f"{_set(ties)}", "R-TIE-3" if mode == "draw" else "R-TIE-4")


def _breaks_without_determinism(config: Config, pre: State, pin: str, event: Acquire) -> bool:
    """Whether the keep rule would break this hit if ``full_determinism`` were off."""
    if config.affinity_break_margin is None and config.dual_threshold is None:
        return False
    relaxed = attrs.evolve(config, full_determinism=False)
    return not keep_pin(relaxed, pre.pool, pin, event.context_tokens)


def _band_words(config: Config, event: Acquire, band: int) -> str:
    """``margin m`` or, with the context band, ``band b [min(m + c // T, cap), c = ...]``."""
    if not config.context_band:
        return f"margin {band}"
    c = event.context_tokens
    shown = "c absent, counts as 0" if c is None else f"c = {c}"
    return (f"band {band} [min({config.affinity_break_margin} + {c or 0} // "
            f"{config.affinity_break_tokens}, {config.affinity_break_band_cap}), {shown}]")


def _band_mistake(config: Config, event: Acquire, above: int) -> tuple[list[str], list[str]]:
    """Why an implementation may have kept a pin ``above`` the minimum that the band breaks."""
    m, t, cap = (config.affinity_break_margin or 0, config.affinity_break_tokens or 1,
                 config.affinity_break_band_cap or 0)
    c = event.context_tokens or 0
    if m + c // t > cap and above <= m + c // t:
        return ([f"m + c // T = {m + c // t} exceeds the cap {cap}: an uncapped band keeps "
                 "here, the spec clamps the band to the cap"], ["R-BAND-2", "R-BAND-1"])
    if c % t and above <= min(m + -(-c // t), cap):
        return ([f"c / T = {c}/{t} rounded up gives {m + -(-c // t)}: the spec rounds down "
                 "(integer division)"], ["R-BAND-1"])
    if event.context_tokens is None and above <= cap:
        return (["the acquire carried no context_tokens, which counts as c = 0: the band "
                 "never widens on a guess"], ["R-BAND-1"])
    return [], ["R-BAND-1"]


_CHANGE_REQUIREMENTS = {
    "release": ["R-RLS-1", "R-CONS-1"],
    "add_servers": ["R-POOL-1", "R-POOL-2"],
    "remove_servers": ["R-POOL-3"],
    "clear_sticky_cache": ["R-CLR-1", "R-LRU-4"],
    "observe_loads": ["R-OBS-1"],
    "acquire": ["R-ACQ-7"],
}
_FIELD_REQUIREMENTS = {
    "affinity_kept": ["R-CNT-1", "R-CNT-3"], "affinity_broken": ["R-CNT-1", "R-CNT-3"],
    "sticky_entries": ["R-LRU-3", "R-LRU-5"], "registered_handles": ["R-STAT-1", "R-POOL-1"],
    "unknown_leases": ["R-LEASE-3", "R-LEASE-6"], "stale_leases": ["R-LEASE-3", "R-LEASE-6"],
    "external_loads": ["R-OBS-2"], "affinity_break_margin": ["R-STAT-1"],
    "group_entries": ["R-GRP-4", "R-LRU-3"], "group_kept": ["R-GRP-5"],
    "group_broken": ["R-GRP-5"], "cleared_groups": ["R-GRP-5"],
}


def explain_state_change(op: str, field: str, expected: object,
                         actual: object) -> tuple[str, list[str]]:
    """Words and ids for an observation (status, clear result) that diverged."""
    reqs = list(_CHANGE_REQUIREMENTS.get(op, []))
    reqs += _FIELD_REQUIREMENTS.get(field, ["R-STAT-1"])
    words = f"{field}: IMPL reports {actual!r}, the spec has {expected!r}"
    if op == "release" and field in ("servers", "total_inflight"):
        words += ("; a release of an unknown server or of a count at 0 changes nothing, "
                  "otherwise it lowers exactly that count by one")
    return words, reqs


def explain_counters(config: Config, pre: State, event: Acquire, field: str,
                     expected: Mapping[str, Any], actual: Mapping[str, Any],
                     evicted: Mapping[str, tuple[int, str]],
                     repinned: Mapping[str, tuple[str, str]] | None = None,
                     ) -> tuple[str, list[str]]:
    """An acquire that chose the right server but took a different sticky path.

    ``expected``/``actual`` are the spec's and the implementation's status views. When both
    report both counters, their sums tell a hit from a miss: equal sums mean the two agree
    there was a sticky hit but not on keeping it (the keep rule); a different sum means
    they disagree on whether the entry exists (the LRU).
    """
    lookup, pin = classify(config, pre, event.request_id, event.context_tokens)
    rid = event.request_id
    order = [k for k, _ in pre.lru.items()]
    head = f"{field}: IMPL reports {actual.get(field)!r}, the spec has {expected.get(field)!r}"
    keys = ("affinity_kept", "affinity_broken")
    if not all(isinstance(actual.get(k), int) for k in keys):
        return (f"{head} (the spec classifies this acquire as {lookup.value})",
                ["R-CNT-1", "R-CNT-3"])
    theirs = actual["affinity_kept"] + actual["affinity_broken"]
    ours = expected["affinity_kept"] + expected["affinity_broken"]
    if theirs == ours and lookup in (Lookup.HIT_KEEP, Lookup.HIT_BREAK):
        assert pin is not None
        decided = "kept" if lookup is Lookup.HIT_KEEP else "broken"
        loads = dict(pre.pool.items())
        words = (f"{head}: both saw a sticky hit on {pin}, but the spec's keep rule says "
                 f"{decided} and IMPL counted the other (the re-pin landed on the same "
                 f"server), loads {loads}")
        margin = config.affinity_break_margin
        reqs = ["R-KEEP-1", "R-CNT-1"] if margin is not None else ["R-GATE-1", "R-CNT-1"]
        if config.context_band:
            margin = keep_band(config, event.context_tokens)
            reqs = ["R-BAND-1", "R-CNT-1"]
        earlier = None if rid is None or repinned is None else repinned.get(rid)
        before = None if earlier is None else earlier[1]
        stale = (lookup is Lookup.HIT_KEEP and earlier is not None and before is not None
                 and pin is not None and before != pin and before in loads
                 and not keep_pin(config, pre.pool, before, event.context_tokens))
        on_edge = margin is not None and loads[pin] == pre.pool.min_load + margin
        if on_edge:
            words += ("; the pin sits exactly on the band's edge: a '<' comparison breaks "
                      "here, the spec's '<=' keeps")
        if stale:
            assert earlier is not None and before is not None
            lead = "or, if IMPL compares with '<=', " if on_edge else ""
            words += (f"; {lead}the break at "
                      f"{earlier[0]} re-pinned {rid!r} from {before} to {pin}, but IMPL "
                      f"judged this hit against {before} (load {loads[before]}), which "
                      "breaks: IMPL did not re-pin; a break overwrites the sticky entry, "
                      "and later hits are judged against the new pin only")
            moved = ["R-BREAK-1", "R-BREAK-2"]
            reqs = [*reqs, *moved] if on_edge else [*moved, *reqs]
        return words, reqs
    if theirs > ours:
        why = (f"evicted at step {evicted[rid][0] + 1} as the least recently used entry"
               if rid is not None and rid in evicted else "not in the sticky map")
        return (f"{head}: IMPL counted a sticky hit for {rid!r}, which the spec has {why}: "
                "IMPL kept an entry the spec evicted, so it evicted a different one; recency "
                f"must follow lookups (spec's sticky map, oldest first: {order})",
                ["R-LRU-2", "R-LRU-3", "R-CNT-1"])
    if theirs < ours:
        return (f"{head}: the spec has a sticky hit for {rid!r} (pinned to {pin}) that IMPL "
                "did not count: IMPL lost the entry; a lookup must refresh recency so a "
                f"recently used entry is not evicted (spec's sticky map, oldest first: {order})",
                ["R-LRU-2", "R-LRU-3", "R-CNT-1"])
    return (f"{head} (the spec classifies this acquire as {lookup.value})",
            ["R-CNT-1", "R-CNT-3"])
