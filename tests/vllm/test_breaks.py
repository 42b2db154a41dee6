"""The margin rule through the HTTP router: pins break only outside the band.

With ``tie_break first`` every sequential first turn lands on the first backend, which
makes a skewed load easy to build: sessions pinned to one backend send overlapping slow
turns while the other backend idles. R-KEEP-1: a pin is kept iff
``load[pin] <= min + margin``; R-BREAK-1: a break re-pins to a least-loaded, different
backend and later turns follow the new pin (R-BREAK-2).
"""

from __future__ import annotations

import asyncio

from .fleet import Fleet, Reply, fleet, run, wait_until


async def _overlapping_turns(f: Fleet, sessions: list[str]) -> list[Reply]:
    """Send one slow turn per session, each starting once the previous one is in flight."""
    tasks: list[asyncio.Task[Reply]] = []
    for n, key in enumerate(sessions, start=1):
        tasks.append(asyncio.create_task(f.complete(key)))
        await wait_until(lambda n=n: f.router.table.state.inflight_total == n,  # type: ignore[misc]
                         what=f"{n} requests in flight")
    return list(await asyncio.gather(*tasks))


async def _pin_all_to_first(f: Fleet, sessions: list[str]) -> str:
    backends = {(await f.complete(key)).backend for key in sessions}
    assert len(backends) == 1, backends
    (backend,) = backends
    assert backend == f.router.table.servers[0]
    return backend


def _skewed(margin: int | None, sessions: int) -> list[Reply]:
    async def scenario() -> list[Reply]:
        keys = [f"s{i}" for i in range(sessions)]
        async with fleet(2, margin=margin, tie_break="first", stub={"delay": 0.3}) as f:
            f.stubs[0].options.delay = 0.0  # fast first turns, then slow ones
            f.stubs[1].options.delay = 0.0
            await _pin_all_to_first(f, keys)
            f.stubs[0].options.delay = f.stubs[1].options.delay = 0.3
            replies = await _overlapping_turns(f, keys)
            status = await f.get_json("/status")
            broken = sum(r.path == "broken" for r in replies)
            assert status["affinity_broken"] == broken
            assert status["affinity_kept"] == len(keys) - broken
            f.assert_idle()
            return replies
    return run(scenario())


def test_margin_none_never_breaks_under_skew() -> None:
    replies = _skewed(None, 4)
    assert [r.path for r in replies] == ["kept"] * 4
    assert len({r.backend for r in replies}) == 1


def test_margin_zero_moves_a_session_as_soon_as_its_backend_is_busier() -> None:
    replies = _skewed(0, 2)
    assert [r.path for r in replies] == ["kept", "broken"]
    assert replies[0].backend != replies[1].backend


def test_margin_two_keeps_pins_inside_the_band_and_breaks_outside() -> None:
    # loads of the first backend seen by turns 1..4: 0, 1, 2, 3 against an idle peer.
    replies = _skewed(2, 4)
    assert [r.path for r in replies] == ["kept", "kept", "kept", "broken"]
    assert replies[3].backend != replies[0].backend


def test_after_a_break_later_turns_follow_the_new_pin() -> None:
    async def scenario() -> None:
        async with fleet(2, margin=0, tie_break="first", stub={"delay": 0.3}) as f:
            f.stubs[0].options.delay = 0.0
            await _pin_all_to_first(f, ["hot", "mover"])
            f.stubs[0].options.delay = 0.3
            replies = await _overlapping_turns(f, ["hot", "mover"])
            assert [r.path for r in replies] == ["kept", "broken"]
            f.stubs[0].options.delay = f.stubs[1].options.delay = 0.0
            later = await f.complete("mover")
            assert (later.path, later.backend) == ("kept", replies[1].backend)
            f.assert_idle()
    run(scenario())
