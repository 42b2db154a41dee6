"""``affinity_vllm.usage``: reading vLLM's usage from the end of a relayed response.

Pure tests (no sockets): :func:`parse_usage` on whole JSON bodies, tails of large ones
and event streams, and :class:`UsageTail`'s bound. ``--context-reuse`` (SPEC R-BAND-6:
a turn whose response reports no valid usage adds nothing) relies on these to record only
well-formed reports.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from affinity_vllm.usage import TAIL_BYTES, UsageTail, parse_usage


def _usage(prompt: Any = 96, cached: Any = 64, details: bool = True) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": 4,
                             "total_tokens": 100}
    if details:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def _body(usage: Any, text: str = "t1 t2") -> bytes:
    return json.dumps({"id": "cmpl-1", "choices": [{"index": 0, "text": text}],
                       "usage": usage, "backend": "s0"}).encode()


def _sse(events: list[Any], done: bool = True, newline: bytes = b"\n") -> bytes:
    out = b"".join(b"data: " + json.dumps(e).encode() + newline * 2 for e in events)
    return out + (b"data: [DONE]" + newline * 2 if done else b"")


CHUNK = {"id": "c", "choices": [{"index": 0, "text": " t1"}]}


# --------------------------------------------------------------------- JSON bodies
@pytest.mark.parametrize(("usage", "expected"), [
    (_usage(96, 64), (96, 64)),
    (_usage(96, 0), (96, 0)),
    (_usage(96, 96), (96, 96)),
    (None, "no_usage"),
    (_usage(details=False), "no_usage"),  # vLLM without --enable-prompt-tokens-details
    ({"prompt_tokens": 5, "prompt_tokens_details": None}, "no_usage"),
    (_usage(96, None), "no_usage"),
    (_usage(96, 97), "invalid"),  # more cached than prompt tokens
    (_usage(96, -1), "invalid"),
    (_usage(-5, 0), "invalid"),
    (_usage(True, 0), "invalid"),  # booleans are not counts
    (_usage(96, False), "invalid"),
    (_usage(96, 3.0), "invalid"),
    (_usage("96", 3), "invalid"),
    (_usage(None, 3), "invalid"),
    ({"prompt_tokens": 5, "prompt_tokens_details": [3]}, "invalid"),
    ("usage", "invalid"),
    (_usage(2**63 - 1, 2**63 - 1), (2**63 - 1, 2**63 - 1)),  # 64-bit counts: the limit
    (_usage(2**63, 0), "invalid"),  # Found by a new user: beyond 64 bits was recorded
    (_usage(9 * 10**4299, 10**4299), "invalid"),
])
def test_whole_bodies_count_only_well_formed_integers(usage: Any, expected: Any) -> None:
    assert parse_usage(_body(usage), whole=True, stream=False) == expected


@pytest.mark.parametrize("body", [
    _body(_usage())[:-10],  # truncated
    b"", b"[1, 2]", b"\xff\xfe{}", b"[" * 100_000 + b"]" * 100_000,  # too deep to parse
])
def test_unparseable_whole_bodies_are_invalid(body: bytes) -> None:
    assert parse_usage(body, whole=True, stream=False) == "invalid"


def test_no_usage_key_in_a_whole_body() -> None:
    assert parse_usage(b'{"id": "x", "choices": []}', whole=True, stream=False) == "no_usage"


def test_a_tail_is_searched_for_the_last_usage_key() -> None:
    whole = _body(_usage(500, 320), text="x" * 300_000)
    tail = whole[-TAIL_BYTES:]  # starts mid-string: not parseable as JSON
    assert parse_usage(tail, whole=False, stream=False) == (500, 320)
    # The quoted word inside a string is escaped, so it cannot be taken for the key.
    decoy = json.dumps({"choices": [{"text": 'say "usage": {"prompt_tokens": 9}'}],
                        "usage": _usage(40, 16)}).encode()
    assert parse_usage(decoy[5:], whole=False, stream=False) == (40, 16)
    assert parse_usage(b'.."usage": {"prompt_tok', whole=False, stream=False) == "invalid"
    assert parse_usage(b'.."usage": 7}', whole=False, stream=False) == "invalid"
    assert parse_usage(b'"text": "no key here"}', whole=False, stream=False) == "no_usage"
    assert parse_usage(b'"usage": \xff', whole=False, stream=False) == "invalid"


# ------------------------------------------------------------------- event streams
def test_streams_take_the_last_data_event_before_done() -> None:
    final = {"id": "c", "choices": [], "usage": _usage(128, 64)}
    assert parse_usage(_sse([CHUNK, CHUNK, final]), whole=True, stream=True) == (128, 64)
    # continuous_usage_stats: every chunk has usage; the last one is the total.
    running = [{**CHUNK, "usage": _usage(128, 64 - i)} for i in range(3)]
    assert parse_usage(_sse(running), whole=True, stream=True) == (128, 62)
    assert parse_usage(_sse([CHUNK, final], newline=b"\r\n"), whole=True,
                       stream=True) == (128, 64)
    keep_alive = _sse([CHUNK, final], done=False) + b": ping\n\n" + b"data:[DONE]\n\n"
    assert parse_usage(keep_alive, whole=True, stream=True) == (128, 64)


def test_streams_without_usage_or_done() -> None:
    # Without stream_options.include_usage vLLM sends no usage chunk.
    assert parse_usage(_sse([CHUNK, CHUNK]), whole=True, stream=True) == "no_usage"
    # Usage earlier in the stream but not in the last event: not the final report.
    early = [{**CHUNK, "usage": _usage()}, CHUNK]
    assert parse_usage(_sse(early), whole=True, stream=True) == "no_usage"
    assert parse_usage(_sse([]), whole=True, stream=True) == "no_usage"
    final = {"choices": [], "usage": _usage(128, 64)}
    assert parse_usage(_sse([CHUNK, final], done=False), whole=True,
                       stream=True) == "invalid"  # did not complete
    assert parse_usage(b"data: {not json\n\ndata: [DONE]\n\n", whole=True,
                       stream=True) == "invalid"
    assert parse_usage(b"data: [3]\n\ndata: [DONE]\n\n", whole=True, stream=True) == "invalid"
    assert parse_usage(_sse([{"usage": _usage(5, 6)}]), whole=True, stream=True) == "invalid"


# ---------------------------------------------------------------------- the tail
def test_the_tail_stays_bounded_and_keeps_the_end() -> None:
    final = _sse([{"choices": [], "usage": _usage(4000, 3000)}])
    events = _sse([CHUNK] * 40_000, done=False)  # about 2.6 MB of small events
    tail = UsageTail()
    largest = 0
    for start in range(0, len(events), 61):
        tail.add(events[start:start + 61])
        largest = max(largest, len(tail.buffer))
    tail.add(final)
    assert largest < 2 * TAIL_BYTES and not tail.whole
    assert len(tail.tail()) == TAIL_BYTES
    assert (events + final).endswith(tail.tail())
    assert parse_usage(tail.tail(), whole=tail.whole, stream=True) == (4000, 3000)


def test_a_short_body_stays_whole_and_a_held_body_is_not_copied() -> None:
    body = _body(_usage(10, 0))
    tail = UsageTail()
    tail.add(body[:7])
    tail.add(body[7:])
    assert tail.whole and tail.tail() == body
    held = UsageTail()
    held.hold(body)
    assert held.tail() is body
    assert parse_usage(held.tail(), whole=held.whole, stream=False) == (10, 0)


@pytest.mark.parametrize("limit", [0, -1, True, 1.5])
def test_a_bad_tail_limit_is_refused(limit: Any) -> None:
    with pytest.raises(ValueError, match=r"limit must be an integer >= 1, got "):
        UsageTail(limit)
