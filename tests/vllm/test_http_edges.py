"""HTTP edge cases found by a new user's adversarial pass:

* a request whose Content-Length is shorter than its body, or a valid request followed by
  garbage on the same connection, still gets its own answer before the 400 and the close
  (not a close at once with nothing answered);
* a pipelined request that stalls past --header-timeout does not cut off the response
  in progress before it: that one completes, then the 408;
* HEAD gets the head of the GET response and never a body (a body after a HEAD response
  is read by a keep-alive client as the next response); 405s carry an Allow header;
* an empty body is named as empty.

Every case ends with the router idle: no in-flight count, lease or active request left.
"""

from __future__ import annotations

import logging

import pytest

from .fleet import Fleet, fleet, raw_exchange, run, settle

COMPLETION = b'{"model": "tiny", "prompt": "hi", "max_tokens": 2}'


def _post(body: bytes, length: int | None = None, session: bytes = b"k") -> bytes:
    size = len(body) if length is None else length
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"x-session-id: " + session + b"\r\nContent-Length: %d\r\n\r\n" % size + body)


async def _read_to_close(port: int, raw: bytes, *, then: bytes = b"", pause: float = 0.0,
                         timeout: float = 5.0) -> bytes:
    """Send ``raw`` (and ``then`` after ``pause`` s); read until the router closes."""
    return await raw_exchange(port, raw, pause=pause, rest=then, timeout=timeout, to_eof=True)


def _responses(data: bytes) -> list[tuple[int, bytes, bytes]]:
    """Split a byte stream of Content-Length responses into (status, head, body)."""
    out = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, data[:200]
        fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
        size = int(fields[b"content-length"])
        out.append((int(head.split(b" ", 2)[1]), head.lower(), rest[:size]))
        data = rest[size:]
    return out


async def _idle(f: Fleet) -> None:
    await settle(f)
    f.assert_idle()
    assert (await f.complete("after")).status == 200  # still serving
    await settle(f)
    f.assert_idle()


def test_short_content_length_still_answers_the_first_request(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with fleet(1) as f:
            assert f.router.port is not None
            # The body is 14 bytes, the header says 5: the first request is '{"pro'
            # (invalid JSON, 400), the rest is not HTTP (400), then the close.
            data = await _read_to_close(f.router.port, _post(b'{"prompt":"x"}', length=5))
            replies = _responses(data)
            assert [r[0] for r in replies] == [400, 400], data
            assert b"not valid JSON" in replies[0][2]
            assert b"malformed HTTP request" in replies[1][2]
            assert b"connection: close" in replies[1][1]
            # A complete, valid request with garbage behind it: a 200, then the 400.
            data = await _read_to_close(f.router.port, _post(COMPLETION) + b"\x00garbage\r\n\r\n")
            assert [r[0] for r in _responses(data)] == [200, 400], data
            await _idle(f)
    run(scenario())
    assert not [r for r in caplog.records if r.name.startswith("affinity")
                and (r.exc_info or r.levelno >= logging.ERROR)]


def test_a_stalled_pipelined_request_does_not_cut_the_response_before_it() -> None:
    async def scenario() -> None:
        async with fleet(1, stub={"delay": 0.8}, header_timeout=0.2) as f:
            assert f.router.port is not None
            half = b"GET /health HTTP/1.1\r\nHost: x\r\n"  # headers never finished
            data = await _read_to_close(f.router.port, _post(COMPLETION) + half)
            replies = _responses(data)
            assert [r[0] for r in replies] == [200, 408], data
            assert b'"text"' in replies[0][2] and b"--header-timeout" in replies[1][2]
            await _idle(f)
    run(scenario())


def test_head_gets_headers_and_never_a_body() -> None:
    async def scenario() -> None:
        async with fleet(1) as f:
            assert f.router.port is not None
            for path in (b"/health", b"/status", b"/metrics"):
                # HEAD then GET on one keep-alive connection: if HEAD leaked a body, the
                # GET's response would not start where the HEAD's head ended.
                raw = (b"HEAD " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n"
                       b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                data = await _read_to_close(f.router.port, raw)
                head, _, rest = data.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200"), data[:200]
                assert rest.startswith(b"HTTP/1.1 200"), (path, rest[:100])
            raw = b"HEAD /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            data = await _read_to_close(f.router.port, raw)
            head, _, rest = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 405") and b"\r\nallow: POST" in head, head
            assert rest == b""
            async with f.client.options(f.url + "/health") as resp:
                assert resp.status == 405
                assert resp.headers["Allow"] == "GET, HEAD"
                assert "allowed: GET, HEAD" in (await resp.json())["error"]["message"]
            await _idle(f)
    run(scenario())


def test_empty_body_is_named() -> None:
    async def scenario() -> None:
        async with fleet(1) as f:
            for body in (b"", b"  \r\n"):
                reply = await f.post("/v1/completions", body, session="s")
                assert reply.status == 400
                assert "it is empty" in reply.body["error"]["message"], reply.body
            reply = await f.post("/v1/completions", b'{"prompt": "x', session="s")
            assert reply.body["error"]["message"] == (
                "request body is not valid JSON: Unterminated string starting at "
                "(line 1 column 12)")
            assert f.router.table.decisions == {}
            await _idle(f)
    run(scenario())
