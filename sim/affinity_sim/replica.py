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

Decode progress is *lazy*, so an event costs O(log n), not O(n) in the running batch:
the replica keeps a decode clock (iterations applied to every decoder) and each decoder
remembers the clock at which its ``tokens``/``remaining`` were last written (``mark``).
``tokens - mark`` and the block offset ``(tokens - 1 - mark) mod B`` stay fixed while it
decodes, so the batch is summarized by a count per offset class (block growth, the
preemption need, the longest fitting run), the sum of ``tokens - mark`` (context read),
and a heap of finish clocks (completions). A decoder's fields are brought up to date
(:meth:`Replica._sync`) only when it is preempted or retires.

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

import heapq
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

    __slots__ = ("admitted", "decoding", "done", "epoch", "group_key", "mark", "own_blocks",
                 "phase", "preempted", "prefill_left", "prefill_pos", "remaining", "shared",
                 "tokens", "traj")

    def __init__(self, env: simpy.Environment, traj: int, group_key: int, shared: int,
                 prompt_tokens: int, output_tokens: int) -> None:
        self.traj = traj
        self.group_key = group_key
        self.shared = shared  # full blocks of the prompt shared with sibling samples
        self.tokens = prompt_tokens  # prompt, then prompt + sampled tokens (as of ``mark``)
        self.remaining = output_tokens  # as of ``mark``
        self.prefill_left = 0
        self.prefill_pos = 0
        self.own_blocks = 0  # as of ``mark``
        self.decoding = False
        self.preempted = False  # vLLM counts a preempted request's re-lookup apart
        self.mark = 0  # the replica's decode clock when the fields above were written
        self.phase = 0  # (tokens - 1 - mark) mod block size, fixed while decoding
        self.epoch = 0  # bumped when it starts or stops decoding (stale heap entries)
        self.admitted = 0  # admission sequence number: the running order
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
        self.prefilling: list[Request] = []  # running, prefill unfinished, admission order
        self.wake: simpy.Event | None = None
        # The decoders, summarized (see "lazy" in the module docstring).
        self.clock = 0
        self.decoders = 0
        self.base_sum = 0  # sum of tokens - mark
        self.phase_count = [0] * self.block
        self.finish: list[tuple[int, int, int, Request]] = []  # (clock, seq, epoch, request)
        self.seq = 0
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
            headroom = self._growth(1)  # kept free for the decoders' next token
            chunks = self._schedule_prefill(self.decoders, headroom)
            if chunks:
                yield env.timeout(self._mixed_time(chunks))
                self._finish_mixed(chunks)
            elif self.running:
                yield from self._decode_run()

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block)

    # -- the decoders, summarized ------------------------------------------------------
    def _start_decoding(self, r: Request) -> None:
        """``r`` (fields current) joins the decoders at the present clock."""
        clock = self.clock
        r.decoding = True
        r.mark = clock
        r.epoch += 1
        r.phase = (r.tokens - 1 - clock) % self.block
        self.phase_count[r.phase] += 1
        self.decoders += 1
        self.base_sum += r.tokens - clock
        self.seq += 1
        heapq.heappush(self.finish, (clock + r.remaining, self.seq, r.epoch, r))

    def _sync(self, r: Request) -> None:
        """Write a decoder's lazy progress into its fields."""
        d = self.clock - r.mark
        if d:
            t = r.tokens
            r.own_blocks += ((t - 1) % self.block + d) // self.block
            r.tokens = t + d
            r.remaining -= d
            r.mark = self.clock

    def _stop_decoding(self, r: Request) -> None:
        self._sync(r)
        self.phase_count[r.phase] -= 1
        self.decoders -= 1
        self.base_sum -= r.tokens - self.clock
        r.decoding = False
        r.epoch += 1

    def _context(self) -> int:
        """KV tokens the decoders read in the next iteration."""
        return self.base_sum + self.decoders * self.clock

    def _growth(self, k: int) -> int:
        """Blocks the decoders must add to sample ``k`` more tokens each.

        ``ceil((t+k)/B) - ceil(t/B) == ((t-1) mod B + k) // B`` for ``t >= 1``; a decoder's
        offset ``(t-1) mod B`` is ``(phase + clock) mod B``.
        """
        bs = self.block
        clock = self.clock
        total = 0
        for phase, count in enumerate(self.phase_count):
            if count:
                total += count * (((phase + clock) % bs + k) // bs)
        return total

    def _count_at_offset(self, offset: int) -> int:
        return self.phase_count[(offset - self.clock) % self.block]

    def _next_finish(self) -> int:
        """The decode clock at which the first decoder completes (stale entries dropped)."""
        heap = self.finish
        while heap[0][2] != heap[0][3].epoch:
            heapq.heappop(heap)
        return heap[0][0]

    def _make_room(self) -> None:
        """Preempt the newest running requests until every decoder has its next slot."""
        bs = self.block
        running = self.running
        need = self._count_at_offset(bs - 1)  # decoders whose next token opens a block
        available = self.kv.available
        while running and need > available:
            victim = running.pop()
            if victim.decoding and (victim.phase + self.clock) % bs == bs - 1:
                need -= 1
            self._preempt(victim)
            available = self.kv.available

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
        return True

    def _schedule_prefill(self, decoding: int, headroom: int) -> list[tuple[Request, int]]:
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
        while budget > 0 and waiting and len(self.running) < model.max_num_seqs:
            head = waiting[0]
            if not self._admit(head, headroom):
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

    def _decode_run(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        model = self.model
        # Every running request decodes: a run starts only when no prefill is pending.
        k = self._next_finish() - self.clock
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
        self._retire()

    def _advance(self, k: int) -> None:
        """``k`` decode iterations: each decoder samples ``k`` tokens and pins new blocks."""
        grown = self._growth(k)
        self.clock += k
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
        n = self.decoders
        q, leftover = divmod(self.kv.available, n)
        seen = 0
        offset = 0
        for offset in range(bs - 1, -1, -1):  # offsets in decreasing order, by class
            seen += self._count_at_offset(offset)
            if seen > leftover:
                break
        best = q * bs + (bs - 1 - offset)
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
