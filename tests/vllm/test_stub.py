"""The in-repo fake vLLM: block-LRU prefix cache, API shapes and /metrics names."""

from __future__ import annotations

import aiohttp
import pytest
from affinity_vllm.metrics import parse_samples, sum_samples
from affinity_vllm.stub import BlockPrefixCache, StubOptions, StubServer

from .fleet import run


def test_prefix_hits_are_whole_leading_blocks() -> None:
    cache = BlockPrefixCache(block_size=4, capacity_blocks=100)
    assert cache.admit(list(range(10))) == 0  # cold: 2 full blocks stored
    assert cache.admit(list(range(10))) == 8  # both full blocks hit
    assert cache.admit([*range(8), 99, 98, 97]) == 8  # same 2-block prefix, new tail
    assert cache.admit([0, 1, 2, 9, *range(4, 12)]) == 0  # first block differs: chain breaks
    assert (cache.queries, cache.hits) == (10 + 10 + 11 + 12, 16)


def test_last_prompt_token_is_never_a_hit() -> None:
    cache = BlockPrefixCache(block_size=4, capacity_blocks=100)
    cache.admit(list(range(8)))
    # 8 tokens = 2 blocks, but the last token must be computed: only 1 block can hit
    assert cache.admit(list(range(8))) == 4
    assert cache.admit(list(range(9))) == 8


def test_lru_eviction_drops_least_recent_blocks() -> None:
    cache = BlockPrefixCache(block_size=2, capacity_blocks=4)
    a, b, c = [1, 1, 1, 1, 0], [2, 2, 2, 2, 0], [3, 3, 3, 3, 0]
    cache.admit(a)
    cache.admit(b)  # cache full: a's 2 blocks + b's 2 blocks
    assert cache.admit(a) == 4  # refreshes a
    cache.admit(c)  # evicts b (least recent)
    assert len(cache) == 4
    assert cache.admit(a) == 4
    assert cache.admit(b) == 0


def test_cache_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        BlockPrefixCache(0, 10)


def test_stub_api_and_metrics_names() -> None:
    async def scenario() -> None:
        stub = StubServer(StubOptions(name="one", block_size=16))
        await stub.start()
        try:
            async with aiohttp.ClientSession() as client:
                prompt = list(range(40))
                for _ in range(2):
                    async with client.post(stub.url + "/v1/completions", json={
                            "prompt": prompt, "max_tokens": 3, "return_token_ids": True}) as r:
                        body = await r.json()
                assert body["object"] == "text_completion" and body["backend"] == "one"
                assert len(body["choices"][0]["token_ids"]) == 3
                assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
                async with client.post(stub.url + "/v1/completions",
                                       json={"prompt": ["ab", "cd"], "max_tokens": 2}) as r:
                    assert len((await r.json())["choices"]) == 2
                async with client.post(stub.url + "/v1/completions", json={"max_tokens": 1}) as r:
                    assert r.status == 400
                async with client.get(stub.url + "/metrics") as r:
                    samples = parse_samples(await r.text())
                async with client.get(stub.url + "/v1/models") as r:
                    assert (await r.json())["data"][0]["id"] == "tiny"
            assert sum_samples(samples, "vllm:prefix_cache_queries_total") == 40 + 40 + 2 + 2
            assert sum_samples(samples, "vllm:prefix_cache_hits_total") == 32
            for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                          "vllm:kv_cache_usage_perc"):
                assert sum_samples(samples, gauge) == 0
            labels = next(lab for n, lab, _ in samples if n == "vllm:num_requests_running")
            assert labels == {"engine": "0", "model_name": "tiny"}
        finally:
            await stub.stop()
    run(scenario())


def test_stub_refuse_then_accept_on_the_same_port() -> None:
    async def scenario() -> None:
        stub = StubServer()
        port = await stub.start()
        try:
            await stub.set_fault("refuse")
            async with aiohttp.ClientSession() as client:
                with pytest.raises(aiohttp.ClientConnectorError):
                    await client.get(stub.url + "/health")
                await stub.set_fault("none")
                assert stub.port == port
                async with client.get(stub.url + "/health") as r:
                    assert r.status == 200
            with pytest.raises(ValueError, match="fault mode must be one of"):
                await stub.set_fault("explode")
        finally:
            await stub.stop()
    run(scenario())
