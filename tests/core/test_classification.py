"""How an acquire meets the sticky map: the lookup classes and their rules.

``ACQUIRE_RULES`` is the transition table as data (R-ACQ-1); each scenario reaches one
class by a literal event sequence and checks that ``classify`` names it and that the
step takes exactly the path, pin write and counter the table promises.
"""

from __future__ import annotations

import pytest

from affinity_engine import ACQUIRE_RULES, Lookup, Path, classify

from .driver import Run


def reach(lookup: Lookup) -> tuple[Run, str | None]:
    """A margin-0 run whose next acquire of the returned id falls in ``lookup``."""
    run = Run.of(affinity_break_margin=0)
    if lookup is Lookup.UNKEYED:
        return run, None
    if lookup is Lookup.MISS:
        return run, "fresh"
    run.acquire("conv", expect="s0")
    if lookup is Lookup.HIT_BREAK:
        return run, "conv"  # s0 holds 1, the others 0: above min + 0
    if lookup is Lookup.HIT_KEEP:
        return run.set_loads(s1=1, s2=1), "conv"
    return run.remove("s0"), "conv"


_GROUP_LOOKUPS = (Lookup.GROUP_MISS, Lookup.GROUP_KEEP, Lookup.GROUP_BREAK,
                  Lookup.GROUP_REMOVED)


@pytest.mark.parametrize("lookup", [lookup for lookup in Lookup if lookup not in _GROUP_LOOKUPS])
def test_each_class_follows_its_rule(lookup: Lookup) -> None:
    """R-ACQ-1, R-ACQ-2, R-ACQ-3, R-ACQ-7, R-CNT-1, R-CNT-3: the class decides the path,
    whether the pin is written, and which counter moves."""
    run, rid = reach(lookup)
    assert classify(run.config, run.state, rid)[0] is lookup
    rule = ACQUIRE_RULES[lookup]
    before_counters, before_lru = run.counters, run.lru
    run.acquire(rid, path=rule.path)
    kept, broken = (a - b for a, b in zip(run.counters, before_counters, strict=True))
    assert (kept, broken) == ((1, 0) if rule.path is Path.KEPT else
                              (0, 1) if rule.path is Path.BROKEN else (0, 0))
    if rid is None:
        assert run.lru == before_lru
    elif rule.write_pin:  # pinned anew: most recent, and not to the old (if any) server
        assert run.lru[-1][0] == rid and run.lru[-1][1] != dict(before_lru).get(rid)
    else:  # a kept hit only refreshes recency
        assert run.lru[-1] == (rid, dict(before_lru)[rid])


def test_the_table_has_one_rule_per_class() -> None:
    """R-ACQ-1: the table is total over the lookup classes and the paths are distinct."""
    assert set(ACQUIRE_RULES) == set(Lookup)
    assert {rule.path for rule in ACQUIRE_RULES.values()} == set(Path)


def test_the_engine_table_is_the_references() -> None:
    """SPEC §10: each engine row writes, reads and counts what the reference's row does."""
    from affinity_core import machine as reference

    counters = {None: reference.Counter.NONE, "affinity_kept": reference.Counter.KEPT,
                "affinity_broken": reference.Counter.BROKEN,
                "group_kept": reference.Counter.GROUP_KEPT,
                "group_broken": reference.Counter.GROUP_BROKEN}
    assert {lookup.value for lookup in Lookup} == {lookup.value for lookup in reference.Lookup}
    for lookup in Lookup:
        mine, theirs = ACQUIRE_RULES[lookup], reference.ACQUIRE_RULES[
            reference.Lookup(lookup.value)]
        assert (mine.path, mine.choice.value, mine.write_pin, counters[mine.counter],
                mine.group_recency.value, mine.write_group_pin,
                mine.reports_group_eviction) == (
            theirs.path, theirs.choice.value, theirs.write_pin, theirs.counter,
            theirs.group_recency.value, theirs.write_group_pin,
            theirs.reports_group_eviction), lookup
