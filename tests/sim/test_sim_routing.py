"""Routing goes through the real affinity_engine; policies map to core configs."""

from __future__ import annotations

import random
from fractions import Fraction

import attrs
import pytest
from affinity_sim.distributions import parse
from affinity_sim.routing import Balancer, PolicyError, parse_policies, parse_policy
from affinity_sim.simulate import simulate_step
from affinity_sim.workload import Workload, plan_step

from affinity_engine import Config, DualThreshold, Path, TieBreak, step

from .test_sim_replica import model


def tiny_workload(**changes: object) -> Workload:
    fields: dict[str, object] = {
        "name": "tiny", "replicas": 3, "prompts": 4, "samples": 3,
        "turns": parse("turns", {"dist": "constant", "value": 3}),
        "prompt_tokens": parse("p", 40), "output_tokens": parse("o", 20),
        "tool_tokens": parse("t", 8), "tool_latency_s": parse("l", 0.0),
        "max_context": 400, "model": model(), "acquire_latency_s": 0.001,
        "release_delay_s": 0.002,
    }
    fields.update(changes)
    return Workload(**fields)  # type: ignore[arg-type]


def test_policy_names_map_to_core_configs() -> None:
    assert parse_policy("legacy").config() == Config(tie_break="draw")
    assert parse_policy("margin-2").config("first") == Config(affinity_break_margin=2,
                                                              tie_break="first")
    gate = parse_policy("dual-4").config().dual_threshold
    assert gate == DualThreshold(4, Fraction(3, 2))
    assert parse_policy("dual-8-2.5").config().dual_threshold == DualThreshold(8, Fraction(5, 2))
    unkeyed = parse_policy("least-loaded")
    assert not unkeyed.sticky and unkeyed.config().policy == "legacy"
    table = parse_policy({"name": "m3", "affinity_break_margin": 3, "tie_break": "hashed"})
    assert table.config().affinity_break_margin == 3
    assert table.config().tie_break is TieBreak.HASHED


def test_legacy_with_a_tie_rule_overrides_the_workloads() -> None:
    # legacy-draw on a first-ties workload is PR #7613 against Aug-2026 main
    assert parse_policy("legacy-draw").config("first") == Config(tie_break="draw")
    assert parse_policy("legacy-first").config("draw") == Config(tie_break="first")
    assert parse_policy("legacy-hashed").config("first").tie_break is TieBreak.HASHED
    # negative control: plain legacy follows the workload
    assert parse_policy("legacy").config("first") == Config(tie_break="first")


def test_legacy_draw_places_differently_from_first_ties() -> None:
    # on a first-ties workload the draw must reach the core, or #7613's row measures nothing
    servers = ["replica-0", "replica-1", "replica-2"]

    def first_pick(policy: str, seed: int) -> str:
        config = parse_policy(policy).config("first")
        return Balancer(config, servers, True, random.Random(seed)).acquire("a")

    assert {first_pick("legacy", seed) for seed in range(20)} == {"replica-0"}
    assert {first_pick("legacy-draw", seed) for seed in range(20)} == set(servers)


@pytest.mark.parametrize(("spec", "fragment"), [
    ("margin-x", "unknown policy 'margin-x'"),
    ("legacy-random", "unknown policy 'legacy-random'"),
    ({"name": "bad", "affinity_break_margin": -1}, "affinity_break_margin must be"),
    ({"name": "bad", "colour": 1}, "unknown keys ['colour']"),
    ({"affinity_break_margin": 1}, "needs a non-empty string 'name'"),
    ({"name": "both", "affinity_break_margin": 1, "balance_abs_threshold": 4},
     "alternative policies"),
])
def test_bad_policies_are_rejected_with_the_value(spec: object, fragment: str) -> None:
    with pytest.raises(PolicyError, match=None) as info:
        parse_policy(spec)  # type: ignore[arg-type]
    assert fragment in str(info.value)


def test_legacy_is_always_the_baseline_and_names_are_unique() -> None:
    assert [p.name for p in parse_policies(["margin-2"])] == ["legacy", "margin-2"]
    with pytest.raises(PolicyError, match="duplicate"):
        parse_policies(["margin-2", "margin-2"])


def test_every_routing_decision_is_a_core_step(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def counting_step(config, state, event):  # type: ignore[no-untyped-def]
        calls.append(type(event).__name__)
        return step(config, state, event)

    monkeypatch.setattr("affinity_engine.cursor.step", counting_step)
    workload = tiny_workload()
    result = simulate_step(workload, parse_policy("margin-1"), seed=3)
    acquires = calls.count("Acquire")
    assert acquires == result.turns == 4 * 3 * 3
    # Every release but those still in flight when the last trajectory ends reached the core.
    assert result.turns - workload.replicas <= calls.count("Release") <= result.turns
    assert result.kept + result.breaks + result.placements == result.turns


def test_fire_and_forget_release_makes_the_self_count_hazard() -> None:
    # Tool latency 0 and release 2 ms after the end: every later turn's acquire (1 ms) sees
    # the previous turn still counted.
    hazard = simulate_step(tiny_workload(), parse_policy("legacy"), seed=1)
    assert hazard.self_count_acquires == 4 * 3 * (3 - 1)
    awaited = simulate_step(tiny_workload(release_delay_s=0.0), parse_policy("legacy"), seed=1)
    assert awaited.self_count_acquires == 0


def test_unkeyed_policy_never_hits_the_sticky_map() -> None:
    result = simulate_step(tiny_workload(), parse_policy("least-loaded"), seed=2)
    assert result.kept == result.breaks == 0 and result.placements == result.turns


def test_balancer_breaks_an_overloaded_pin_and_counts_it() -> None:
    balancer = Balancer(parse_policy("margin-0").config("first"), ["a", "b"], True,
                        random.Random(0))
    assert balancer.acquire("s") == "a"
    assert balancer.acquire("t") == "b"
    assert balancer.acquire("u") == "a"  # a: 2, b: 1
    assert balancer.acquire("s") == "b"  # pin a (2) > min (1) + 0: broken to b
    assert balancer.paths[Path.BROKEN] == 1
    balancer.release("a")
    balancer.release("a")
    balancer.release("a")  # at zero: the core ignores it
    assert balancer.ignored_releases == 1


def test_group_policies_map_to_group_pins() -> None:
    # SPEC R-GRP-8: PR #6122 is group_stickiness "only" with the legacy policy
    assert parse_policy("group-only").config("first") == Config(group_stickiness="only",
                                                                tie_break="first")
    assert parse_policy("group-margin-2").config("first") == Config(
        group_stickiness="fallback", affinity_break_margin=2, tie_break="first")
    table = parse_policy({"name": "g", "group_stickiness": "fallback",
                          "affinity_break_margin": 1, "group_break_margin": 3})
    assert table.config().group_break_margin == 3
    with pytest.raises(PolicyError, match="group_break_margin applies to group pins"):
        parse_policy({"name": "bad", "group_break_margin": 3})


def test_group_pins_put_a_prompts_samples_together_and_legacy_does_not() -> None:
    def servers(policy: str) -> list[str]:
        balancer = Balancer(parse_policy(policy).config("first"), ["a", "b", "c"], True,
                            random.Random(0))
        return [balancer.acquire(f"s{i}", 100, "g0") for i in range(3)]

    assert servers("group-only") == ["a", "a", "a"]  # never reconsidered (PR #6122)
    assert servers("group-margin-2") == ["a", "a", "a"]  # within min + 2 throughout
    assert servers("legacy") == ["a", "b", "c"]  # the group id is not read (R-GRP-7)


def test_a_group_within_the_band_moves_once_it_exceeds_it() -> None:
    balancer = Balancer(parse_policy("group-margin-1").config("first"), ["a", "b"], True,
                        random.Random(0))
    assert [balancer.acquire(f"s{i}", None, "g") for i in range(3)] == ["a", "a", "b"]
    assert balancer.paths[Path.GROUP_KEPT] == 1 and balancer.paths[Path.GROUP_BROKEN] == 1
    assert balancer.state.groups.broken == 1


def test_prefix_policies_map_to_placement_margin() -> None:
    # SPEC section 8.1: placement_margin beside the margin, with or without group pins
    assert parse_policy("prefix-p2-margin-2").config("first") == Config(
        placement_margin=2, affinity_break_margin=2, tie_break="first")
    assert parse_policy("prefix-p1-group-margin-3").config("first") == Config(
        placement_margin=1, affinity_break_margin=3, group_stickiness="fallback",
        tie_break="first")
    assert parse_policy({"name": "p", "placement_margin": 4}).config().placement_margin == 4
    with pytest.raises(PolicyError, match="placement_margin"):
        parse_policy({"name": "bad", "placement_margin": -1})
    with pytest.raises(PolicyError, match="unknown policy"):
        parse_policy("prefix-margin-2")


def test_prefix_placement_follows_the_cache_inside_the_band_only() -> None:
    estimate = (("a", 0), ("b", 0), ("c", 4096))

    def place(policy: str, loads: int) -> str:
        balancer = Balancer(parse_policy(policy).config("first"), ["a", "b", "c"], True,
                            random.Random(0))
        for _ in range(3 * loads):  # round robin: `loads` each; then a and b are freed
            balancer.driver.acquire(None)
        for server in ("a", "b"):
            for _ in range(loads):
                balancer.driver.release(server)  # only c keeps them
        return balancer.acquire("s", 100, None, estimate)

    assert place("prefix-p2-margin-2", 0) == "c"  # the cache decides among the tied
    assert place("prefix-p2-margin-2", 2) == "c"  # c is within min + 2
    assert place("prefix-p2-margin-2", 3) == "a"  # c is outside the band: least loaded
    assert place("margin-2", 0) == "a"  # without the option the estimate is not read


def test_the_index_chain_shares_a_prompts_blocks_and_forgets_a_rewound_tail() -> None:
    from affinity_sim.simulate import _extend_chain
    plans = plan_step(tiny_workload(), 0)
    a, b = plans[0], next(p for p in plans if p.group == plans[0].group and p is not plans[0])
    other = next(p for p in plans if p.group != plans[0].group)
    chain_a: list[bytes] = []
    chain_b: list[bytes] = []
    chain_o: list[bytes] = []
    _extend_chain(chain_a, a, 2, 4, 0)
    _extend_chain(chain_b, b, 2, 4, 0)
    _extend_chain(chain_o, other, 2, 4, 0)
    assert chain_a[:2] == chain_b[:2] and chain_a[2:] != chain_b[2:]  # siblings share 2
    assert chain_a[0] != chain_o[0]  # another prompt shares nothing
    before = list(chain_a)
    _extend_chain(chain_a, a, 2, 6, 0)
    assert chain_a[:4] == before  # a longer prompt extends the chain
    del chain_a[3:]  # a rewind to block 3: what follows is new content
    _extend_chain(chain_a, a, 2, 6, 1)
    assert chain_a[:3] == before[:3] and chain_a[3] != before[3]


def test_the_index_source_moves_placements_where_the_cold_pools_cannot() -> None:
    workload = tiny_workload()

    def hits(policy: str) -> list[float]:
        return [simulate_step(workload, parse_policy(policy), seed).prefix_hit_rate
                for seed in range(4)]

    plain, cache, index = hits("margin-2"), hits("prefix-p2-margin-2"), hits(
        "prefix-p2-margin-2-index")
    # the KV pools hold a prompt only once admitted, and this step launches every sample at
    # once: the cache source sees nothing yet and places as margin 2; the index records
    # each placement at once, so its estimates move later samples
    assert cache == plain
    assert index != plain
    with pytest.raises(PolicyError, match="prefix_source"):
        parse_policy({"name": "bad", "placement_margin": 1, "prefix_source": "kv"})


def test_workload_plans_are_independent_of_the_policy() -> None:
    workload = tiny_workload()
    assert plan_step(workload, 5) == plan_step(attrs.evolve(workload), 5)
    assert plan_step(workload, 5) != plan_step(workload, 6)
