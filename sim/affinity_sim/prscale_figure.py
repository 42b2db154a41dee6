"""The PR-scale sensitivity runs in one figure, rendered from the recorded JSON.

Theory of operation
-------------------
The four registered sensitivity runs each move one input of ``pr7435-scale`` over a grid
(output log-sigma, turn-count ratio, prompts per step, ``gpu_memory_utilization``) and
record legacy and margin 2 on the PR's rows. This module draws one panel per input:
margin 2's paired median change with its 95% interval against the input's value, one
line per row, the prediction's own record at the preset's value, and each row's PR
result as a dashed line of the same colour. A hollow marker is the value whose legacy
hit rate is nearest the PR's (the ‡ of the tables). When the replication's record
(``pr7435-scale-replication.json``) sits beside them, a star with its interval marks each
replicated cell's 100-seed median at the same value. No simulation runs here::

    python -m affinity_sim.prscale_figure sim/pr7435-scale.json sim/pr7435-scale-sensitivity.png
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

from affinity_cli.paths import file_problem

from .prscale_report import ROWS
from .records import RecordError, load

__all__ = ["PANELS", "REPLICATION", "panel_points", "plot", "replication_points"]

REPLICATION = "pr7435-scale-replication"  # drawn as stars on the panels of its cells

# (record stem, workload-name parameter, the preset's value, axis label, log x axis)
PANELS = (
    ("pr7435-scale-dispersion", "sigma", 0.8, "output log-σ", False),
    ("pr7435-scale-turns", "q", 1.0, "turn-count ratio q (P(k) ∝ q^(k−1))", True),
    ("pr7435-scale-step-size", "prompts", 512.0, "prompts per step (x 16 samples)", True),
    ("pr7435-scale-pool", "util", 0.5, "gpu_memory_utilization", False),
)
_COLOURS = dict(zip(ROWS, ("tab:blue", "tab:orange", "tab:green", "tab:red"), strict=True))


def _step(record: dict[str, Any], name: str) -> tuple[dict[str, Any], float] | None:
    summary = next((s for s in record["summary"]
                    if s["workload"] == name and s["policy"] == "margin-2"), None)
    if summary is None:
        return None
    hits = [r["prefix_hit_rate"] for r in record["results"]
            if r["workload"] == name and r["policy"] == "legacy"]
    return summary, statistics.fmean(hits)


def panel_points(scale: dict[str, Any], variant: dict[str, Any], parameter: str,
                 base: float, row: str) -> list[tuple[float, float, float, float, bool]]:
    """``(value, median %, low %, high %, nearest the PR's hit rate)`` for one row,
    sorted by value; the preset's value comes from ``scale``."""
    found = []
    values = {float(w["name"].rpartition(f"/{parameter}-")[2]) for w in variant["workloads"]}
    for value in sorted(values | {base}):
        step = (_step(scale, row) if value == base
                else _step(variant, f"{row}/{parameter}-{value:g}"))
        if step is not None:
            found.append((value, *step))
    target = scale["reference"][row]["hit_rate"]
    nearest = min(found, key=lambda f: abs(f[2] - target))[0] if found else None
    return [(value, s["median_change"] * 100, s["ci_low"] * 100, s["ci_high"] * 100,
             value == nearest) for value, s, _ in found]


def replication_points(replication: dict[str, Any], parameter: str,
                       row: str) -> list[tuple[float, float, float, float]]:
    """``(value, median %, low %, high %)`` of the replicated cells ``row/parameter-value``."""
    points = []
    for summary in replication["summary"]:
        name, _, value = str(summary["workload"]).partition(f"/{parameter}-")
        if name == row and value and summary["policy"] == "margin-2":
            points.append((float(value), summary["median_change"] * 100,
                           summary["ci_low"] * 100, summary["ci_high"] * 100))
    return sorted(points)


def plot(scale: dict[str, Any], variants: dict[str, dict[str, Any]], path: str | Path) -> None:
    """One panel per entry of :data:`PANELS` whose record is in ``variants``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    panels = [p for p in PANELS if p[0] in variants]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.9), dpi=100,
                             sharey=True, squeeze=False)
    for ax, (stem, parameter, base, label, log_x) in zip(axes[0], panels, strict=True):
        for row in ROWS:
            points = panel_points(scale, variants[stem], parameter, base, row)
            if not points:
                continue
            xs = [p[0] for p in points]
            ys = [p[1] for p in points]
            colour = _COLOURS[row]
            ax.errorbar(xs, ys, yerr=[[y - p[2] for y, p in zip(ys, points, strict=True)],
                                      [p[3] - y for y, p in zip(ys, points, strict=True)]],
                        color=colour, marker="o", markersize=4, capsize=2, linewidth=1,
                        label=row)
            for x, y, *_, nearest in points:
                if nearest:
                    ax.plot(x, y, marker="o", markersize=10, markerfacecolor="none",
                            markeredgecolor=colour)
            for x, y, low, high in (replication_points(variants[REPLICATION], parameter, row)
                                    if REPLICATION in variants else []):
                ax.errorbar([x], [y], yerr=[[y - low], [high - y]], color=colour, marker="*",
                            markersize=11, capsize=3, linewidth=1.5, linestyle="none")
            ax.axhline(scale["reference"][row]["change"] * 100, color=colour,
                       linestyle="--", linewidth=0.8)
        ax.axvline(base, color="grey", linestyle=":", linewidth=0.8)
        ax.axhline(0, color="grey", linewidth=0.6)
        if log_x:
            ax.set_xscale("log")
        # Ticks at the grid's own values only (log axes would label their minor ticks).
        ticks = sorted({float(w["name"].rpartition(f"/{parameter}-")[2])
                        for w in variants[stem]["workloads"]} | {base})
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks], fontsize=7)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(label, fontsize=8)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("margin 2 vs legacy, paired median step time (%)", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("pr7435-scale sensitivity runs: margin 2 with 95% CI per row; dashed: the "
                 "PR's result; dotted: the prediction's value; ring: hit rate nearest the "
                 "PR's; star: that cell on 100 fresh seeds", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].endswith(".png"):
        print("usage: python -m affinity_sim.prscale_figure SCALE.json OUT.png "
              "(the sensitivity records are read from SCALE.json's folder)", file=sys.stderr)
        return 2
    scale_path = Path(argv[0])
    why = file_problem(Path(argv[1]))
    try:
        if why is not None:
            raise RecordError(f"OUT.png: {why}")
        scale = load(scale_path)
        variants = {}
        for stem in (*(panel[0] for panel in PANELS), REPLICATION):
            path = scale_path.with_name(f"{stem}.json")
            if path.exists():
                variants[stem] = load(path)
    except RecordError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    plot(scale, variants, argv[1])
    panels = sum(stem in variants for stem, *_ in PANELS)
    print(f"wrote {argv[1]} ({panels} panels"
          f"{', the replication starred' if REPLICATION in variants else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
