"""The audit's third independent set (``operator_``): mechanical operators and refactors.

Theory of operation
-------------------
Written blind -- from spec/SPEC.md and the core's source, before reading
:mod:`tools.mutation_audit.catalogue` or the proofs' mutants -- by thinking like a
mutation tool (mutmut / cosmic-ray operators: ``<`` <-> ``<=``, ``and`` -> ``or``,
constants +-1, deleted statements, changed slice bounds, swapped operands) and like a
contributor who "optimises" the core. Entries that repeat an earlier one (same line,
same effect) were dropped after the blind phase; what is left extends the catalogue
(:data:`OPERATOR_SET` is appended to ``CATALOGUE``). Each ``equivalent`` claim is argued in
docs/records/2026-12-proofs-audit.md.
"""

from __future__ import annotations

from .source_mutant import SourceMutant
from .source_mutant import mutant as _m

__all__ = ["OPERATOR_SET"]

OPERATOR_SET: tuple[SourceMutant, ...] = (
    # policy.py
    _m("operator_band_absent_is_one", "policy.py", "(context_tokens or 0) // tokens",
       "(context_tokens or 1) // tokens", "absent context counts as 1 token, not 0"),
    _m("operator_band_guard_and", "policy.py", "if margin is None or tokens is None:",
       "if margin is None and tokens is None:", "band guard or -> and"),
    _m("operator_gate_on_min_le", "policy.py", "if pool.load(pinned) == low or",
       "if pool.load(pinned) <= low or", "pin-on-minimum test == -> <=",
       equivalent="load(pin) >= min always, so <= low holds exactly when == low"),
    _m("operator_hashed_or", "policy.py", "if mode is _HASHED and event.request_id is not None:",
       "if mode is _HASHED or event.request_id is not None:",
       "draw mode hashes keyed requests"),
    _m("operator_first_falls_to_draw", "policy.py",
       "    if mode is _FIRST:\n        return 0\n", "",
       "first mode deleted: falls through to the draw"),
    _m("operator_det_keep_deleted", "policy.py",
       "    if plan.full_determinism:\n        return True\n    band", "    band",
       "keep_pin evaluates load under full_determinism"),
    # machine.py
    _m("operator_shared_or", "machine.py",
       "if evicted is None and (lookup is _HIT_KEEP or lookup is _MISS):",
       "if evicted is None or (lookup is _HIT_KEEP or lookup is _MISS):",
       "shared-outcome fast path taken with an eviction"),
    _m("operator_shared_unkeyed", "machine.py",
       "if evicted is None and (lookup is _HIT_KEEP or lookup is _MISS):",
       "if evicted is None and (lookup is _HIT_KEEP or lookup is _UNKEYED):",
       "fast path for unkeyed instead of miss",
       equivalent="both branches build Acquired(chosen, path) with previous and evicted None"),
    _m("operator_touch_keep_only", "machine.py", "    elif pinned is not None:\n        assert rid",
       "    elif lookup is _HIT_KEEP:\n        assert rid", "broken hit not touched before re-pin",
       equivalent="the re-pin's put of the present key makes it most recent anyway"),
    _m("operator_det_place_any_choice", "machine.py",
       "elif choice is _PLACE and plan.full_determinism:\n        chosen = deterministic_server(",
       "elif plan.full_determinism:\n        chosen = deterministic_server(",
       "re-pins placed deterministically",
       equivalent="keep_pin keeps every pin under full_determinism: no HIT_BREAK there"),
    _m("operator_no_lease_grant", "machine.py",
       "    if plan.lease_accounting:\n        leases = leases.grant(rid, chosen)\n", "",
       "acquire grants no lease"),
    _m("operator_observe_stores_zero", "machine.py",
       "external = external.set(sid, extra) if extra else (",
       "external = external.set(sid, extra) if True else (", "zero external entries stored"),
    _m("operator_step_ignores_table", "machine.py",
       "if handler is _ACQUIRE_HANDLER and isinstance(event, _ACQUIRE_EVENT):",
       "if isinstance(event, _ACQUIRE_EVENT):", "step bypasses the (patched) transition table"),
    # loads.py
    _m("operator_bump_count_ge1", "loads.py", "if delta == 1 and (old != low or count > 1):",
       "if delta == 1 and (old != low or count >= 1):", "unique minimum moving up not rescanned"),
    _m("operator_bump_new_le", "loads.py",
       "if new < low:\n            return (new, 1, high, changed)",
       "if new <= low:\n            return (new, 1, high, changed)",
       "joining the minimum resets its count to 1"),
    _m("operator_summarise_skip_first", "loads.py", "for i in range(len(mins)):",
       "for i in range(1, len(mins)):", "internal summary skips its first child"),
    _m("operator_base_shift", "loads.py", "base += i << (_BITS * level)",
       "base += i << (_BITS * (level - 1))", "k-th tie position shifted one level short"),
    _m("operator_deep_total", "loads.py",
       "return LoadTable(self.servers, self.position, new, self.depth, self.total + delta)",
       "return LoadTable(self.servers, self.position, new, self.depth, self.total)",
       "deep tables do not update the total"),
    _m("operator_build_two_leaves", "loads.py", "while len(level) > 1:", "while len(level) > 2:",
       "two leaves get no root above them"),
    # lru.py
    _m("operator_touch_next_from_lo", "lru.py",
       "lo = _next_live(index, log, lo + 1, hi + 1)\n"
       "        return _settled(self.capacity, self.size, lo",
       "lo = _next_live(index, log, lo, hi + 1)\n"
       "        return _settled(self.capacity, self.size, lo",
       "touch rescans from lo, not lo + 1",
       equivalent="log[lo] is the superseded record, not live, so the scan skips it"),
    _m("operator_own_skips_first", "lru.py", "for cell in log[self.lo:]:",
       "for cell in log[self.lo + 1:]:", "re-derived old version loses its oldest entry"),
    # legacy.py
    _m("operator_legacy_release_ge", "legacy.py", "if server_id in loads and loads[server_id] > 0:",
       "if server_id in loads and loads[server_id] >= 0:", "oracle release goes below zero"),
    _m("operator_legacy_det_sorted", "legacy.py", "chosen = active[request_hash % len(active)]",
       "chosen = sorted(active)[request_hash % len(active)]", "oracle hashes over sorted ids"),
    _m("operator_legacy_no_stale_delete", "legacy.py",
       "        lru = tuple((k, v) for k, v in lru if k != request_id)  # del cache[request_id]\n",
       "", "oracle keeps the stale entry"),
    # config.py
    _m("operator_tokens_zero_ok", "config.py", "return _optional_int_at_least(value, key, 1)",
       "return _optional_int_at_least(value, key, 0)", "T = 0 and cap = 0 accepted"),
    _m("operator_rel_le_one", "config.py",
       "if rel is None or rel < 1:", "if rel is None or rel <= 1:",
       "rel threshold 1 rejected"),
    _m("operator_evaluates_or", "config.py",
       'return self.policy != "legacy" and not self.full_determinism',
       'return self.policy != "legacy" or not self.full_determinism', "evaluates_pins and -> or"),
    _m("operator_rel_default", "config.py", "default=Fraction(3, 2)", "default=Fraction(2, 1)",
       "gate rel default 3/2 -> 2"),
    _m("operator_cache_default", "config.py", "DEFAULT_MAX_CACHE_SIZE = 10000",
       "DEFAULT_MAX_CACHE_SIZE = 10001", "default cache size +1"),
    # codec.py
    _m("operator_codec_draw_gt1", "codec.py", "if event.tie_draw:", "if event.tie_draw > 1:",
       "tie_draw 1 not encoded"),
    _m("operator_codec_zero_external", "codec.py",
       '_object(obj.get("external", {}), "state.external").items() if v != 0}',
       '_object(obj.get("external", {}), "state.external").items()}',
       "zero external entries decoded into the state"),
    _m("operator_codec_rel_slash", "codec.py", "    return str(rel)",
       '    return f"{rel.numerator}/{rel.denominator}"', "integral rel written p/1"),
    _m("operator_codec_neg_load", "codec.py", "if any(n < 0 for _, n in servers):",
       "if any(n < -1 for _, n in servers):", "initial load -1 accepted"),
    # events.py
    _m("operator_event_ctx_le", "events.py", "(not _is_int(value) or value < 0):",
       "(not _is_int(value) or value <= 0):", "context_tokens 0 rejected"),
    # leases.py
    _m("operator_lease_zero_count", "leases.py", "if count > 1 else ()", "if count > 0 else ()",
       "settled lease leaves a zero-count entry"),
    # status.py / state.py
    _m("operator_state_inflight_plus", "state.py",
       "return self.pool.load(server_id) - external.get(server_id, 0)",
       "return self.pool.load(server_id) + external.get(server_id, 0)", "in-flight adds external"),
    # invariants.py
    _m("operator_inv_within_plus1", "invariants.py",
       "return pre.pool.load(o.server_id) <= low + band",
       "return pre.pool.load(o.server_id) <= low + band + 1", "within_band one too loose"),
    _m("operator_inv_counters_2", "invariants.py", "dk >= 0 and db >= 0 and dk + db <= 1",
       "dk >= 0 and db >= 0 and dk + db <= 2", "counters may move by two"),
    _m("operator_inv_starve_ge", "invariants.py", "if pre.pool.min_load > 0:",
       "if pre.pool.min_load >= 0:",
       "no_starvation vacuous"),
    _m("operator_inv_break_same", "invariants.py", "        and o.server_id != o.previous\n", "",
       "break_moves accepts a break to the same server"),
    _m("operator_inv_hits_kept_only", "invariants.py", "hits += o.path in (Path.KEPT, Path.BROKEN)",
       "hits += o.path in (Path.KEPT,)", "ledger counts only kept hits"),
    _m("operator_inv_wf_broken", "invariants.py", "        and state.affinity_broken >= 0\n", "",
       "well_formed drops the broken-counter check"),
    # allowed.py
    _m("operator_allowed_first_tie", "allowed.py", "    return state.pool.least_loaded_all()\n",
       "    return state.pool.least_loaded_all()[:1]\n", "allowed only the first tie"),
)
