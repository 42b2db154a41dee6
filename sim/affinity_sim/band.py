"""The context band's evidence: the a-priori cost numbers and the head-to-head table.

Theory of operation
-------------------
The context band (SPEC section 7.5) keeps a pin while ``load[pinned] <= min + band`` with
``band = min(m + c // T, cap)``. This module holds the two halves of the evidence that
one fixed (m, T, cap) is good on short and long conversations.

*Before any policy is run* (:func:`operating_points`): the cost model prices the two
sides of a keep-or-break decision on a saturated replica.

* A break re-prefills the turn's ``c`` prompt tokens on the new replica
  (:func:`reprefill_s`): vLLM does it in chunks of ``max_num_batched_tokens``, each an
  iteration costing ``a + b * chunk + d * pairs`` (the same terms the simulator charges).
* One more request of load on the pinned replica costs the turn the wait for one more
  slot (:func:`slot_wait_s`): a saturated replica runs ``B = min(max_num_seqs, pool //
  context)`` sequences, one iteration takes ``a + b * B + c_kv * B * context``, a turn
  of ``o`` output tokens lasts ``o`` iterations, so a slot opens every ``o * t / B``.
* :func:`break_even_tokens` is the context whose re-prefill costs that wait, i.e. the
  ``T`` at which one request of band buys one re-prefill. It is computed from each
  workload's *drawn trajectories* (mean turn prompt, mean output; no simulation), so it
  shows the range an a-priori T has to cover; it is a cross-check, not a fit.

*After the sweep* (:func:`head_to_head`): from the per-seed results of a run record
(``affinity simulate --json``), the band against another policy, paired by seed: the
per-seed difference of the two changes against legacy, ``(t_band - t_other) /
t_legacy`` in points, its median with the order-statistic 95% interval, and the
Wilcoxon p of the two step-time samples. "Best fixed margin" is the margin policy with
the lowest median change on that workload, named in the table.

``python -m affinity_sim.band RECORD.json [MORE.json ...] --band NAME [--seeds A-B]
[--png PATH]`` (several records are merged by seed, :mod:`affinity_sim.records`) prints the
per-policy table, the head-to-head table and every policy's gap to the best fixed
margin (:func:`regret_table`) as Markdown (for sim/studies/README.md) and draws one
panel per workload.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from affinity_cli.paths import file_problem

from .costmodel import ReplicaModel
from .records import RecordError, load, merge_records, parse_seed_ranges, select_seeds
from .report import FIGURE_SUFFIXES
from .stats import median_ci, wilcoxon_p
from .workload import Workload, plan_step

__all__ = [
    "HeadToHead",
    "OperatingPoint",
    "best_margin",
    "break_even_tokens",
    "head_to_head",
    "main",
    "markdown",
    "operating_points",
    "plot",
    "policy_table",
    "regret_table",
    "reprefill_s",
    "slot_wait_s",
]

_MARGIN = re.compile(r"margin-(\d+)")


def reprefill_s(model: ReplicaModel, tokens: int) -> float:
    """Replica time to prefill ``tokens`` uncached tokens in budget-sized chunks."""
    if tokens < 0:
        raise ValueError(f"tokens must be an integer >= 0, got {tokens!r}")
    budget = model.max_num_batched_tokens
    total = 0.0
    done = 0
    while done < tokens:
        chunk = min(budget, tokens - done)
        # Causal attention of the chunk's queries over every earlier key and themselves.
        pairs = chunk * done + chunk * (chunk + 1) / 2
        total += model.iteration_time(0, 0, chunk, pairs)
        done += chunk
    return total


def slot_wait_s(model: ReplicaModel, context: float, output: float) -> float:
    """The wait for one more slot on a replica saturated with turns of this shape."""
    if context <= 0 or output <= 0:
        raise ValueError(f"context and output must be > 0, got {context!r}, {output!r}")
    batch = max(1, min(model.max_num_seqs, int(model.kv_capacity_tokens // context)))
    iteration = model.iteration_time(batch, int(batch * context), 0, 0.0)
    return output * iteration / batch


def break_even_tokens(model: ReplicaModel, wait_s: float) -> int:
    """The smallest context whose re-prefill costs at least ``wait_s`` (bisection)."""
    if not wait_s > 0:
        raise ValueError(f"wait_s must be > 0, got {wait_s!r}")
    low, high = 0, 1
    while reprefill_s(model, high) < wait_s:
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        if reprefill_s(model, mid) < wait_s:
            low = mid
        else:
            high = mid
    return high


@attrs.frozen(kw_only=True)
class OperatingPoint:
    """A workload's mean turn shape and what the cost model says about a break there."""

    workload: str
    mean_prompt: float  # tokens of a turn's prompt (what context_tokens carries)
    mean_output: float
    batch: int  # sequences a saturated replica runs
    slot_wait_s: float
    reprefill_s: float  # re-prefill of the mean prompt
    break_even_tokens: int


def operating_points(workloads: Sequence[Workload], seeds: Sequence[int]) -> list[OperatingPoint]:
    """The cost-model cross-check of T for each workload, from drawn trajectories only."""
    points = []
    for w in workloads:
        prompts: list[int] = []
        outputs: list[int] = []
        for seed in seeds:
            for plan in plan_step(w, seed):
                context = plan.prompt_tokens
                for turn, output in enumerate(plan.outputs):
                    prompts.append(context)
                    outputs.append(output)
                    context += output + (plan.tool_tokens[turn] if turn < len(plan.tool_tokens)
                                         else 0)
        mean_prompt = statistics.fmean(prompts)
        mean_output = statistics.fmean(outputs)
        wait = slot_wait_s(w.model, mean_prompt, mean_output)
        batch = max(1, min(w.model.max_num_seqs, int(w.model.kv_capacity_tokens // mean_prompt)))
        points.append(OperatingPoint(
            workload=w.name, mean_prompt=mean_prompt, mean_output=mean_output, batch=batch,
            slot_wait_s=wait, reprefill_s=reprefill_s(w.model, round(mean_prompt)),
            break_even_tokens=break_even_tokens(w.model, wait)))
    return points


@attrs.frozen(kw_only=True)
class HeadToHead:
    """The band against one other policy on one workload, paired by seed."""

    workload: str
    band: str
    other: str
    seeds: int
    band_change: float  # median change vs legacy (fraction)
    other_change: float
    median_diff: float  # median over seeds of (t_band - t_other) / t_legacy
    ci_low: float
    ci_high: float
    p_value: float
    band_faster: int  # seeds on which the band's step was shorter


def _times(record: Mapping[str, Any]) -> dict[tuple[str, str], dict[int, float]]:
    times: dict[tuple[str, str], dict[int, float]] = {}
    for row in record["results"]:
        times.setdefault((row["workload"], row["policy"]), {})[row["seed"]] = row["step_time_s"]
    return times


def best_margin(record: Mapping[str, Any], workload: str) -> str:
    """The margin-N policy with the lowest median change vs legacy on ``workload``."""
    rows = [s for s in record["summary"]
            if s["workload"] == workload and _MARGIN.fullmatch(s["policy"])]
    if not rows:
        raise ValueError(f"no margin-N policy in the record for workload {workload!r}")
    return str(min(rows, key=lambda s: s["median_change"])["policy"])


def head_to_head(record: Mapping[str, Any], workload: str, band: str, other: str,
                 baseline: str = "legacy") -> HeadToHead:
    """``band`` against ``other`` on ``workload``, from a run record's per-seed rows."""
    times = _times(record)
    for policy in (band, other, baseline):
        if (workload, policy) not in times:
            raise ValueError(f"the record has no {policy!r} results for workload {workload!r}")
    mine, theirs, base = times[(workload, band)], times[(workload, other)], \
        times[(workload, baseline)]
    seeds = sorted(set(mine) & set(theirs) & set(base))
    diffs = [(mine[s] - theirs[s]) / base[s] for s in seeds]
    low, high = median_ci(diffs)
    return HeadToHead(
        workload=workload, band=band, other=other, seeds=len(seeds),
        band_change=statistics.median((mine[s] - base[s]) / base[s] for s in seeds),
        other_change=statistics.median((theirs[s] - base[s]) / base[s] for s in seeds),
        median_diff=statistics.median(diffs), ci_low=low, ci_high=high,
        p_value=wilcoxon_p([mine[s] for s in seeds], [theirs[s] for s in seeds]),
        band_faster=sum(1 for s in seeds if mine[s] < theirs[s]))


def _pt(value: float) -> str:
    return f"{value * 100:+.1f}"


def _p(value: float) -> str:
    return f"{value:.1e}" if value < 1e-3 else f"{value:.3f}"


def markdown(record: Mapping[str, Any], band: str) -> str:
    """The head-to-head table (band vs margin 2 and vs the best fixed margin)."""
    lines = [
        "| workload | band Δ vs legacy | margin 2 | best fixed margin | band − margin 2, pt "
        "[95% CI] · p · band faster | band − best margin, pt [95% CI] · p · band faster "
        "| within 1 pt of best |",
        "|---|---|---|---|---|---|---|",
    ]
    workloads = list(dict.fromkeys(row["workload"] for row in record["results"]))
    for w in workloads:
        best = best_margin(record, w)
        vs2 = head_to_head(record, w, band, "margin-2")
        vsb = head_to_head(record, w, band, best)
        gap = vs2.band_change - vsb.other_change
        cells = []
        for h in (vs2, vsb):
            cells.append(f"{_pt(h.median_diff)} [{_pt(h.ci_low)}, {_pt(h.ci_high)}] · "
                         f"{_p(h.p_value)} · {h.band_faster}/{h.seeds}")
        lines.append(
            f"| {w} | {_pt(vs2.band_change)}% | {_pt(vs2.other_change)}% | {best} "
            f"{_pt(vsb.other_change)}% | {cells[0]} | {cells[1]} | "
            f"{'yes' if gap <= 0.01 + 1e-12 else 'no'} ({gap * 100:+.1f} pt) |")
    return "\n".join(lines)


def policy_table(record: Mapping[str, Any]) -> str:
    """Every policy x workload: median change vs legacy [95% CI] · hit rate · breaks/step."""
    summary = record["summary"]
    workloads = list(dict.fromkeys(s["workload"] for s in summary))
    policies = list(dict.fromkeys(s["policy"] for s in summary))
    by_key = {(s["workload"], s["policy"]): s for s in summary}
    lines = ["| policy | " + " | ".join(workloads) + " |",
             "|---|" + "---|" * len(workloads)]
    for policy in policies:
        cells = []
        for w in workloads:
            s = by_key.get((w, policy))
            if s is None:
                cells.append("")
            elif s["p_value"] is None:
                cells.append(f"{s['median_step_time_s']:.0f} s · hit "
                             f"{s['prefix_hit_rate'] * 100:.1f}%")
            else:
                cells.append(f"{_pt(s['median_change'])}% [{_pt(s['ci_low'])}, "
                             f"{_pt(s['ci_high'])}] · hit {s['prefix_hit_rate'] * 100:.1f}% · "
                             f"{s['breaks_per_step']:.0f} breaks")
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def regret_table(record: Mapping[str, Any]) -> str:
    """Per policy: its median change minus the best fixed margin's, per workload, and the max.

    The worst gap over the workloads is what a user who cannot know the regime in advance
    pays for fixing that policy (the smaller, the better; <= 1 point is the acceptance).
    """
    summary = record["summary"]
    workloads = list(dict.fromkeys(s["workload"] for s in summary))
    policies = [p for p in dict.fromkeys(s["policy"] for s in summary) if p != "legacy"]
    by_key = {(s["workload"], s["policy"]): s["median_change"] for s in summary}
    best = {w: by_key[(w, best_margin(record, w))] for w in workloads}
    lines = ["| policy | " + " | ".join(workloads) + " | worst gap |",
             "|---|" + "---|" * (len(workloads) + 1)]
    for policy in policies:
        gaps = [by_key[(w, policy)] - best[w] for w in workloads if (w, policy) in by_key]
        lines.append(f"| {policy} | " + " | ".join(f"{_pt(g)}" for g in gaps)
                     + f" | **{_pt(max(gaps))}** |")
    return "\n".join(lines)


def plot(record: Mapping[str, Any], path: str | Path, band: str) -> None:
    """One panel per workload: every policy's median change with its 95% interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [s for s in record["summary"] if s["policy"] != "legacy"]
    workloads = list(dict.fromkeys(s["workload"] for s in rows))
    fig, axes = plt.subplots(1, len(workloads), figsize=(3.1 * len(workloads), 3.8), dpi=100)
    for ax, w in zip(list(axes) if len(workloads) > 1 else [axes], workloads, strict=True):
        mine = [s for s in rows if s["workload"] == w]
        ys = [s["median_change"] * 100 for s in mine]
        low = [(s["median_change"] - s["ci_low"]) * 100 for s in mine]
        high = [(s["ci_high"] - s["median_change"]) * 100 for s in mine]
        colors = ["tab:red" if s["policy"] == band else "tab:blue" for s in mine]
        ax.bar(range(len(mine)), ys, color=colors, alpha=0.75)
        ax.errorbar(range(len(mine)), ys, yerr=[low, high], fmt="none", ecolor="black",
                    capsize=2, linewidth=0.8)
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(mine)))
        ax.set_xticklabels([s["policy"].replace("band-", "band\n") for s in mine],
                           rotation=60, fontsize=7)
        ax.set_title(w, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        # margin 0 on long contexts dwarfs the rest; clip and print its value instead.
        top = max(y + h for y, h in zip(ys, high, strict=True))
        if top > 15:
            ax.set_ylim(top=15)
            for x, y in enumerate(ys):
                if y > 15:
                    ax.text(x, 13.5, f"{y:+.0f}%", ha="center", fontsize=7)
    axes_list = list(axes) if len(workloads) > 1 else [axes]
    axes_list[0].set_ylabel("step time vs legacy, paired median (%)")
    seeds = len(record["seeds"])
    fig.suptitle(f"context band ({band}, red) vs fixed margins and #6533's gate: "
                 f"median change with 95% CI, {seeds} paired seeds", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m affinity_sim.band", description=(
        "Head-to-head table of a context-band policy against margin 2 and the best fixed "
        "margin, from `affinity simulate --json` records (several are merged by seed)."))
    parser.add_argument("record", nargs="+",
                        help="run records (JSON); rows they share must agree")
    parser.add_argument("--band", required=True, help="the band policy's name in the record")
    parser.add_argument("--seeds", default=None, metavar="A-B[,C-D]",
                        help="use only these seeds (every policy summarized on the same seeds)")
    parser.add_argument("--png", default=None, help="also draw one panel per workload here")
    args = parser.parse_args(argv)
    # The figure's path is checked before anything is printed, not after the tables.
    why = file_problem(Path(args.png)) if args.png else None
    if why is None and args.png and Path(args.png).suffix not in FIGURE_SUFFIXES:
        why = f"{args.png}: the figure's file name must end in {', '.join(FIGURE_SUFFIXES)}"
    if why is not None:
        print(f"error: --png: {why}", file=sys.stderr)
        return 2
    try:
        if len(args.record) == 1 and args.seeds is None:
            record = load(args.record[0])
        else:
            record = merge_records([(path, load(path)) for path in args.record])
            if args.seeds is not None:
                record = select_seeds(record, parse_seed_ranges(args.seeds))
    except RecordError as exc:  # load names the file; merging names the row
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not any(row["policy"] == args.band for row in record["results"]):
        names = sorted({row["policy"] for row in record["results"]})
        print(f"--band {args.band!r} is not in the record; accepted: {names}", file=sys.stderr)
        return 2
    try:  # every table built before the first is printed
        tables = [policy_table(record), markdown(record, args.band), regret_table(record)]
    except ValueError as exc:  # e.g. no margin-N policy to compare the band with
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n\n".join(tables))
    if args.png:
        plot(record, args.png, args.band)
        print(f"\nsaved {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
