"""sim/studies/README.md's PR-scale tables, rendered from the recorded run JSON (no simulation).

Theory of operation
-------------------
``affinity simulate --preset pr7435-scale --json A`` and ``--preset pr7435-scale-ablation
--json B`` record every per-seed :class:`~affinity_sim.simulate.StepResult` and the
paired summaries. This module only reads them back and prints the Markdown tables of the
README (``python -m affinity_sim.prscale_report A [B] ... [G]``), so every number there
can be regenerated from the JSON files and checked. ``C``, the ``--preset
pr7435-scale-context-per-request`` record (:mod:`affinity_sim.prscale_context`), renders
as the sensitivity table: its "mean prompt per request" is the legacy runs'
``query_tokens / turns``, each admitted request's prompt counted once, as vLLM's
``request_prompt_tokens`` histogram counts it. ``D``, the ``--preset
pr7435-scale-dispersion`` record (:mod:`affinity_sim.prscale_dispersion`), renders as the
dispersion table, with ``A``'s rows as its log-sigma 0.8 line, and ``E``, the
``--preset pr7435-scale-step-size`` record (:mod:`affinity_sim.prscale_stepsize`), as the
step-size table, with ``A``'s rows as its 512-prompt line (``F``, ``--preset
pr7435-scale-turns``, and ``G``, ``--preset pr7435-scale-pool``, likewise with their
q 1 and utilization 0.5 lines). ``H``, ``--preset pr7435-scale-replication``, renders each
replicated cell beside its 10-seed result, so it needs the step-size and pool records
among the files too. Rates are means over seeds
of the per-step values; changes, intervals and p-values are the summaries' (paired
median, order-statistic 95% interval, Wilcoxon). "Within ±3 pt" compares the median
change with the PR's, at the 0.1 point shown.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

from .records import RecordError, load

__all__ = ["ablation_table", "dispersion_table", "grid_table", "policies_table",
           "pool_table", "prediction_table", "replication_table", "sensitivity_table",
           "step_size_table", "turns_table"]

ROWS = ("ctx2k", "ctx9k", "ctx20k", "ctx9k-bigkv")


def _pct(value: float, signed: bool = True) -> str:
    return f"{value * 100:+.1f}%" if signed else f"{value * 100:.1f}%"


def _mean(record: dict[str, Any], workload: str, policy: str, key: str) -> float:
    values = [r[key] for r in record["results"]
              if r["workload"] == workload and r["policy"] == policy]
    return statistics.fmean(values)


def _summary(record: dict[str, Any], workload: str, policy: str) -> dict[str, Any]:
    return next(s for s in record["summary"]
                if s["workload"] == workload and s["policy"] == policy)


def prediction_table(record: dict[str, Any]) -> str:
    """Baseline hit rates and margin 2's change per row, next to the PR's."""
    lines = ["| workload | PR context | PR baseline hit | **predicted baseline hit** (vLLM "
             "0.24 metric) | same runs, counted at admission | PR margin 2 | **predicted "
             "margin 2** [95% CI] | predicted − PR | p | within ±3 pt |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in ROWS:
        ref = record["reference"][row]
        m2 = _summary(record, row, "margin-2")
        diff = (m2["median_change"] - ref["change"]) * 100
        p = m2["p_value"]
        lines.append(
            f"| {row} | {ref['context']} | {_pct(ref['hit_rate'], False)} | "
            f"**{_pct(_mean(record, row, 'legacy', 'prefix_hit_rate'), False)}** | "
            f"{_pct(_mean(record, row, 'legacy', 'admission_hit_rate'), False)} | "
            f"{_pct(ref['change'])} ({ref['steps']}) | **{_pct(m2['median_change'])}** "
            f"[{_pct(m2['ci_low'])}, {_pct(m2['ci_high'])}] | {diff:+.1f} pt | "
            f"{'—' if p is None else f'{p:.1e}'} | {'yes' if abs(round(diff, 1)) <= 3 else 'no'} |")
    return "\n".join(lines)


def policies_table(record: dict[str, Any]) -> str:
    """Every policy: median change · hit rate · breaks per step · idle (legacy: step time)."""
    policies = [p["name"] for p in record["policies"]]
    lines = [f"| policy ({_seeds(record)}) | " + " | ".join(ROWS) + " |",
             "|---|" + "---|" * len(ROWS)]
    for policy in policies:
        cells = []
        for row in ROWS:
            s = _summary(record, row, policy)
            head = (f"{s['median_step_time_s']:.0f} s" if s["p_value"] is None and
                    policy == "legacy" else f"{_pct(s['median_change'])} "
                    f"[{_pct(s['ci_low'])}, {_pct(s['ci_high'])}]")
            cells.append(f"{head} · {_pct(s['prefix_hit_rate'], False)} · "
                         f"{s['breaks_per_step']:.0f} · {_pct(s['idle_fraction'], False)}")
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ablation_table(record: dict[str, Any]) -> str:
    """Per feature removed: legacy hit · margin 2's median change · legacy idle."""
    names = [w["name"] for w in record["workloads"]]
    removed = {n.partition("/")[2] for n in names} - {""}
    order = {f: min(i for i, n in enumerate(names) if n.endswith("/" + f)) for f in removed}
    features = ["none", *sorted(removed, key=order.__getitem__)]
    lines = [f"| feature removed ({_seeds(record)}) | " + " | ".join(ROWS) + " |",
             "|---|" + "---|" * len(ROWS)]
    for feature in features:
        cells = []
        for row in ROWS:
            name = row if feature == "none" else f"{row}/{feature}"
            if name not in names:
                cells.append("(same as the row)")
                continue
            m2 = _summary(record, name, "margin-2")
            cells.append(
                f"hit {_pct(_mean(record, name, 'legacy', 'prefix_hit_rate'), False)} · m2 "
                f"{_pct(m2['median_change'])} · idle "
                f"{_pct(_mean(record, name, 'legacy', 'idle_fraction'), False)}")
        lines.append(f"| {feature} | " + " | ".join(cells) + " |")
    # The metric is not a run feature: the same runs, counted at admission only.
    cells = [f"hit {_pct(_mean(record, row, 'legacy', 'admission_hit_rate'), False)} · "
             "(same runs)" for row in ROWS]
    lines.append("| vLLM 0.24 hit metric (counted at admission instead) | "
                 + " | ".join(cells) + " |")
    return "\n".join(lines)


def _request_prompt(record: dict[str, Any], workload: str) -> float:
    """Mean prompt tokens per admitted request of the legacy runs (vLLM's
    ``request_prompt_tokens`` mean): ``query_tokens`` counts each admission's prompt once."""
    runs = [r for r in record["results"] if r["workload"] == workload and r["policy"] == "legacy"]
    tokens: int = sum(r["query_tokens"] for r in runs)
    turns: int = sum(r["turns"] for r in runs)
    return tokens / turns


def sensitivity_table(scale: dict[str, Any], variant: dict[str, Any]) -> str:
    """The per-request context reading next to the prediction and the PR, per row."""
    medians = {w["name"]: w["output_tokens"]["median"] for w in variant["workloads"]}
    lines = ["| workload | PR context | prediction: output median · mean prompt per request"
             " | **per-request reading**: output median · mean prompt per request | baseline "
             "hit (vLLM 0.24 metric) · at admission | PR margin 2 | prediction's margin 2 | "
             "**per-request margin 2** [95% CI] | − PR | p | within ±3 pt |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in ROWS:
        ref = variant["reference"][row]
        m2 = _summary(variant, row, "margin-2")
        diff = (m2["median_change"] - ref["change"]) * 100
        p = m2["p_value"]
        base = next(w for w in scale["workloads"] if w["name"] == row)
        lines.append(
            f"| {row} | {ref['context']} | {base['output_tokens']['median']:,.0f} · "
            f"{_request_prompt(scale, row):,.0f} | {medians[row]:,.0f} · "
            f"**{_request_prompt(variant, row):,.0f}** | "
            f"{_pct(_mean(variant, row, 'legacy', 'prefix_hit_rate'), False)} · "
            f"{_pct(_mean(variant, row, 'legacy', 'admission_hit_rate'), False)} | "
            f"{_pct(ref['change'])} ({ref['steps']}) | "
            f"{_pct(_summary(scale, row, 'margin-2')['median_change'])} | "
            f"**{_pct(m2['median_change'])}** [{_pct(m2['ci_low'])}, {_pct(m2['ci_high'])}] | "
            f"{diff:+.1f} pt | {'—' if p is None else f'{p:.1e}'} | "
            f"{'yes' if abs(round(diff, 1)) <= 3 else 'no'} |")
    return "\n".join(lines)


def _value(name: str, parameter: str) -> float:
    return float(name.rpartition(f"/{parameter}-")[2])


def grid_table(scale: dict[str, Any], variant: dict[str, Any], parameter: str,
               base: float, label: str) -> str:
    """Per value of one input: legacy hit (at admission) · margin 2's change [95% CI] ·
    legacy idle, per row; then how many rows have the PR's sign and are within ±3 points.

    ``variant``'s workloads are named ``row/<parameter>-<value>``; the ``base`` line is
    the prediction's own record (``scale``), which also carries the PR's numbers. A row
    the variant did not run shows "(not run)" and is not counted. Per row, ‡ marks the
    value whose legacy hit rate (vLLM 0.24 metric) is nearest the PR's baseline."""
    ran = {w["name"] for w in variant["workloads"]}
    values = sorted({_value(name, parameter) for name in ran} | {base})

    def source(value: float, row: str) -> tuple[dict[str, Any], str] | None:
        if value == base:
            return scale, row
        name = f"{row}/{parameter}-{value:g}"
        return (variant, name) if name in ran else None

    def hit_gap(value: float, row: str) -> float:
        found = source(value, row)
        if found is None:
            return float("inf")
        target: float = scale["reference"][row]["hit_rate"]
        return abs(_mean(*found, "legacy", "prefix_hit_rate") - target)

    nearest = {row: min(values, key=lambda v: hit_gap(v, row)) for row in ROWS}
    lines = [f"| {label} ({_seeds(variant)}) | " + " | ".join(ROWS)
             + " | PR's sign · within ±3 pt |", "|---|" + "---|" * (len(ROWS) + 1)]
    for value in values:
        cells, sign, within, counted = [], 0, 0, 0
        for row in ROWS:
            found = source(value, row)
            if found is None:
                cells.append("(not run)")
                continue
            record, name = found
            m2 = _summary(record, name, "margin-2")
            ref = scale["reference"][row]["change"]
            counted += 1
            sign += (m2["median_change"] < 0) == (ref < 0)
            within += abs(round((m2["median_change"] - ref) * 100, 1)) <= 3
            cells.append(
                f"{'‡ ' if nearest[row] == value else ''}hit "
                f"{_pct(_mean(record, name, 'legacy', 'prefix_hit_rate'), False)} "
                f"({_pct(_mean(record, name, 'legacy', 'admission_hit_rate'), False)}) · m2 "
                f"{_pct(m2['median_change'])} [{_pct(m2['ci_low'])}, {_pct(m2['ci_high'])}]"
                f" · idle {_pct(_mean(record, name, 'legacy', 'idle_fraction'), False)}")
        shown = f"{value:g} (the prediction)" if value == base else f"{value:g}"
        lines.append(f"| {shown} | " + " | ".join(cells)
                     + f" | {sign} of {counted} · {within} of {counted} |")
    pr = [f"hit {_pct(scale['reference'][row]['hit_rate'], False)} · m2 "
          f"{_pct(scale['reference'][row]['change'])}" for row in ROWS]
    lines.append("| PR #7435 | " + " | ".join(pr) + " | |")
    return "\n".join(lines)


def dispersion_table(scale: dict[str, Any], variant: dict[str, Any]) -> str:
    """The output-dispersion sensitivity: one line per total log-sigma (0.8: the preset)."""
    return grid_table(scale, variant, "sigma", 0.8, "output log-σ")


def turns_table(scale: dict[str, Any], variant: dict[str, Any]) -> str:
    """The turn-count sensitivity: one line per ratio q of P(k) ~ q^(k-1) (1: uniform)."""
    return grid_table(scale, variant, "q", 1.0, "turn-count ratio q")


def pool_table(scale: dict[str, Any], variant: dict[str, Any]) -> str:
    """The KV-pool sensitivity: one line per gpu_memory_utilization (0.5: the preset)."""
    return grid_table(scale, variant, "util", 0.5, "gpu_memory_utilization")


def step_size_table(scale: dict[str, Any], variant: dict[str, Any]) -> str:
    """The step-size sensitivity: one line per prompts per step (512: the preset)."""
    return grid_table(scale, variant, "prompts", 512, "prompts per step")


def replication_table(scale: dict[str, Any], replication: dict[str, Any],
                      originals: dict[str, dict[str, Any]]) -> str:
    """Each replicated cell: the PR's row, its 10-seed run, its 100-seed replication."""
    from .prscale_replication import CELLS, REPORTED_APART

    first, last = min(replication["seeds"]), max(replication["seeds"])
    lines = ["| cell (the ‡ of) | PR: hit · margin 2 | 10 seeds (0–9): hit · m2 [95% CI] | "
             f"{len(replication['seeds'])} seeds ({first}–{last}): hit · m2 [95% CI] · p | "
             "replication − PR | explanation holds |",
             "|---|---|---|---|---|---|"]
    for (cell, run), decides in [*((c, True) for c in CELLS),
                                 *((c, False) for c in REPORTED_APART)]:
        ref = scale["reference"][cell.partition("/")[0]]
        cells = []
        for record in (originals[run], replication):
            m2 = _summary(record, cell, "margin-2")
            cells.append(f"hit {_pct(_mean(record, cell, 'legacy', 'prefix_hit_rate'), False)}"
                         f" · {_pct(m2['median_change'])} [{_pct(m2['ci_low'])}, "
                         f"{_pct(m2['ci_high'])}]")
        m2 = _summary(replication, cell, "margin-2")
        diff = (m2["median_change"] - ref["change"]) * 100
        holds = (abs(round(diff, 1)) <= 3
                 and (m2["median_change"] < 0) == (ref["change"] < 0))
        verdict = ("yes" if holds else "no") if decides else "(reported apart)"
        lines.append(f"| {cell} ({run.removeprefix('pr7435-scale-')}) | hit "
                     f"{_pct(ref['hit_rate'], False)} · {_pct(ref['change'])} | {cells[0]} | "
                     f"{cells[1]} · {m2['p_value']:.1e} | {diff:+.1f} pt | {verdict} |")
    return "\n".join(lines)


def _load(path: str) -> dict[str, Any]:
    return load(path)  # a RecordError naming the file if it is not a run record


def _seeds(record: dict[str, Any]) -> str:
    seeds = record["seeds"]
    return f"{len(seeds)} seeds" if isinstance(seeds, list) else f"{seeds} seeds"


def main(paths: list[str]) -> int:
    try:
        records = [_load(path) for path in paths]  # every file checked before any output
    except RecordError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    scale = records[0]
    print(prediction_table(scale), end="\n\n")
    print(policies_table(scale), end="\n\n")
    tables = {"pr7435-scale-context-per-request": sensitivity_table,
              "pr7435-scale-dispersion": dispersion_table,
              "pr7435-scale-step-size": step_size_table,
              "pr7435-scale-turns": turns_table,
              "pr7435-scale-pool": pool_table}
    by_sweep = {str(record.get("sweep")): record for record in records}
    for record in records[1:]:
        sweep = str(record.get("sweep"))
        if sweep == "pr7435-scale-replication":
            needed = [n for n in ("pr7435-scale-step-size", "pr7435-scale-pool")
                      if n not in by_sweep]
            if needed:
                print(f"error: the replication table needs the {' and '.join(needed)} "
                      "record(s) among the files", file=sys.stderr)
                return 2
            print(replication_table(scale, record, by_sweep), end="\n\n")
            continue
        table = tables.get(sweep)
        print(table(scale, record) if table else ablation_table(record), end="\n\n")
    return 0


_USAGE = ("usage: python -m affinity_sim.prscale_report SCALE.json [ABLATION.json] "
          "[CONTEXT-PER-REQUEST.json] [DISPERSION.json] [STEP-SIZE.json] [TURNS.json] [POOL.json] "
          "[REPLICATION.json]")

if __name__ == "__main__":
    if not 1 <= len(sys.argv) - 1 <= 8:
        sys.exit(_USAGE)
    sys.exit(main(sys.argv[1:]))
