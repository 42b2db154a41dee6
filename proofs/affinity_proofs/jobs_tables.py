"""The table jobs of ``affinity verify``: the decision table (15) with ``draw_for``'s
feedback and the predicates' exhibits (0), the configuration table (19) with the event,
encoding and derived-flag tables, and SPEC's worked examples (18).

Theory of operation
-------------------
Each job runs its table on the real core, then the same table with each of its negative
controls applied, in the same worker process, and returns finished rows. A control of
the context band meets only the band's configurations (it stops at its first
disagreement, and the band's rows are the only place it can bite).
"""

from __future__ import annotations

import time

from .jobs import describe
from .report import OBLIGATIONS, MutantVerdict, Row
from .scopes import Scope

__all__ = ["config_job", "decision_table_job", "input_rows"]


def decision_table_job(scope: Scope) -> list[Row]:
    """Obligation 15 beyond the BFS loads: every acquire over a table of load vectors and
    wide pools, against SPEC's plain rules; the control is a tie-break mutant."""
    from . import decision_table
    from .mutants import by_name

    start = time.perf_counter()
    top = scope.decision_table_max
    checked, failures = decision_table.check_table(top)
    verdicts = []
    # the band's control meets the band's configurations only (same checker, same table)
    for name, configs in (("ties_last_in_order", None),
                          ("band_no_cap", decision_table.BAND_CONFIGS)):
        with by_name(name).applied():
            _, found = decision_table.check_table(top, configs=configs)
        verdicts.append(MutantVerdict(name, describe(name), bool(found),
                                      found[0] if found else "no disagreement"))
    return [Row(15, "decision table (plain rules)",
                f"N<=3 loads<={top}, N=33..65, {len(decision_table.CONFIGS)} configs "
                f"({len(decision_table.BAND_CONFIGS)} with the context band)",
                not failures, time.perf_counter() - start, tuple(verdicts),
                "; ".join(failures) if failures else
                f"{checked} acquires: outcome and successor as SPEC's rules say",
                requirements=(*next(o for o in OBLIGATIONS if o.number == 15).requirements,
                              "R-BAND-1", "R-BAND-2", "R-BAND-5"),
                evidence={"acquires": checked}), _feedback_row(), _predicate_row()]


def _predicate_row() -> Row:
    """Obligation 0: each named predicate is false on an exhibit of its violation."""
    from . import predicate_table
    from .mutants import by_name

    start = time.perf_counter()
    checked, problems = predicate_table.check_exhibits()
    with by_name("leases_match_loads_vacuous").applied():
        _, found = predicate_table.check_exhibits()
    return Row(0, "predicate exhibits", "12 predicates of affinity_conformance.invariants",
               not problems, time.perf_counter() - start,
               (MutantVerdict("leases_match_loads_vacuous",
                              describe("leases_match_loads_vacuous"), bool(found),
                              found[0] if found else "every exhibit judged as SPEC says"),),
               "; ".join(problems) if problems else
               f"{checked} exhibits: each predicate false on its violation, true on real steps",
               requirements=("R-ST-2", "R-LEASE-5", "R-OUT-2", "R-CNT-1", "R-CONS-2"),
               evidence={"exhibits": checked})


def _feedback_row() -> Row:
    """Obligation 0: ``draw_for``, the inverse of ``allowed`` every refinement checker
    feeds a choice through, makes the reference pick each allowed server (R-REL-2)."""
    from . import refinement_table
    from .mutants import by_name

    start = time.perf_counter()
    checked, failures = refinement_table.check_feedback()
    with by_name("draw_for_next_tie").applied():
        _, found = refinement_table.check_feedback()
    return Row(0, "draw_for feedback table", "the decision table's configs, N<=3 loads<=3 "
               "and N=33..65, draw ties", not failures, time.perf_counter() - start,
               (MutantVerdict("draw_for_next_tie", describe("draw_for_next_tie"), bool(found),
                              found[0] if found else "every choice fed back"),),
               "; ".join(failures) if failures else
               f"{checked} acquires: each allowed server fed back is the reference's choice",
               requirements=("R-REL-1", "R-REL-2"), evidence={"acquires": checked})


def config_job() -> list[Row]:
    """Obligation 19: the exhaustive edge-value table of R-CFG-*; obligation 18: SPEC's
    worked examples of the deterministic index. Each with its control, in-process."""
    from . import config_table
    from .mutants import by_name

    start = time.perf_counter()
    cases, problems = config_table.check_table()
    controls = []
    for name in ("cache_size_zero_accepted", "band_tokens_zero_accepted"):
        with by_name(name).applied():
            _, mutant_problems = config_table.check_table()
        controls.append(MutantVerdict(name, describe(name), bool(mutant_problems),
                                      "; ".join(mutant_problems[:2]) or
                                      "every case as SPEC says"))
    table = Row(19, "exhaustive edge-value table",
                f"{cases} cases, {config_table.OPTIONS} options + servers",
                not problems, time.perf_counter() - start, tuple(controls),
                "; ".join(problems) if problems else
                f"{cases} cases: accepted values stored as SPEC converts them, refused ones "
                "raise ConfigError naming the option and the value",
                evidence={"cases": cases})
    start = time.perf_counter()
    examples = config_table.check_examples()
    with by_name("stable_mode_demands_hash").applied():
        mutant_examples = config_table.check_examples()
    worked = Row(18, "SPEC worked examples", "R-DET-2, R-DET-3, R-HASH-1 examples",
                 not examples, time.perf_counter() - start,
                 (MutantVerdict("stable_mode_demands_hash", describe("stable_mode_demands_hash"),
                                bool(mutant_examples), "; ".join(mutant_examples[:1]) or
                                "every example as SPEC says"),),
                 "; ".join(examples) if examples else
                 "stable_hash test values; P[h mod n] with h = -1 and a huge negative h; "
                 "sorted(P)[crc32 mod n] on unsorted pools, with and without request_hash")
    return [table, worked, *input_rows()]


def input_rows() -> list[Row]:
    """Obligation 19 beyond the configuration: the event edge-value table (R-EV-2), the
    encoding's round trip (R-CODEC-1), the derived flags and the defaults, each with its
    control."""
    from . import input_table
    from .mutants import by_name

    rows = []
    for method, check, control, scope, reqs, held in (
            ("event edge-value table", input_table.check_events, "tie_draw_negative_accepted",
             "every field of the 6 events", ("R-EV-1", "R-EV-2"),
             "accepted values stored as given, refused ones raise EventError naming the "
             "field and the value"),
            ("encoding round trip", input_table.check_codec, "request_hash_zero_not_encoded",
             "events, configurations, traced states", ("R-CODEC-1", "R-CFG-6", "R-OBS-2"),
             "decode(encode(x)) == x through canonical text; defaults omitted, nothing else"),
            ("derived configuration flags", input_table.check_derived,
             "context_band_under_determinism", "policy, context_band, evaluates_pins",
             ("R-POL-1", "R-BAND-5", "R-DET-4"), "every flag as SPEC's words define it"),
            ("unread acquire inputs", input_table.check_unread_inputs,
             "needs_draw_forgets_hashed_unkeyed",
             "configs x keyed/unkeyed x 3 states, reference and engine",
             ("R-TIE-5", "R-DET-5"),
             "where needs_draw / needs_request_hash say no, every value gives one transition"),
            ("configuration defaults", input_table.check_defaults, "cache_default_shifted",
             "SPEC section 2's Default column, the gate's rel, config {}",
             ("R-CFG-1", "R-CFG-5", "R-CODEC-1"),
             "every option defaults as SPEC's table says")):
        start = time.perf_counter()
        checked, problems = check()
        with by_name(control).applied():
            _, found = check()
        rows.append(Row(19, method, f"{checked} values: {scope}", not problems,
                        time.perf_counter() - start,
                        (MutantVerdict(control, describe(control), bool(found),
                                       "; ".join(found[:1]) or "every value as SPEC says"),),
                        "; ".join(problems) if problems else f"{checked} values: {held}",
                        requirements=reqs, evidence={"values": checked}))
    return rows
