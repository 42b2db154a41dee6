"""Output: the paired table (rich), the JSON record and the PNG figure.

Theory of operation
-------------------
Everything here is a pure rendering of :class:`~affinity_sim.stats.PolicySummary` rows
and raw :class:`~affinity_sim.simulate.StepResult` rows; no number is computed twice.

* :func:`render_tables` prints one table per workload (every policy against the
  baseline) and, when the sweep carries the PR's reference numbers, a side-by-side of
  the PR's table and the simulation's legacy hit rate and margin-2 result.
* :func:`write_json` records the whole run: sweep, workloads, policies, summaries and
  every per-seed result, so any figure can be recomputed.
* :func:`write_png` draws the median step-time change per policy and workload with the
  order-statistic 95% interval as error bars, and the PR's margin-2 results as stars.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .simulate import StepResult
from .stats import PolicySummary
from .sweep import Sweep

__all__ = ["FIGURE_SUFFIXES", "render_tables", "run_record", "write_json", "write_png"]

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")  # what write_png's matplotlib call can write


def _pct(value: float, signed: bool = True) -> str:
    return f"{value * 100:+.1f}%" if signed else f"{value * 100:.1f}%"


def _p(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.1e}" if value < 1e-3 else f"{value:.3f}"


def render_tables(console: Console, sweep: Sweep, summaries: Sequence[PolicySummary]) -> None:
    for workload in sweep.workloads:
        rows = [s for s in summaries if s.workload == workload.name]
        if not rows:
            continue
        title = f"{workload.name}: {workload.description}" if workload.description else \
            workload.name
        table = Table(title=title, title_justify="left")
        for header in ("policy", "Δ step (median)", "95% CI", "Wilcoxon p", "faster",
                       "hit rate", "breaks/step", "idle", "queue skew", "preempt/step"):
            table.add_column(header, justify="left" if header == "policy" else "right")
        for s in rows:
            table.add_row(
                s.policy,
                "baseline" if s.p_value is None else _pct(s.median_change),
                "" if s.p_value is None else f"[{_pct(s.ci_low)}, {_pct(s.ci_high)}]",
                _p(s.p_value),
                "" if s.p_value is None else f"{s.faster_steps}/{s.seeds}",
                _pct(s.prefix_hit_rate, signed=False),
                f"{s.breaks_per_step:.1f}",
                _pct(s.idle_fraction, signed=False),
                f"{s.queue_skew:.2f}",
                f"{s.preemptions_per_step:.0f}",
            )
        console.print(table)
        base = next(s for s in rows if s.p_value is None)
        console.print(f"  baseline median step time {base.median_step_time_s:.1f} s over "
                      f"{base.seeds} seeds")
    if sweep.reference:
        console.print(_comparison(sweep, summaries))


def _comparison(sweep: Sweep, summaries: Sequence[PolicySummary]) -> Table:
    by_key = {(s.workload, s.policy): s for s in summaries}
    table = Table(title="PR #7435's table next to the simulation", title_justify="left")
    for header in ("workload", "PR context", "PR baseline hit", "sim baseline hit",
                   "PR margin 2", "sim margin 2 [95% CI]", "sim − PR", "sim p",
                   "sim #6533 abs 4 / 8 / 64"):
        table.add_column(header, justify="left" if header == "workload" else "right")
    for workload in sweep.workloads:
        ref = sweep.reference_for(workload.name)
        base = by_key.get((workload.name, "legacy"))
        margin = by_key.get((workload.name, "margin-2"))
        gates = [by_key.get((workload.name, f"dual-{a}")) for a in (4, 8, 64)]
        table.add_row(
            workload.name,
            str(ref.get("context", "")),
            _pct(ref["hit_rate"], signed=False) if "hit_rate" in ref else "",
            _pct(base.prefix_hit_rate, signed=False) if base else "",
            _pct(ref["change"]) if "change" in ref else "",
            f"{_pct(margin.median_change)} [{_pct(margin.ci_low)}, {_pct(margin.ci_high)}]"
            if margin and margin.p_value is not None else "",
            f"{(margin.median_change - ref['change']) * 100:+.1f} pt"
            if margin and "change" in ref else "",
            _p(margin.p_value) if margin else "",
            " / ".join(_pct(g.median_change) if g else "—" for g in gates),
        )
    return table


def run_record(sweep: Sweep, summaries: Sequence[PolicySummary], results: Sequence[StepResult],
               meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "sweep": sweep.name,
        "description": sweep.description,
        "seeds": sweep.seed_list(),
        **meta,
        "reference": {w.name: sweep.reference_for(w.name) for w in sweep.workloads
                      if sweep.reference_for(w.name)},
        "workloads": [w.describe() for w in sweep.workloads],
        "policies": [p.describe() for p in sweep.policies],
        "summary": [s.as_dict() for s in summaries],
        "results": [r.as_dict() for r in results],
    }


def _rounded(value: Any) -> Any:
    """Floats to 7 significant digits: far below the seed-to-seed noise, half the bytes."""
    if isinstance(value, float):
        return float(f"{value:.7g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def write_json(path: str | Path, record: dict[str, Any]) -> None:
    """The record with one result or summary row per line (diffable, compact)."""
    rounded = _rounded(record)
    lines = ["{"]
    items = list(rounded.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if isinstance(value, list) and value and isinstance(value[0], dict):
            rows = ",\n  ".join(json.dumps(row, separators=(",", ":")) for row in value)
            lines.append(f" {json.dumps(key)}: [\n  {rows}\n ]{comma}")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}{comma}")
    lines.append("}")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_png(path: str | Path, sweep: Sweep, summaries: Sequence[PolicySummary]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = [p.name for p in sweep.policies if p.name != "legacy"]
    workloads = [w.name for w in sweep.workloads]
    by_key = {(s.workload, s.policy): s for s in summaries}
    fig, ax = plt.subplots(figsize=(10, 4.6), dpi=100)
    width = 0.8 / max(1, len(workloads))
    for i, workload in enumerate(workloads):
        xs: list[float] = []
        ys: list[float] = []
        low: list[float] = []
        high: list[float] = []
        for j, policy in enumerate(policies):
            s = by_key.get((workload, policy))
            if s is None:
                continue
            xs.append(j - 0.4 + width * (i + 0.5))
            ys.append(s.median_change * 100)
            low.append((s.median_change - s.ci_low) * 100)
            high.append((s.ci_high - s.median_change) * 100)
        bars = ax.errorbar(xs, ys, yerr=[low, high], fmt="o", capsize=3, label=workload)
        ref = sweep.reference_for(workload)
        if "change" in ref and "margin-2" in policies:
            j = policies.index("margin-2")
            ax.plot([j - 0.4 + width * (i + 0.5)], [ref["change"] * 100], marker="*",
                    markersize=11, color=bars.lines[0].get_color(), markeredgecolor="black",
                    linestyle="none")
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(policies)))
    ax.set_xticklabels(policies, rotation=20)
    ax.set_ylabel("step time vs legacy (paired median, %)")
    title = f"{sweep.name}: median change with 95% order-statistic CI over {sweep.seeds} seeds"
    if sweep.reference:
        title += "  (★ = PR #7435 reported, margin 2)"
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="best")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
