"""A replica's running decoders, summarized so that an event costs O(log n), not O(n).

Theory of operation
-------------------
Between two events every decoding sequence of a replica samples one token per iteration,
so its fields change in lock-step with the others'. Writing them at every event would
cost O(running batch) per event; instead :class:`LazyDecoders` keeps a decode *clock*
(iterations applied to every decoder) and each :class:`Request` remembers the clock at
which its ``tokens``/``remaining``/``own_blocks`` were last written (``mark``).
``tokens - mark`` and the block offset ``(tokens - 1 - mark) mod B`` stay fixed while a
request decodes, so the batch is fully described by

* a count of decoders per offset class (``phase_count``): how many blocks ``k`` more
  iterations pin (:meth:`LazyDecoders._growth`), how many decoders open a block in the
  next iteration, the longest run that fits the pool (:meth:`_fitting_run`);
* the sum of ``tokens - mark`` (``base_sum``): the context the next iteration reads;
* a heap of finish clocks (``finish``): the next completion in O(log n); entries of a
  request that stopped decoding are stale (``epoch``) and dropped lazily.

A decoder's fields are brought up to date (:meth:`_sync`) only when it stops decoding
(preemption or completion), so results are bit-identical to advancing every sequence at
every iteration. :class:`~affinity_sim.replica.Replica` inherits this bookkeeping.
"""

from __future__ import annotations

import heapq
import math

import simpy

__all__ = ["LazyDecoders", "Request"]


class Request:
    """One turn of one trajectory, as the replica sees it."""

    __slots__ = ("admitted", "cached", "decoding", "done", "epoch", "group_key", "mark",
                 "own_blocks", "phase", "preempted", "prefill_left", "prefill_pos", "remaining",
                 "shared", "tokens", "traj")

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
        # Prompt tokens found in the prefix cache at the first admission: what vLLM reports
        # to the client as usage.prompt_tokens_details.cached_tokens.
        self.cached = 0
        self.done = env.event()


class LazyDecoders:
    """The decoders of one replica: clock, offset classes, context sum, finish heap."""

    def __init__(self, block_size: int) -> None:
        self.block = block_size
        self.clock = 0
        self.decoders = 0
        self.base_sum = 0  # sum of tokens - mark
        self.phase_count = [0] * block_size
        self.finish: list[tuple[int, int, int, Request]] = []  # (clock, seq, epoch, request)
        self.seq = 0  # heap tie-breaker and admission order

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

    def _fitting_run(self, limit: int, available: int) -> int:
        """The longest decode run (<= ``limit``) whose new blocks fit in the pool.

        With offsets ``o_i = (t_i - 1) mod B``, ``k = q*B + r`` iterations need
        ``n*q + #{i: o_i + r >= B}`` blocks. With ``A`` blocks available, ``q = A // n``
        and the leftover ``R = A - n*q`` admits every ``r`` below ``B - o_(R+1)``, where
        ``o_(j)`` is the j-th largest offset. One always fits (see _make_room).
        """
        bs = self.block
        n = self.decoders
        q, leftover = divmod(available, n)
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
