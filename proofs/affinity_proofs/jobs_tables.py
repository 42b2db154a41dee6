"""The table jobs of ``affinity verify``: the decision table (15), the configuration table
(19) and SPEC's worked examples (18).

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

__all__ = ["config_job", "decision_table_job"]


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
                evidence={"acquires": checked})]


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
    return [table, worked]
