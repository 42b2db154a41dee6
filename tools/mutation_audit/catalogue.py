"""An independent mutant set of ``affinity_core``: realistic one-line bugs, as source edits.

Theory of operation
-------------------
``proofs/affinity_proofs/mutants.py`` holds the negative controls that ``affinity verify``
refutes in every run; a checker tuned to its own controls can still miss everything else.
This catalogue is written separately, from spec/SPEC.md and the core's source, and is
never imported by the proof suite. Each :class:`SourceMutant` replaces one exact snippet
(it must occur exactly once) of one file under ``affinity_core/`` -- the kind of slip a
person makes while writing or refactoring that line: a comparison off by one, a swapped
operand, a forgotten guard, the wrong field. :mod:`tools.mutation_audit.run` applies each
one to a scratch copy of the repository and runs ``affinity verify`` alone against it.

``equivalent`` marks a mutant that no observable behaviour distinguishes (with the reason);
those are excluded from the kill rate's denominator, and every such claim is argued in
proofs/README.md.
"""

from __future__ import annotations

import attrs

__all__ = ["CATALOGUE", "SourceMutant", "by_id"]


@attrs.frozen
class SourceMutant:
    id: str
    path: str  # relative to the repository root
    old: str
    new: str
    description: str
    equivalent: str | None = None  # why no observable behaviour differs


def _m(id: str, path: str, old: str, new: str, description: str,
       equivalent: str | None = None) -> SourceMutant:
    return SourceMutant(id, f"affinity_core/{path}", old, new, description, equivalent)


CATALOGUE: tuple[SourceMutant, ...] = (
    # ------------------------------------------------------------------ policy.py
    # (since e3e4888 the keep rule compares with ``band``, the margin or the context band)
    _m("keep_lt", "policy.py", "return pool.load(pinned) <= pool.min_load + band",
       "return pool.load(pinned) < pool.min_load + band", "keep rule strict <"),
    _m("keep_minus_one", "policy.py", "return pool.load(pinned) <= pool.min_load + band",
       "return pool.load(pinned) <= pool.min_load + band - 1", "keep band one too narrow"),
    _m("keep_vs_max", "policy.py", "return pool.load(pinned) <= pool.min_load + band",
       "return pool.load(pinned) <= pool.max_load + band", "keep band measured from max"),
    _m("margin_truthy", "policy.py", "if band is not None:", "if band:",
       "margin 0 treated as no margin"),
    _m("det_ignored_in_keep", "policy.py",
       "    if plan.full_determinism:\n        return True\n    band",
       "    if plan.full_determinism and plan.margin is None:\n"
       "        return True\n    band", "margin applied under full_determinism"),
    # the context band (SPEC section 7.5)
    _m("band_no_cap", "policy.py", "return min(margin + (context_tokens or 0) // tokens, cap)",
       "return margin + (context_tokens or 0) // tokens", "context band without its cap"),
    _m("band_mod", "policy.py", "(context_tokens or 0) // tokens",
       "(context_tokens or 0) % tokens", "context band: c % T instead of c // T"),
    _m("band_context_without_tokens", "policy.py",
       "    if margin is None or tokens is None:\n        return margin\n",
       "    if margin is None or tokens is None:\n"
       "        return margin if margin is None else margin + (context_tokens or 0)\n",
       "the context widens the margin although T is null"),
    _m("band_under_determinism", "policy.py",
       "    if plan.full_determinism:\n        return True\n    band",
       "    if plan.full_determinism and plan.tokens is None:\n"
       "        return True\n    band", "context band applied under full_determinism"),
    _m("gate_abs_zero_enables", "policy.py", "gate.balance_abs_threshold <= 0:",
       "gate.balance_abs_threshold < 0:", "gate abs 0 does not disable the gate"),
    _m("gate_abs_ge", "policy.py", "high - low > gate.balance_abs_threshold",
       "high - low >= gate.balance_abs_threshold", "gate absolute test >= instead of >"),
    _m("gate_rel_inverted", "policy.py",
       "high * rel.denominator > low * rel.numerator",
       "high * rel.numerator > low * rel.denominator",
       "gate relative test with numerator and denominator swapped"),
    _m("gate_rel_ge", "policy.py", "high * rel.denominator > low * rel.numerator",
       "high * rel.denominator >= low * rel.numerator", "gate relative test >= instead of >"),
    _m("gate_or", "policy.py", "and high * rel.denominator", "or high * rel.denominator",
       "gate imbalanced if either test holds"),
    _m("gate_pin_on_max", "policy.py", "if pool.load(pinned) == low or",
       "if pool.load(pinned) == high or", "gate keeps a pin on the maximum, not the minimum"),
    _m("first_tie_last", "policy.py", "        return 0\n", "        return ties - 1\n",
       "first tie-break takes the last tied server"),
    _m("hashed_ignores_hash", "policy.py", "return stable_hash(event.request_id) % ties",
       "return event.tie_draw % ties", "hashed tie-break uses the draw"),
    _m("draw_off_by_one", "policy.py", "return event.tie_draw % ties",
       "return (event.tie_draw + 1) % ties", "draw tie-break shifted by one"),
    _m("caller_hash_abs", "policy.py", "pool.servers[event.request_hash % len(pool.servers)]",
       "pool.servers[abs(event.request_hash) % len(pool.servers)]",
       "caller hash mode: abs(h) mod n instead of the floored mod"),
    _m("stable_pool_order", "policy.py",
       "return sorted_servers[stable_hash(event.request_id) % len(sorted_servers)]",
       "return pool.servers[stable_hash(event.request_id) % len(sorted_servers)]",
       "stable hash mode indexes pool order"),
    # ----------------------------------------------------------------- machine.py
    _m("removed_hit_as_miss", "machine.py", "return _HIT_REMOVED, pinned",
       "return _MISS, None", "a pin on a removed server is treated as a miss"),
    _m("stable_needs_hash", "machine.py",
       "if config.hash_mode is HashMode.CALLER and event.request_hash is None:",
       "if event.request_hash is None:", "stable hash mode also demands request_hash"),
    _m("det_allows_unkeyed", "machine.py", "        if event.request_id is None:\n"
       "            return Rejected(", "        if event.request_id is None and False:\n"
       "            return Rejected(", "full_determinism accepts an unkeyed acquire"),
    _m("removed_entry_not_deleted", "machine.py", "lru = lru.delete(rid)", "lru = lru",
       "a removed-server hit does not delete the stale entry"),
    _m("hit_no_touch", "machine.py", "lru = lru.touch(rid)", "lru = lru",
       "a sticky hit does not refresh recency"),
    _m("evicted_not_reported", "machine.py", "evicted = lru.evicts_on_put(rid)",
       "evicted = None", "Acquired.evicted never reported"),
    _m("previous_only_on_break", "machine.py",
       "previous = pinned if lookup is _HIT_BREAK or lookup is _HIT_REMOVED else None",
       "previous = pinned if lookup is _HIT_BREAK else None",
       "previous not reported on reselected"),
    _m("previous_always", "machine.py",
       "previous = pinned if lookup is _HIT_BREAK or lookup is _HIT_REMOVED else None",
       "previous = pinned", "previous reported on kept hits too",
       equivalent="since commit 4865101 a kept hit (and a first placement without eviction) "
       "returns its shared outcome before this line; every path that still reaches it has "
       "pinned = None unless it is broken or reselected, where previous = pinned anyway"),
    _m("broken_counted_kept", "machine.py", "        broken += 1", "        kept += 1",
       "a break increments affinity_kept"),
    _m("release_external", "machine.py", "if state.inflight(sid) == 0:",
       "if state.pool.load(sid) == 0:", "release clamps on the effective load, not F"),
    _m("at_zero_wrong_result", "machine.py",
       "return Transition(state, Released(sid, ReleaseResult.AT_ZERO))",
       "return Transition(state, Released(sid, ReleaseResult.UNKNOWN_SERVER))",
       "a release at zero reports unknown_server"),
    _m("lease_book_dropped", "machine.py",
       "return Transition(_with(state, pool=state.pool, leases=leases), Released(sid, result))",
       "return Transition(state, Released(sid, result))",
       "stale/unknown lease release does not update the book"),
    _m("lease_results_swapped", "machine.py",
       'ReleaseResult.STALE_LEASE if verdict == "stale" else ReleaseResult.UNKNOWN_LEASE',
       'ReleaseResult.UNKNOWN_LEASE if verdict == "stale" else ReleaseResult.STALE_LEASE',
       "stale and unknown lease results swapped"),
    _m("add_active_no_reset", "machine.py",
       "if sid not in loads or not config.lease_accounting:", "if sid not in loads:",
       "legacy add of an active server keeps its count"),
    _m("add_keeps_external", "machine.py", "            if sid in external:\n",
       "            if sid in external and sid not in loads:\n",
       "add_servers keeps the external load of a reset server"),
    _m("clear_reports_effective", "machine.py",
       "StickyCacheCleared(len(state.lru), state.inflight_items())",
       "StickyCacheCleared(len(state.lru), state.pool.items())",
       "clear reports effective loads instead of F"),
    _m("clear_counts_after", "machine.py",
       "StickyCacheCleared(len(state.lru), state.inflight_items())",
       "StickyCacheCleared(len(state.lru.cleared()), state.inflight_items())",
       "clear reports the entries after clearing"),
    _m("observe_negative_external", "machine.py", "extra = max(0, observed - inflight)",
       "extra = observed - inflight", "observation may set a negative external load"),
    _m("observe_sets_inflight", "machine.py", "pool = pool.set_load(sid, inflight + extra)",
       "pool = pool.set_load(sid, observed)", "observation overwrites the effective load"),
    _m("observe_updated_as_ignored", "machine.py", "        updated.append(sid)",
       "        ignored.append(sid)", "updated servers listed as ignored"),
    _m("remove_keeps_epoch", "machine.py",
       "leases = state.leases.closed(event.server_ids)", "leases = state.leases",
       "remove_servers does not end the lease epoch"),
    _m("unkeyed_not_counted", "machine.py", "pool.add_load(chosen, 1), lru",
       "pool.add_load(chosen, 1 if rid is not None else 0), lru",
       "an unkeyed acquire is not counted"),
    # ------------------------------------------------------------------- loads.py
    _m("tie_count_all_leaves", "loads.py",
       "        elif child_min == low:\n            at_low += counts[i]",
       "        else:\n            at_low += counts[i]",
       "tie count sums children above the minimum too, not only those at it"),
    _m("leaf_max_last", "loads.py", "    return (low, count, high, loads)",
       "    return (low, count, loads[-1], loads)", "leaf max is its last load"),
    _m("node_max_last", "loads.py",
       "return (low, at_low, high, children, mins, counts, maxes)",
       "return (low, at_low, maxes[-1], children, mins, counts, maxes)",
       "internal max is the last child's"),
    _m("kth_tie_le", "loads.py", "while k >= counts[i]:", "while k > counts[i]:",
       "k-th tie descent off by one across leaves"),
    _m("kth_tie_skip_one", "loads.py", "k -= counts[i]", "k -= 1",
       "k-th tie descent skips one per leaf"),
    _m("total_plus_one", "loads.py", "0, self.total + delta)",
       "0, self.total + 1)", "total moves by +1 on every update (one-leaf tables)"),
    # --------------------------------------------------------------------- lru.py
    # (since issue 16 the map is a shared write log with a window [lo, hi); see lru.py)
    _m("touch_keeps_oldest", "lru.py",
       "if log[lo] is old:  # the least recent entry moved to the end",
       "if log[lo] is cell:  # the least recent entry moved to the end",
       "touch compares the window's first record with the new one, so touching the oldest "
       "key does not advance lo"),
    _m("evicts_on_put_le", "lru.py", "self.size < self.capacity else oldest",
       "self.size <= self.capacity else oldest", "evicts_on_put misses the eviction when full"),
    _m("evicts_newest", "lru.py", "oldest = _key(store.log[self.lo])",
       "oldest = _key(store.log[self.hi - 1])", "evicts_on_put names the newest key"),
    _m("put_evicts_late", "lru.py", "if size >= self.capacity:",
       "if size > self.capacity:", "put evicts only above capacity"),
    _m("rederive_ignores_deletions", "lru.py", "index.pop(request_id, None)",
       "index.get(request_id, None)",
       "an old version re-derives its entries without applying deletion records"),
    # ------------------------------------------------------------------ leases.py
    _m("settle_newest_first", "leases.py", "epoch, count = held[0]", "epoch, count = held[-1]",
       "a release settles the newest epoch first"),
    _m("unknown_not_counted", "leases.py",
       "self._with(self.held, self.unknown_leases + 1, self.stale_leases)",
       "self._with(self.held, self.unknown_leases, self.stale_leases)",
       "unknown_leases not counted"),
    _m("stale_not_counted", "leases.py",
       'stale = self.stale_leases + 1 if verdict == "stale" else self.stale_leases',
       "stale = self.stale_leases", "stale_leases not counted"),
    _m("readd_new_epoch", "leases.py", "            if sid not in epoch:\n",
       "            if True:\n", "adding an active server opens a new epoch"),
    # ------------------------------------------------------------------ status.py
    _m("status_total_effective", "status.py", '"total_inflight": state.inflight_total',
       '"total_inflight": state.pool.total', "status total_inflight includes external load"),
    _m("status_servers_effective", "status.py", '"servers": dict(items)',
       '"servers": dict(state.pool.items())', "status servers report effective loads"),
    _m("status_sticky_capacity", "status.py", '"sticky_entries": len(state.lru)',
       '"sticky_entries": state.lru.capacity', "status sticky_entries is the capacity"),
    _m("status_broken_is_kept", "status.py", '"affinity_broken": state.affinity_broken',
       '"affinity_broken": state.affinity_kept', "status affinity_broken copies kept"),
    _m("status_external_effective", "status.py", "{s: state.external[s] for s",
       "{s: state.pool.load(s) for s", "status external_loads reports effective loads"),
    _m("status_unknown_is_stale", "status.py",
       'out["unknown_leases"] = state.leases.unknown_leases',
       'out["unknown_leases"] = state.leases.stale_leases', "status unknown_leases is stale"),
    # ------------------------------------------------------------------ config.py
    # (since e3e4888 margin, T and cap share one integer validator)
    _m("margin_zero_refused", "config.py", "return _optional_int_at_least(value, key, 0)",
       "return _optional_int_at_least(value, key, 1)", "margin 0 refused"),
    _m("margin_fraction_accepted", "config.py",
       "(math.isfinite(value) and value.is_integer())", "math.isfinite(value)",
       "margin 0.5 accepted (truncated)"),
    _m("margin_bool_accepted", "config.py",
       "        not isinstance(value, bool)\n        and isinstance(value, (int, float))",
       "        isinstance(value, (int, float))", "margin True accepted"),
    _m("band_cap_below_margin", "config.py", "        if cap < margin:",
       "        if cap < margin - 1:", "affinity_break_band_cap = margin - 1 accepted"),
    _m("band_tokens_zero_accepted", "config.py",
       'return validate_optional_positive(value, "affinity_break_tokens")',
       'return validate_margin(value, "affinity_break_tokens")',
       "affinity_break_tokens 0 accepted"),
    _m("cache_zero_accepted", "config.py", "not isinstance(value, int) or value < 1:",
       "not isinstance(value, int) or value < 0:", "max_cache_size 0 accepted"),
    _m("rel_below_one", "config.py", "if rel is None or rel < 1:",
       "if rel is None or rel < 0:", "balance_rel_threshold below 1 accepted"),
    _m("rel_binary_float", "config.py", "rel = Fraction(str(value))", "rel = Fraction(value)",
       "a float rel is read as its binary double"),
    _m("rel_bool_accepted", "config.py", "    elif isinstance(value, bool):\n        rel = None",
       "    elif isinstance(value, bool) and value is None:\n        rel = None",
       "balance_rel_threshold True accepted"),
    _m("abs_bool_accepted", "config.py",
       "        if isinstance(value, bool) or not isinstance(value, int):\n"
       "            raise ConfigError(f\"balance_abs",
       "        if not isinstance(value, int):\n            raise ConfigError(f\"balance_abs",
       "balance_abs_threshold True accepted"),
    _m("margin_and_gate", "config.py",
       "if value is not None and self.affinity_break_margin is not None:",
       "if value is not None and self.affinity_break_margin is None:",
       "margin and gate accepted together; a gate alone refused"),
    _m("det_int_accepted", "config.py",
       "        if not isinstance(value, bool):\n"
       "            raise ConfigError(f\"full_determinism",
       "        if not isinstance(value, (bool, int)):\n"
       "            raise ConfigError(f\"full_determinism",
       "full_determinism accepts 0/1"),
    # ------------------------------------------------------------------- state.py
    _m("duplicate_servers_accepted", "state.py", "if len(set(ids)) != len(ids):",
       "if len(set(ids)) != len(set(ids)):", "duplicate initial servers accepted"),
    _m("sorted_is_pool_order", "state.py", "sorted_servers=tuple(sorted(ids)),",
       "sorted_servers=tuple(ids),", "initial sorted mirror in pool order"),
    _m("inflight_total_effective", "state.py",
       "return self.pool.total - sum(self.external.values())", "return self.pool.total",
       "inflight_total includes external load"),
    _m("initial_lease_epochs_missing", "state.py",
       "leases = LeaseBook().opened(tuple(ids)) if config.lease_accounting else LeaseBook()",
       "leases = LeaseBook()", "no lease epochs for the initial servers"),
    # ----------------------------------------------------------------- hashing.py
    _m("hash_adler", "hashing.py", 'zlib.crc32(text.encode("utf-8"))',
       'zlib.adler32(text.encode("utf-8"))', "stable_hash uses Adler-32, not CRC-32"),
)


def by_id(mutant_id: str) -> SourceMutant:
    for m in CATALOGUE:
        if m.id == mutant_id:
            return m
    raise KeyError(f"no audit mutant {mutant_id!r}; known: {', '.join(m.id for m in CATALOGUE)}")
