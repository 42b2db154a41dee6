"""Black-box traces: what the harness does to a router, and how that maps to spec events.

Theory of operation
-------------------
A trace is a list of :class:`Op`. Each op is something the harness can *do* to a router
from outside, and each maps to exactly one spec event once the router's choice is seen:

* ``acquire`` -- send a request with a session key (optionally streamed); the backend it
  arrives at is the router's choice. Spec: ``Acquire(request_id=key)`` with the choice fed
  back through ``draw_for`` (R-REL-2). With a *context* ``c`` (traces for the context
  band, SPEC §7.5) the request's ``prompt`` is a list of ``c`` token ids, so a router can
  know ``c`` exactly, and the spec event is ``Acquire(key, context_tokens=c)``;
* ``release`` -- let the backend complete the request of an earlier acquire, normally
  (``ok``) or with a failure (``fail``: HTTP 500, or a cut stream). Spec: ``Release(server,
  request_id=key)`` either way: a request that failed is over;
* ``remove`` / ``add`` -- take a backend out of the router's pool or put it back through
  the router's admin API (only where the preset has one). Spec: ``RemoveServers`` /
  ``AddServers``.

Releases name the acquire they complete by its ``ident``, so shrinking can drop any op: a
release whose acquire was dropped is skipped, as is an ``add`` of a backend that is
active or a ``remove`` that would empty the pool.

:func:`generate` draws a trace from a SplitMix64 seed (reproducible on any machine, like
``affinity check``): a few session keys so that sessions collide, releases of random held
requests, and -- where enabled -- streamed requests, failures and pool changes.

Contexts (``TraceShape.band_tokens = T``): each acquire gets ``c = k * T + d`` with ``k`` in
0..5 and ``d`` one of 0 (a band step exactly), ``T - 1`` (one token short of the next step:
a router that rounds ``c / T`` up keeps where the spec breaks) or uniform in ``[0, T)``.
``k`` up to 5 passes any cap below 5 + margin, so the cap (R-BAND-2) is exercised too;
``c`` stays below ``6 T`` tokens, so request bodies stay small for a small ``T``. Without
``band_tokens`` no context is drawn and the SplitMix64 stream, hence every trace, is the
same as before contexts existed.
"""

from __future__ import annotations

import attrs

from affinity_conformance.trace_gen import SplitMix64

__all__ = ["Op", "TraceShape", "describe", "generate", "server_ids"]


@attrs.frozen
class Op:
    kind: str               # acquire | release | remove | add
    ident: int = -1         # acquire: its own id; release: the acquire it completes
    session: str | None = None
    stream: bool = False
    outcome: str = "ok"     # release: ok | fail
    backend: int = -1       # remove / add
    context: int | None = None  # acquire: prompt length c in tokens (sent as c token ids)


@attrs.frozen
class TraceShape:
    backends: int = 3
    sessions: int = 4
    length: int = 24
    stream_percent: int = 25
    fail_percent: int = 15
    pool_percent: int = 0   # 0 unless the router has a pool-change API
    band_tokens: int | None = None  # T: give each acquire a context c in [0, 6T)


def server_ids(count: int) -> list[str]:
    """Spec-side names of the backends, in the router's pool order."""
    return [f"b{i}" for i in range(count)]


def describe(op: Op) -> str:
    if op.kind == "acquire":
        context = "" if op.context is None else f", c={op.context}"
        return f"acquire({op.session!r}{context}{', stream' if op.stream else ''}) #{op.ident}"
    if op.kind == "release":
        return f"release(#{op.ident}{', fail' if op.outcome == 'fail' else ''})"
    return f"{op.kind}(b{op.backend})"


def _context(rng: SplitMix64, tokens: int) -> int:
    """A prompt length around the band's steps (see the module docstring)."""
    step = rng.below(6)
    kind = rng.below(3)
    if kind == 0:
        return step * tokens
    if kind == 1:
        return step * tokens + tokens - 1
    return step * tokens + rng.below(tokens)


def generate(seed: int, shape: TraceShape) -> list[Op]:
    """A reproducible random trace (see the module docstring)."""
    rng = SplitMix64(seed)
    ops: list[Op] = []
    held: list[int] = []
    active = list(range(shape.backends))
    removed: list[int] = []
    next_id = 0
    while len(ops) < shape.length:
        roll = rng.below(100)
        if roll < shape.pool_percent and (removed or len(active) > 2):
            if removed and (len(active) <= 2 or rng.chance(50)):
                backend = removed.pop(rng.below(len(removed)))
                active.append(backend)
                ops.append(Op("add", backend=backend))
            else:
                backend = active.pop(rng.below(len(active)))
                removed.append(backend)
                ops.append(Op("remove", backend=backend))
        elif held and rng.chance(45):
            ident = held.pop(rng.below(len(held)))
            outcome = "fail" if rng.chance(shape.fail_percent) else "ok"
            ops.append(Op("release", ident, outcome=outcome))
        else:
            session = f"s{rng.below(shape.sessions) + 1}"
            stream = rng.chance(shape.stream_percent)
            context = None if shape.band_tokens is None else _context(rng, shape.band_tokens)
            ops.append(Op("acquire", next_id, session, stream=stream, context=context))
            held.append(next_id)
            next_id += 1
    return ops
