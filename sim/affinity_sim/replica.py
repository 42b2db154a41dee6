"""One vLLM-like replica: continuous batching over a block KV pool, as a simpy process.

Theory of operation
-------------------
The replica runs back-to-back *iterations* while it has work, like vLLM's engine loop
(V1 scheduler, FCFS, chunked prefill):

1. **Room for decode.** Every decoding sequence needs a KV slot for the token it is about
   to produce. If the pool cannot give the blocks, the most recently admitted running
   request is preempted (vLLM's recompute preemption): its blocks are freed into the
   prefix cache and it goes back to the head of the waiting queue, keeping its progress.
   With ``skip_waiting_after_preemption`` (vLLM V1's ``if not preempted_reqs``) an
   iteration that preempted admits nobody; admission is tried again the next iteration.
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

Decode progress is *lazy* (:mod:`affinity_sim.decoders`, which :class:`Replica`
inherits): a decode clock, offset-class counts and a heap of finish clocks summarize the
running batch, so an event costs O(log n), not O(n); a decoder's fields are written back
only when it is preempted or retires.

Statistics: prefix-cache queries and hits in tokens, per admission; as in vLLM's
``PrefixCacheStats``, the re-lookup of a preempted request is counted apart and is not part
of the exported hit rate. With ``count_blocked_lookups`` (vLLM before #48860, e.g. 0.24)
the lookups of a head-of-queue request whose KV allocation fails are counted too, one per
iteration (``retry_*``): exactly at a mixed iteration, and for the ``k - 1`` further
iterations of a decode run with the mean of the head's hits at the run's start and end
(its cached blocks can only shrink during the run; exact when nothing of it is evicted).
Also prefill tokens, preemptions, iterations, and idle time (no running and no waiting
request). Queue length changes are reported to a :class:`QueueTracker` shared by the fleet.

Known simplifications (see sim/README.md): blocks of a prompt become hits for a sibling
sample as soon as they are allocated, not when computed; a request whose shared prompt
prefix was evicted recomputes its own cached blocks without allocating them twice.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Generator
from typing import Any

import simpy

from .costmodel import ReplicaModel
from .decoders import LazyDecoders, Request
from .kvcache import KvPool

__all__ = ["QueueTracker", "Replica", "Request"]


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


class Replica(LazyDecoders):
    """A simpy process serving :class:`Request` objects (see the module docstring)."""

    def __init__(self, env: simpy.Environment, index: int, model: ReplicaModel,
                 tracker: QueueTracker) -> None:
        self.env = env
        self.index = index
        self.model = model
        self.tracker = tracker
        super().__init__(model.block_size)
        self.kv = KvPool(model.capacity_blocks, model.block_size)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order; preemption takes the last
        self.prefilling: list[Request] = []  # running, prefill unfinished, admission order
        self.wake: simpy.Event | None = None
        self.query_tokens = 0
        self.hit_tokens = 0
        self.preempted_query_tokens = 0
        self.preempted_hit_tokens = 0
        self.retry_query_tokens = 0  # failed-admission lookups (count_blocked_lookups)
        self.retry_hit_tokens = 0
        self.blocked: Request | None = None  # the head whose admission failed this iteration
        self.blocked_hit = 0  # its cached tokens at that lookup
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
            preempted = self._make_room()
            # vLLM's scheduler leaves the waiting queue alone in a step that preempted.
            hold = preempted and self.model.skip_waiting_after_preemption
            headroom = self._growth(1)  # kept free for the decoders' next token
            chunks = self._schedule_prefill(self.decoders, headroom, admit=not hold)
            if chunks:
                yield env.timeout(self._mixed_time(chunks))
                self._finish_mixed(chunks)
            elif self.running:
                yield from self._decode_run(1 if hold else 0)  # retry admission next step

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block)

    def _make_room(self) -> bool:
        """Preempt the newest running requests until every decoder has its next slot."""
        bs = self.block
        running = self.running
        need = self._count_at_offset(bs - 1)  # decoders whose next token opens a block
        available = self.kv.available
        preempted = False
        while running and need > available:
            victim = running.pop()
            if victim.decoding and (victim.phase + self.clock) % bs == bs - 1:
                need -= 1
            self._preempt(victim)
            preempted = True
            available = self.kv.available
        return preempted

    def _preempt(self, victim: Request) -> None:
        if victim.decoding:
            self._stop_decoding(victim)
            computed = victim.tokens - 1
        else:
            self.prefilling.remove(victim)
            computed = victim.prefill_pos
        self._free(victim, computed)
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
        self.seq += 1
        request.admitted = self.seq
        if request.preempted:
            self.preempted_query_tokens += request.tokens
            self.preempted_hit_tokens += hit_tokens
        else:
            self.query_tokens += request.tokens
            self.hit_tokens += hit_tokens
            request.cached = hit_tokens
        return True

    def _schedule_prefill(self, decoding: int, headroom: int, admit: bool = True
                          ) -> list[tuple[Request, int]]:
        model = self.model
        budget = model.max_num_batched_tokens - decoding
        chunks: list[tuple[Request, int]] = []
        for r in self.prefilling:
            if budget <= 0:
                return chunks
            n = min(r.prefill_left, budget)
            chunks.append((r, n))
            budget -= n
        waiting = self.waiting
        self.blocked = None
        while admit and budget > 0 and waiting and len(self.running) < model.max_num_seqs:
            head = waiting[0]
            if not self._admit(head, headroom):
                if model.count_blocked_lookups:
                    self.blocked = head
                    self.blocked_hit = self._cached_tokens(head)
                    self._count_retries(head, 1, self.blocked_hit)
                break  # FCFS: the head blocks the queue
            waiting.popleft()
            self.running.append(head)
            self.prefilling.append(head)
            n = min(head.prefill_left, budget)
            chunks.append((head, n))
            budget -= n
        return chunks

    def _mixed_time(self, chunks: list[tuple[Request, int]]) -> float:
        prefill = 0
        pairs = 0.0
        for r, n in chunks:
            prefill += n
            pairs += n * r.prefill_pos + n * (n + 1) / 2  # causal: query q sees q+1 keys
        self.prefill_tokens += prefill
        return self.model.iteration_time(self.decoders, self._context(), prefill, pairs)

    def _finish_mixed(self, chunks: list[tuple[Request, int]]) -> None:
        self.iterations += 1
        self._advance(1)
        finished_prefill = False
        for r, n in chunks:
            r.prefill_left -= n
            r.prefill_pos += n
            if r.prefill_left == 0:
                finished_prefill = True
                r.tokens += 1  # the prefill iteration samples the first token
                r.remaining -= 1
                self._start_decoding(r)
        if finished_prefill:
            self.prefilling = [r for r in self.prefilling if not r.decoding]
        self._retire()

    def _retire(self) -> None:
        heap = self.finish
        clock = self.clock
        done: list[Request] = []
        while heap and heap[0][0] <= clock:
            _, _, epoch, r = heapq.heappop(heap)
            if epoch == r.epoch:
                done.append(r)
        if not done:
            return
        done.sort(key=lambda r: r.admitted)  # running order
        now = self.env.now
        for r in done:
            self._stop_decoding(r)
            self._free(r, r.tokens - 1)
            self.tracker.change(self.index, -1, now)
            r.done.succeed(now)
        running = self.running
        for r in done:
            running.remove(r)  # identity match; done is a handful, running a few hundred

    def _decode_run(self, limit: int = 0) -> Generator[simpy.Event, Any, None]:
        """Decode iterations up to the next event (at most ``limit`` when it is > 0)."""
        env = self.env
        model = self.model
        # Every running request decodes: a run starts only when no prefill is pending.
        k = self._next_finish() - self.clock
        if limit:
            k = min(k, limit)
        if self._growth(k) > self.kv.available:
            k = self._largest_fitting_run(k)
        batch = self.decoders
        slope = model.kv_read_s_per_token * batch  # each iteration adds B context tokens
        first = model.iteration_time(batch, self._context(), 0, 0.0)

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
        self._advance(k)
        head = self.blocked
        if head is not None and k > 1:
            # vLLM retried the head at each of the run's k - 1 later iterations.
            self._count_retries(head, k - 1, (self.blocked_hit + self._cached_tokens(head)) / 2)
        self._retire()

    def _cached_tokens(self, r: Request) -> int:
        return self.kv.lookup(r.group_key, r.shared, r.traj, r.tokens) * self.block

    def _count_retries(self, r: Request, lookups: int, hit_tokens: float) -> None:
        """``lookups`` failed-admission lookups of ``r``, each finding ``hit_tokens``."""
        if r.preempted:
            self.preempted_query_tokens += lookups * r.tokens
            self.preempted_hit_tokens += round(lookups * hit_tokens)
        else:
            self.retry_query_tokens += lookups * r.tokens
            self.retry_hit_tokens += round(lookups * hit_tokens)

    def _advance(self, k: int) -> None:
        """``k`` decode iterations: each decoder samples ``k`` tokens and pins new blocks."""
        grown = self._growth(k)
        self.clock += k
        if grown:
            self.kv.grow(grown)

    def _largest_fitting_run(self, limit: int) -> int:
        """The longest decode run (<= ``limit``) whose new blocks fit in the pool now."""
        return self._fitting_run(limit, self.kv.available)
