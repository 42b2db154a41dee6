"""Routing and stickiness through ``affinity serve`` on stub backends (fast tier).

Sessions keyed by x-session-id (R-ACQ-2: a kept hit stays on its server) or by a JSON
body field; unkeyed requests are placed least-loaded and never pinned (R-ACQ-8).
"""

from __future__ import annotations

import asyncio

from .fleet import fleet, run, settle


def test_multi_turn_session_stays_on_one_backend_with_margin_none() -> None:
    async def scenario() -> None:
        async with fleet(2) as f:
            first = await f.complete("conv-1", prompt="a" * 64)
            assert first.status == 200 and first.path == "new"
            for turn in range(1, 6):
                reply = await f.complete("conv-1", prompt="a" * 64 + "b" * (16 * turn))
                assert reply.status == 200
                assert reply.backend == first.backend, (turn, reply.backend, first.backend)
                assert reply.path == "kept"
                # the backend that answered is the one the router says it chose
                assert reply.body["backend"] == f.stub_at(first.backend).options.name
            status = await f.get_json("/status")
            assert status["affinity_kept"] == 5 and status["affinity_broken"] == 0
            assert status["sticky_entries"] == 1
            f.assert_idle()
    run(scenario())


def test_new_sessions_are_placed_least_loaded_and_spread() -> None:
    async def scenario() -> None:
        # Concurrent first turns: each placement sees the others' in-flight counts, so
        # 8 simultaneous sessions split 4/4 across two backends.
        async with fleet(2, stub={"delay": 0.2}) as f:
            replies = await asyncio.gather(*(f.complete(f"s{i}") for i in range(8)))
            assert all(r.status == 200 and r.path == "new" for r in replies)
            counts: dict[str | None, int] = {}
            for r in replies:
                counts[r.backend] = counts.get(r.backend, 0) + 1
            assert sorted(counts.values()) == [4, 4], counts
            f.assert_idle()
    run(scenario())


def test_unkeyed_requests_are_never_pinned() -> None:
    async def scenario() -> None:
        async with fleet(2, stub={"delay": 0.1}) as f:
            replies = await asyncio.gather(*(f.complete(None) for _ in range(6)))
            assert {r.path for r in replies} == {"unkeyed"}
            assert len({r.backend for r in replies}) == 2  # least-loaded spreads them
            status = await f.get_json("/status")
            assert status["sticky_entries"] == 0
            assert status["affinity_kept"] == 0 and status["affinity_broken"] == 0
            assert status["decisions"] == {"unkeyed": 6}
            f.assert_idle()
    run(scenario())


def test_session_key_from_body_field_and_header_precedence() -> None:
    async def scenario() -> None:
        async with fleet(2, session_body_field="user") as f:
            first = await f.complete(None, user="alice")
            assert first.path == "new"
            again = await f.complete(None, user="alice")
            assert (again.path, again.backend) == ("kept", first.backend)
            # the header wins over the body field: a new session, not alice's
            by_header = await f.complete("bob", user="alice")
            assert by_header.path == "new"
            numeric = await f.complete(None, user=12345)
            assert numeric.path == "new"
            assert (await f.complete(None, user=12345)).path == "kept"
            blank = await f.complete(None, user="")
            assert blank.path == "unkeyed"
            status = await f.get_json("/status")
            assert status["sticky_entries"] == 3  # alice, bob, "12345"
            f.assert_idle()
    run(scenario())


def test_body_field_is_ignored_unless_configured() -> None:
    async def scenario() -> None:
        async with fleet(2) as f:
            assert (await f.complete(None, user="alice")).path == "unkeyed"
    run(scenario())


def test_session_header_is_forwarded_and_body_passed_unchanged() -> None:
    async def scenario() -> None:
        async with fleet(1) as f:
            raw = b'{"model":"tiny","prompt":[1,2,3,4],"max_tokens":3,"user":"u"}'
            reply = await f.post("/v1/completions", raw, session="conv-9",
                                 headers={"content-type": "application/json", "x-trace": "t1"})
            assert reply.status == 200
            record = f.stubs[0].requests[-1]
            assert record["headers"]["x-session-id"] == "conv-9"
            assert record["headers"]["x-trace"] == "t1"
            assert record["prompt_tokens"] == 4 and record["user"] == "u"
            assert reply.body["usage"]["completion_tokens"] == 3
    run(scenario())


def test_chat_completions_route_and_stick() -> None:
    async def scenario() -> None:
        async with fleet(2) as f:
            messages = [{"role": "user", "content": "hello there"}]
            first = await f.post("/v1/chat/completions",
                                 {"model": "tiny", "messages": messages}, session="c")
            assert first.status == 200 and first.body["object"] == "chat.completion"
            messages.append(first.body["choices"][0]["message"])
            messages.append({"role": "user", "content": "and again"})
            second = await f.post("/v1/chat/completions",
                                  {"model": "tiny", "messages": messages}, session="c")
            assert (second.path, second.backend) == ("kept", first.backend)
            f.assert_idle()
    run(scenario())


def test_models_route_is_proxied() -> None:
    async def scenario() -> None:
        async with fleet(2) as f:
            async with f.client.get(f.url + "/v1/models") as resp:
                assert resp.status == 200
                body = await resp.json()
            assert body["data"][0]["id"] == "tiny"
            await settle(f)
            f.assert_idle()
    run(scenario())


def test_sticky_map_capacity_evicts_least_recent_session() -> None:
    async def scenario() -> None:
        async with fleet(2, cache_size=2) as f:
            for key in ("a", "b", "c"):  # "a" is evicted by "c" (R-LRU-3)
                assert (await f.complete(key)).path == "new"
            assert (await f.complete("c")).path == "kept"
            assert (await f.complete("a")).path == "new"
            assert (await f.get_json("/status"))["sticky_entries"] == 2
    run(scenario())
