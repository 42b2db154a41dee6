"""One vLLM-like replica: continuous batching over a block KV pool, as a simpy process.

Theory of operation
-------------------
The replica runs back-to-back *iterations* while it has work, like vLLM's engine loop
(V1 scheduler, FCFS, chunked prefill):

1. **Room for decode.** Every decoding sequence needs a KV slot for the token it is about
   to produce. If the pool cannot give the blocks, the most recently admitted running
   request is preempted (vLLM's recompute preemption): its blocks are freed into the
   prefix cache and it goes back to the head of the waiting queue, keeping its progress.
2. **Prefill.** The iteration's token budget (``max_num_batched_tokens``) minus one token
   per decoding sequence goes to unfinished prefills, then to waiting requests in FCFS
   order. A waiting request is admitted if a slot is free (``max_num_seqs``) and the KV
   blocks of its whole prompt (plus its first output token) fit; the head of the queue
   blocks those behind it. Admission looks the prompt up in the prefix cache: only the
   uncached tokens are prefilled. The iteration that finishes a prefill also samples the
   request's first output token.
3. **Iteration time** comes from :class:`~affinity_sim.costmodel.ReplicaModel`.

An iteration with prefill work is simulated on its own. A run of pure-decode iterations
with a fixed batch is simulated analytically: with ``B`` sequences holding ``S`` context
tokens, iteration ``i`` takes ``A + c*B*i`` with ``A = a + b*B + c*S``, so ``k`` iterations
take ``k*A + c*B*k*(k-1)/2``. The run ends at the first completion, when the pool would
need a preemption, or -- if the replica could admit it -- when a new request arrives; an
arrival joins at the next iteration boundary. This keeps the event count proportional to
requests, not tokens.

Statistics: prefix-cache queries and hits in tokens, per admission; as in vLLM's
``PrefixCacheStats``, the re-lookup of a preempted request is counted apart and is not part
of the exported hit rate. Also prefill tokens, preemptions, iterations, and idle
time (no running and no waiting request). Queue length changes are reported to a
:class:`QueueTracker` shared by the fleet.

Known simplifications (see sim/README.md): blocks of a prompt become hits for a sibling
sample as soon as they are allocated, not when computed; a request whose shared prompt
prefix was evicted recomputes its own cached blocks without allocating them twice.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Generator
from typing import Any

import simpy

from .costmodel import ReplicaModel
from .kvcache import KvPool

__all__ = ["QueueTracker", "Replica", "Request"]


class Request:
    """One turn of one trajectory, as the replica sees it."""

    __slots__ = ("decoding", "done", "group_key", "own_blocks", "preempted", "prefill_left",
                 "prefill_pos", "remaining", "shared", "tokens", "traj")

    def __init__(self, env: simpy.Environment, traj: int, group_key: int, shared: int,
                 prompt_tokens: int, output_tokens: int) -> None:
        self.traj = traj
        self.group_key = group_key
        self.shared = shared  # full blocks of the prompt shared with sibling samples
        self.tokens = prompt_tokens  # prompt, then prompt + sampled tokens
        self.remaining = output_tokens
        self.prefill_left = 0
        self.prefill_pos = 0
        self.own_blocks = 0
        self.decoding = False
        self.preempted = False  # vLLM counts a preempted request's re-lookup apart
        self.done = env.event()


class QueueTracker:
    """Time integral of ``max - min`` (and of the sum) of per-replica queue lengths."""

    __slots__ = ("last", "lengths", "skew_area", "total_area")

    def __init__(self, replicas: int) -> None:
        self.lengths = [0] * replicas
        self.last = 0.0
        self.skew_area = 0.0
        self.total_area = 0.0

    def change(self, replica: int, delta: int, now: float) -> None:
        span = now - self.last
        if span > 0:
            lengths = self.lengths
            self.skew_area += span * (max(lengths) - min(lengths))
            self.total_area += span * sum(lengths)
            self.last = now
        self.lengths[replica] += delta


class Replica:
    """A simpy process serving :class:`Request` objects (see the module docstring)."""

    def __init__(self, env: simpy.Environment, index: int, model: ReplicaModel,
                 tracker: QueueTracker) -> None:
        self.env = env
        self.index = index
        self.model = model
        self.tracker = tracker
        self.block = model.block_size
        self.kv = KvPool(model.capacity_blocks, model.block_size)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order; preemption takes the last
        self.wake: simpy.Event | None = None
        self.query_tokens = 0
        self.hit_tokens = 0
        self.preempted_query_tokens = 0
        self.preempted_hit_tokens = 0
        self.prefill_tokens = 0
        self.preemptions = 0
        self.iterations = 0
        self.idle_time = 0.0
        self.idle_since: float | None = 0.0
        self.process = env.process(self._run())

    # -- interface -------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        self.waiting.append(request)
        self.tracker.change(self.index, 1, self.env.now)
        wake = self.wake
        if wake is not None and not wake.triggered:
            wake.succeed()

    def idle_time_until(self, now: float) -> float:
        if self.idle_since is None:
            return self.idle_time
        return self.idle_time + (now - self.idle_since)

    # -- engine loop -----------------------------------------------------------------
    def _run(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        while True:
            if not self.running and not self.waiting:
                self.idle_since = env.now
                self.wake = env.event()
                yield self.wake
                self.wake = None
                self.idle_time += env.now - self.idle_since
                self.idle_since = None
                continue
            self._make_room()
            decoders = [r for r in self.running if r.decoding]
            headroom = self._growth(decoders, 1)  # kept free for the decoders' next token
            chunks = self._schedule_prefill(len(decoders), headroom)
            if chunks:
                yield env.timeout(self._mixed_time(decoders, chunks))
                self._finish_mixed(decoders, chunks)
            elif self.running:
                yield from self._decode_run()

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block)

    def _growth(self, decoders: list[Request], k: int) -> int:
        """Blocks the decoders must add to sample ``k`` more tokens each.

        ``ceil((t+k)/B) - ceil(t/B) == ((t-1) mod B + k) // B`` for ``t >= 1``.
        """
        bs = self.block
        return sum([((r.tokens - 1) % bs + k) // bs for r in decoders])

    def _make_room(self) -> None:
        """Preempt the newest running requests until every decoder has its next slot."""
        bs = self.block
        running = self.running
        need = sum([1 for r in running if r.decoding and r.tokens % bs == 0])
        available = self.kv.available
        while running and need > available:
            victim = running.pop()
            if victim.decoding and victim.tokens % bs == 0:
                need -= 1
            self._preempt(victim)
            available = self.kv.available

    def _preempt(self, victim: Request) -> None:
        computed = victim.tokens - 1 if victim.decoding else victim.prefill_pos
        self._free(victim, computed)
        victim.decoding = False
        victim.preempted = True
        self.waiting.appendleft(victim)
        self.preemptions += 1

    def _free(self, request: Request, computed_tokens: int) -> None:
        cached_own = max(0, computed_tokens // self.block - request.shared)
        self.kv.release(request.group_key, request.shared, request.traj, request.own_blocks,
                        cached_own)
        request.own_blocks = 0

    def _admit(self, request: Request, headroom: int) -> bool:
        kv = self.kv
        own = self._blocks(request.tokens + 1) - request.shared
        cost = kv.pin_cost(request.group_key, request.shared, request.traj, own)
        if cost > kv.available - headroom:
            return False
        hit = kv.lookup(request.group_key, request.shared, request.traj, request.tokens)
        kv.admit(request.group_key, request.shared, request.traj, own)
        hit_tokens = hit * self.block
        request.own_blocks = own
        request.prefill_pos = hit_tokens
        request.prefill_left = request.tokens - hit_tokens
        if request.preempted:
            self.preempted_query_tokens += request.tokens
            self.preempted_hit_tokens += hit_tokens
        else:
            self.query_tokens += request.tokens
            self.hit_tokens += hit_tokens
        return True

    def _schedule_prefill(self, decoding: int, headroom: int) -> list[tuple[Request, int]]:
        model = self.model
        budget = model.max_num_batched_tokens - decoding
        chunks: list[tuple[Request, int]] = []
        for r in self.running:
            if budget <= 0:
                return chunks
            if not r.decoding:
                n = min(r.prefill_left, budget)
                chunks.append((r, n))
                budget -= n
        waiting = self.waiting
        while budget > 0 and waiting and len(self.running) < model.max_num_seqs:
            head = waiting[0]
            if not self._admit(head, headroom):
                break  # FCFS: the head blocks the queue
            waiting.popleft()
            self.running.append(head)
            n = min(head.prefill_left, budget)
            chunks.append((head, n))
            budget -= n
        return chunks

    def _mixed_time(self, decoders: list[Request], chunks: list[tuple[Request, int]]) -> float:
        prefill = 0
        pairs = 0.0
        for r, n in chunks:
            prefill += n
            pairs += n * r.prefill_pos + n * (n + 1) / 2  # causal: query q sees q+1 keys
        context = sum(r.tokens for r in decoders)
        self.prefill_tokens += prefill
        return self.model.iteration_time(len(decoders), context, prefill, pairs)

    def _finish_mixed(self, decoders: list[Request], chunks: list[tuple[Request, int]]) -> None:
        self.iterations += 1
        self._advance(decoders, 1)
        for r, n in chunks:
            r.prefill_left -= n
            r.prefill_pos += n
            if r.prefill_left == 0:
                r.decoding = True
                r.tokens += 1  # the prefill iteration samples the first token
                r.remaining -= 1
        self._retire()

    def _retire(self) -> None:
        if not any(r.remaining <= 0 for r in self.running):
            return
        still: list[Request] = []
        now = self.env.now
        for r in self.running:
            if r.remaining <= 0:
                self._free(r, r.tokens - 1)
                self.tracker.change(self.index, -1, now)
                r.done.succeed(now)
            else:
                still.append(r)
        self.running = still

    def _decode_run(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        model = self.model
        running = self.running  # all decoding: a run starts only when no prefill is pending
        k = min([r.remaining for r in running])
        if self._growth(running, k) > self.kv.available:
            k = self._largest_fitting_run(k)
        batch = len(running)
        slope = model.kv_read_s_per_token * batch  # each iteration adds B context tokens
        first = model.iteration_time(batch, sum(r.tokens for r in running), 0, 0.0)

        def elapsed(j: int) -> float:
            return j * first + slope * j * (j - 1) / 2

        start = env.now
        wakeable = not self.waiting and batch < model.max_num_seqs
        if wakeable:
            self.wake = env.event()
            yield env.timeout(elapsed(k)) | self.wake
            self.wake = None
            if env.now < start + elapsed(k):
                done = self._iterations_within(env.now - start, first, slope, k)
                k = done + 1  # the iteration in progress completes first
                yield env.timeout(max(0.0, start + elapsed(k) - env.now))
        else:
            yield env.timeout(elapsed(k))
        self.iterations += k
        self._advance(running, k)
        self._retire()

    def _advance(self, decoders: list[Request], k: int) -> None:
        """``k`` decode iterations: each sequence samples ``k`` tokens and pins new blocks."""
        bs = self.block
        grown = 0
        for r in decoders:
            t = r.tokens
            added = ((t - 1) % bs + k) // bs  # blocks crossed: see _growth
            r.tokens = t + k
            r.remaining -= k
            r.own_blocks += added
            grown += added
        if grown:
            self.kv.grow(grown)

    def _largest_fitting_run(self, limit: int) -> int:
        """The longest decode run (<= ``limit``) whose new blocks fit in the pool.

        With offsets ``o_i = (t_i - 1) mod B``, ``k = q*B + r`` iterations need
        ``n*q + #{i: o_i + r >= B}`` blocks. With ``A`` blocks available, ``q = A // n``
        and the leftover ``R = A - n*q`` admits every ``r`` below ``B - o_(R+1)``, where
        ``o_(j)`` is the j-th largest offset. One always fits (see _make_room).
        """
        bs = self.block
        running = self.running
        n = len(running)
        available = self.kv.available
        q, leftover = divmod(available, n)
        offsets = sorted([(r.tokens - 1) % bs for r in running], reverse=True)
        best = q * bs + (bs - 1 - offsets[leftover])
        return max(1, min(best, limit))

    @staticmethod
    def _iterations_within(span: float, first: float, slope: float, limit: int) -> int:
        """Whole iterations finished ``span`` seconds into a decode run (< ``limit``)."""
        if slope > 0:
            half = slope / 2
            b = first - half
            j = int((-b + math.sqrt(b * b + 4 * half * span)) / (2 * half))
        else:
            j = int(span / first)

        def t(n: int) -> float:
            return n * first + slope * n * (n - 1) / 2

        while j > 0 and t(j) > span:
            j -= 1
        while j + 1 < limit and t(j + 1) <= span:
            j += 1
        return min(j, limit - 1)
