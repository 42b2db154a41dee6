"""A single replica's timeline, computed by hand.

Model used throughout (unless a test says otherwise): an iteration costs
``a + b * tokens`` with a = 10 ms, b = 1 ms per batched token (decode or prefill), no
context or attention terms; 16-token blocks; a 64-token iteration budget.
"""

from __future__ import annotations

import simpy
from affinity_sim.costmodel import ReplicaModel
from affinity_sim.replica import QueueTracker, Replica, Request

A = 0.010
B = 0.001


def model(**changes: object) -> ReplicaModel:
    fields: dict[str, object] = {
        "name": "hand", "decode_fixed_s": A, "per_token_s": B, "kv_read_s_per_token": 0.0,
        "prefill_attn_s_per_pair": 0.0, "kv_capacity_tokens": 16 * 100, "block_size": 16,
        "max_num_seqs": 4, "max_num_batched_tokens": 64,
    }
    fields.update(changes)
    return ReplicaModel(**fields)  # type: ignore[arg-type]


def run(replica_model: ReplicaModel, arrivals: list[tuple[float, int, int, int]]
        ) -> tuple[dict[int, float], Replica]:
    """Submit (time, trajectory, prompt, output) requests; return finish times by trajectory."""
    env = simpy.Environment()
    replica = Replica(env, 0, replica_model, QueueTracker(1))
    finished: dict[int, float] = {}

    def client(at: float, traj: int, prompt: int, output: int):  # type: ignore[no-untyped-def]
        yield env.timeout(at)
        request = Request(env, traj, -1 - traj, 0, prompt, output)
        replica.submit(request)
        yield request.done
        finished[traj] = env.now

    for at, traj, prompt, output in arrivals:
        env.process(client(at, traj, prompt, output))
    env.run()
    return finished, replica


def test_chunked_prefill_then_decode() -> None:
    # prompt 100 with a 64-token budget: chunks of 64 and 36; the second chunk's iteration
    # samples token 1; tokens 2..5 take four decode iterations of 1 token each.
    finished, replica = run(model(), [(0.0, 0, 100, 5)])
    expected = (A + 64 * B) + (A + 36 * B) + 4 * (A + 1 * B)
    assert abs(finished[0] - expected) < 1e-12
    assert replica.iterations == 6
    assert replica.prefill_tokens == 100
    assert replica.query_tokens == 100 and replica.hit_tokens == 0


def test_arrival_joins_at_the_next_iteration_boundary() -> None:
    # A: prompt 16, output 100, alone from t = 0. Its prefill iteration ends at 0.026, then
    # decode iterations of 11 ms. B arrives at t = 0.5: iteration 44 of the run is in
    # progress and ends at 0.026 + 44 * 0.011 = 0.510; B is prefilled in the next one,
    # together with A's decode: A + 1 decode token + 16 prefill tokens = 27 ms.
    finished, replica = run(model(), [(0.0, 0, 16, 100), (0.5, 1, 16, 3)])
    boundary = 0.026 + 44 * 0.011
    b_prefill_end = boundary + (A + (1 + 16) * B)
    # B then needs 2 more tokens in two shared iterations of 2 decode tokens each.
    assert abs(finished[1] - (b_prefill_end + 2 * (A + 2 * B))) < 1e-9
    # A: 1 token at prefill + 44 in the first run + 1 in B's prefill iteration + 2 shared,
    # then 52 alone at 11 ms.
    a_end = b_prefill_end + 2 * (A + 2 * B) + 52 * (A + B)
    assert abs(finished[0] - a_end) < 1e-9
    assert replica.idle_time_until(a_end) == 0.0


def test_decode_run_with_growing_context_is_quadratic() -> None:
    # With a context term c, iteration i of a run costs a + b*B + c*(S0 + i*B).
    c = 1e-5
    m = model(kv_read_s_per_token=c)
    finished, _ = run(m, [(0.0, 0, 32, 21)])
    prefill = A + 32 * B  # samples token 1: context becomes 33
    k = 20
    decode = k * (A + B + c * 33) + c * 1 * k * (k - 1) / 2
    assert abs(finished[0] - (prefill + decode)) < 1e-12


def test_idle_time_and_fcfs_order() -> None:
    # Two requests at t = 1: the replica idles for 1 s; both prefill in one iteration.
    finished, replica = run(model(), [(1.0, 0, 20, 1), (1.0, 1, 20, 1)])
    end = 1.0 + A + 40 * B
    assert abs(finished[0] - end) < 1e-12 and abs(finished[1] - end) < 1e-12
    assert abs(replica.idle_time_until(2.0) - (1.0 + (2.0 - end))) < 1e-12


def test_max_num_seqs_queues_the_rest() -> None:
    # One slot: the second request waits for the first to finish (prefill 16 + 1 token).
    finished, _ = run(model(max_num_seqs=1, max_num_batched_tokens=64),
                      [(0.0, 0, 16, 2), (0.0, 1, 16, 2)])
    first = (A + 16 * B) + (A + B)
    assert abs(finished[0] - first) < 1e-12
    assert abs(finished[1] - 2 * first) < 1e-12


def test_preemption_when_the_pool_runs_out() -> None:
    # 6 blocks. A and B (prompt 16, 40 tokens to generate) prefill together (32 tokens) and
    # hold 2 blocks each. At 33 tokens each takes a 3rd block (6 pinned); the iteration
    # that would write token 49 needs a 4th each, so after a 31-iteration run the newest
    # (B, 48 tokens) is preempted: its 2 full blocks (47 computed tokens) stay cached.
    m = model(kv_capacity_tokens=96)
    finished, replica = run(m, [(0.0, 0, 16, 40), (0.0, 1, 16, 40)])
    t_preempt = (A + 32 * B) + 31 * (A + 2 * B)
    # B (needs 4 blocks) cannot come back while A holds 4; A runs its last 8 tokens alone.
    t_a = t_preempt + 8 * (A + B)
    assert abs(finished[0] - t_a) < 1e-12
    # B re-admitted: hits its own 2 cached blocks (32 tokens), prefills 16, samples token
    # 49 in that iteration, then decodes its last 7 alone. B's 4 blocks reuse its 2 cached
    # ones; with A's 3 cached blocks that is 7 > 6, so A's tail block is evicted.
    assert abs(finished[1] - (t_a + (A + 16 * B) + 7 * (A + B))) < 1e-12
    assert replica.preemptions == 1
    assert (replica.preempted_query_tokens, replica.preempted_hit_tokens) == (48, 32)
    assert (replica.query_tokens, replica.hit_tokens) == (32, 0)
    assert replica.kv.evicted_blocks == 1
    assert dict(replica.kv.lru) == {0: 2, 1: 3}  # A trimmed to 2; B cached 3 (55 // 16)
    assert replica.kv.pinned == 0  # everything released at the end
