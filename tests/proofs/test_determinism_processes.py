"""Cross-process determinism (R-DET-3, R-HASH-1, R-PURE-1): stable-mode traces are equal
under different PYTHONHASHSEED values and server orders; the builtin-hash control and a
mutant that indexes pool order both make them differ."""

from __future__ import annotations

from affinity_proofs import det_trace


def test_stable_mode_is_identical_across_seeds_and_the_control_differs() -> None:
    result = det_trace.run_processes()
    assert result.stable_identical, result.detail
    assert result.builtin_differs, result.detail


def test_mutant_that_reads_pool_order_is_refuted() -> None:
    result = det_trace.run_processes(mutant="stable_hash_uses_pool_order")
    assert not result.stable_identical, result.detail


def test_trace_lists_every_acquire_decision() -> None:
    text = det_trace.trace("stable")
    assert text.count('"op":"acquire"') == sum(
        1 for e in det_trace.script(request_hash=False) if type(e).__name__ == "Acquire")
