"""The referee's simulated column: verl's routing PRs against Aug-2026 main, from run records.

Theory of operation
-------------------
docs/verl-routing.md referees verl's routing pull requests; its last column gives each
PR's simulated change of step time against main (``legacy``: margin null, first-in-order
ties), where a simulator policy expresses the PR (:data:`ROW_POLICIES`). Every number in
that column is computed here from the committed run records, seed by seed:

* ``calibrated``: the five workloads of ``sim/examples/context-band.toml`` with main's first
  ties (``sim/examples/verl-routing.toml`` -> ``sim/verl-routing.json``);
* ``pr-scale``: the ``pr7435-scale`` preset's four rows (``sim/verl-routing-prscale.json``,
  with PR #7435's margin 2 taken from ``sim/context-band-prscale.json``, which ran the same
  code on the same seeds). :func:`pr_scale_record` merges the two by seed and refuses them
  if their shared ``legacy`` rows differ, so a pairing across files is checked, not assumed.

A cell is the paired median change over seeds, ``(t_policy - t_legacy) / t_legacy``, with
the order-statistic 95% interval of the median (:func:`affinity_sim.stats.median_ci`):
PR #7435 reports the paired median change, so the column does too. A policy whose step
time equals legacy's on every seed is shown as identical: the rule never acted.

The prediction registered before the runs (``sim/studies/verl-routing-prediction.toml``)
is a list of claims (:class:`Claim`); :func:`evaluate` checks each against the records and
:func:`prediction_table` renders every hit and miss. A claim the records cannot answer (a
workload or policy missing) is an error naming it, never a silent pass.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .records import merge_records
from .stats import median_ci, wilcoxon_p

__all__ = [
    "ACCEPTANCE_P",
    "ACCEPTANCE_SLACK",
    "CALIBRATED_WORKLOADS",
    "CLAIM_KINDS",
    "PR_WORKLOADS",
    "ROW_POLICIES",
    "Claim",
    "ClaimError",
    "Outcome",
    "Paired",
    "acceptance_table",
    "baseline_cell",
    "claim_row",
    "column",
    "evaluate",
    "load_claims",
    "paired",
    "pr_scale_record",
    "prediction_table",
]

CALIBRATED_WORKLOADS = ("ctx2k", "ctx9k", "ctx20k", "ctx9k-bigkv", "agent-80k")
PR_WORKLOADS = ("ctx2k", "ctx9k", "ctx20k", "ctx9k-bigkv")
SCALES = {"calibrated": CALIBRATED_WORKLOADS, "pr-scale": PR_WORKLOADS}
SCALE_NAMES = {"calibrated": "context-band.toml's workloads",
               "pr-scale": "PR #7435's scale (pr7435-scale)"}
# The table row (a PR number, or a new policy's name) -> the simulator policy that expresses
# it. A PR row's claims name it "#<number>".
ROW_POLICIES = {"7435": "margin-2", "6533": "dual-64", "7613": "legacy-draw",
                "6122": "group-only", "group pins with a band": "group-margin-2",
                "prefix placement in the band": "prefix-p2-margin-2",
                "group pins and prefix placement in the band": "prefix-p2-group-margin-2",
                "prefix placement in the band, adapters' index": "prefix-p2-margin-2-index",
                "both together, adapters' index": "prefix-p2-group-margin-2-index"}
BASELINE = "legacy"
CLAIM_KINDS = ("identical", "faster", "slower", "null", "within", "order", "near", "close")
_KEYS = {"row", "scale", "workloads", "policy", "expect", "why", "low", "high",
         "faster_policy", "slower_policy", "reference", "points", "other_policy"}


class ClaimError(ValueError):
    """A registered claim that is malformed, or that the records cannot answer."""


@attrs.frozen(kw_only=True)
class Paired:
    """One policy against legacy on one workload, paired by seed."""

    seeds: int
    median: float  # fraction: -0.05 is 5% faster than legacy
    ci_low: float
    ci_high: float
    p_value: float
    identical: int  # seeds on which the step time equals legacy's

    @property
    def always_identical(self) -> bool:
        return self.identical == self.seeds


@attrs.frozen(kw_only=True)
class Claim:
    row: str
    scale: str
    workloads: tuple[str, ...]
    expect: str
    why: str
    policy: str | None = None
    low: float | None = None
    high: float | None = None
    faster_policy: str | None = None
    slower_policy: str | None = None
    reference: str | None = None
    points: float | None = None
    other_policy: str | None = None

    def text(self) -> str:
        """The claim as one readable phrase (percent and points as registered)."""
        if self.expect == "order":
            return f"`{self.faster_policy}` faster than `{self.slower_policy}`"
        if self.expect == "within":
            return f"`{self.policy}` within [{self.low:+.1f}%, {self.high:+.1f}%]"
        if self.expect == "close":
            return f"`{self.policy}` within {self.points:.1f} pt of `{self.other_policy}`"
        if self.expect == "near":
            return (f"`{self.policy}` within {self.points:.1f} pt of its `{self.reference}` "
                    "run")
        words = {"identical": "identical to main on every seed", "faster": "faster (CI < 0)",
                 "slower": "slower (CI > 0)", "null": "no change (CI contains 0)"}
        return f"`{self.policy}` {words[self.expect]}"


@attrs.frozen(kw_only=True)
class Outcome:
    claim: Claim
    workload: str
    observed: str
    hit: bool


def _times(record: Mapping[str, Any]) -> dict[tuple[str, str], dict[int, float]]:
    times: dict[tuple[str, str], dict[int, float]] = {}
    for row in record["results"]:
        times.setdefault((row["workload"], row["policy"]), {})[int(row["seed"])] = float(
            row["step_time_s"])
    return times


def paired(record: Mapping[str, Any], workload: str, policy: str,
           baseline: str = BASELINE, among: str | None = None) -> Paired:
    """``policy`` against ``baseline`` on ``workload``, over the seeds both ran (and, with
    ``among``, that policy ran too: two policies compared with one another are each taken
    on the same seeds)."""
    times = _times(record)
    for name in (policy, baseline) + ((among,) if among else ()):
        if (workload, name) not in times:
            raise ClaimError(f"the record has no {name!r} results for workload {workload!r}")
    mine, base = times[(workload, policy)], times[(workload, baseline)]
    shared = set(mine) & set(base)
    if among:
        shared &= set(times[(workload, among)])
    seeds = sorted(shared)
    if not seeds:
        raise ClaimError(f"{policy!r} and {baseline!r} share no seed on {workload!r}")
    changes = [(mine[s] - base[s]) / base[s] for s in seeds]
    low, high = median_ci(changes)
    return Paired(seeds=len(seeds), median=statistics.median(changes), ci_low=low, ci_high=high,
                  p_value=wilcoxon_p([mine[s] for s in seeds], [base[s] for s in seeds]),
                  identical=sum(1 for s in seeds if mine[s] == base[s]))


def pr_scale_record(new: Mapping[str, Any], earlier: Mapping[str, Any],
                    policies: Sequence[str] = (BASELINE, "margin-2")) -> dict[str, Any]:
    """The PR-scale runs as one record: ``new`` plus ``policies`` of ``earlier`` on the four
    PR rows and ``new``'s seeds (so every policy is summarized on the same sample); a shared
    legacy row that differs is an error (records.merge_records)."""
    seeds = {int(r["seed"]) for r in new["results"]}
    keep = {"results": [r for r in earlier["results"]
                        if r["workload"] in PR_WORKLOADS and r["policy"] in policies
                        and int(r["seed"]) in seeds]}
    mine = {"results": [r for r in new["results"] if r["workload"] in PR_WORKLOADS]}
    return merge_records([("new PR-scale run", mine), ("earlier PR-scale run", keep)])


def _pct(value: float) -> str:
    return f"{value * 100:+.1f}"


def _p(value: float) -> str:
    return f"{value:.1e}" if value < 1e-3 else f"{value:.3f}"


def _cell(p: Paired) -> str:
    if p.always_identical:
        return "0 (identical on every seed)"
    return f"{_pct(p.median)}% [{_pct(p.ci_low)}, {_pct(p.ci_high)}]"


def _seeds(record: Mapping[str, Any], workloads: Sequence[str], policy: str) -> int:
    return min(paired(record, w, policy).seeds for w in workloads)


def column(records: Mapping[str, Mapping[str, Any]], row: str,
           claims: Sequence[Claim]) -> str:
    """The table cell of PR ``row``: per scale, per workload, median [95% CI]; its hits."""
    if row not in ROW_POLICIES:
        raise ClaimError(f"no simulator policy for row {row!r}; known: {sorted(ROW_POLICIES)}")
    policy = ROW_POLICIES[row]
    parts = []
    for scale, workloads in SCALES.items():
        record = records[scale]
        if not any(r["policy"] == policy for r in record["results"]):
            parts.append(f"{SCALE_NAMES[scale]}: not run")
            continue
        cells = "; ".join(f"{w} {_cell(paired(record, w, policy))}" for w in workloads)
        parts.append(f"{SCALE_NAMES[scale]}, {_seeds(record, workloads, policy)} seeds: "
                     f"{cells}")
    mine = [o for c in claims if c.row == claim_row(row) for o in evaluate(c, records)]
    hits = sum(o.hit for o in mine)
    verdict = f" Prediction: {hits} of {len(mine)} hit." if mine else ""
    return f"`{policy}` vs `legacy`, paired median [95% CI]. " + ". ".join(parts) + "." \
        + verdict


def baseline_cell(records: Mapping[str, Mapping[str, Any]]) -> str:
    """Main's own row: the baseline, with legacy's median step time per workload."""
    parts = []
    for scale, workloads in SCALES.items():
        times = _times(records[scale])
        cells = "; ".join(
            f"{w} {statistics.median(times[(w, BASELINE)].values()):.0f} s" for w in workloads)
        parts.append(f"{SCALE_NAMES[scale]}: {cells}")
    return ("the baseline, `legacy` (first ties): 0 by definition. Its median step time: "
            + ". ".join(parts) + ".")


def claim_row(row: str) -> str:
    """How the claims name table row ``row``: ``#7435`` for a PR, the name otherwise."""
    return f"#{row}" if row.isdigit() else row


def _need(claim: Claim, *names: str) -> None:
    for name in names:
        if getattr(claim, name) is None:
            raise ClaimError(f"claim {claim.row} {claim.scale} {claim.expect!r} needs {name!r}")


def evaluate(claim: Claim, records: Mapping[str, Mapping[str, Any]]) -> list[Outcome]:
    """One outcome per workload of ``claim``: what the records show and whether it holds."""
    if claim.scale not in records:
        raise ClaimError(f"no record for scale {claim.scale!r}; have {sorted(records)}")
    record = records[claim.scale]
    outcomes = []
    for w in claim.workloads:
        if claim.expect == "order":
            _need(claim, "faster_policy", "slower_policy")
            a = paired(record, w, str(claim.faster_policy), among=claim.slower_policy)
            b = paired(record, w, str(claim.slower_policy), among=claim.faster_policy)
            observed = f"{_pct(a.median)}% vs {_pct(b.median)}%"
            hit = a.median < b.median
        elif claim.expect == "close":
            _need(claim, "policy", "other_policy", "points")
            a = paired(record, w, str(claim.policy), among=claim.other_policy)
            b = paired(record, w, str(claim.other_policy), among=claim.policy)
            gap = abs(a.median - b.median) * 100
            observed = f"{_pct(a.median)}% vs {_pct(b.median)}% ({gap:.1f} pt)"
            hit = gap <= float(claim.points or 0.0)
        elif claim.expect == "near":
            _need(claim, "policy", "reference", "points")
            if claim.reference not in records:
                raise ClaimError(f"no reference record {claim.reference!r}; have "
                                 f"{sorted(records)}")
            a = paired(record, w, str(claim.policy))
            b = paired(records[str(claim.reference)], w, str(claim.policy))
            gap = abs(a.median - b.median) * 100
            observed = f"{_pct(a.median)}% vs {_pct(b.median)}% ({gap:.1f} pt)"
            hit = gap <= float(claim.points or 0.0)
        else:
            _need(claim, "policy")
            p = paired(record, w, str(claim.policy))
            # the Wilcoxon p beside the interval: a "null" hit with a small p is a close call
            observed = f"{_cell(p)} · p {_p(p.p_value)}" if claim.expect != "identical" else (
                f"identical on {p.identical} of {p.seeds} seeds")
            if claim.expect == "identical":
                hit = p.always_identical
            elif claim.expect == "faster":
                hit = p.ci_high < 0
            elif claim.expect == "slower":
                hit = p.ci_low > 0
            elif claim.expect == "null":
                hit = p.ci_low <= 0 <= p.ci_high
            else:  # within
                _need(claim, "low", "high")
                hit = float(claim.low or 0.0) <= p.median * 100 <= float(claim.high or 0.0)
                observed = f"{_pct(p.median)}%"
        outcomes.append(Outcome(claim=claim, workload=w, observed=observed, hit=hit))
    return outcomes


def load_claims(text: str) -> list[Claim]:
    """The ``[[claim]]`` tables of a prediction file; a malformed one names its problem."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10: the same parser, as the [sim] extra's tomli
        import tomli as tomllib
    try:
        tables = tomllib.loads(text).get("claim", [])
    except tomllib.TOMLDecodeError as exc:
        raise ClaimError(f"prediction file: invalid TOML: {exc}") from None
    claims = []
    for index, table in enumerate(tables):
        where = f"claim {index + 1}"
        unknown = sorted(set(table) - _KEYS)
        if unknown:
            raise ClaimError(f"{where}: unknown keys {unknown}; accepted: {sorted(_KEYS)}")
        if table.get("expect") not in CLAIM_KINDS:
            raise ClaimError(f"{where}: expect must be one of {list(CLAIM_KINDS)}, got "
                             f"{table.get('expect')!r}")
        if table.get("scale") not in SCALES and table.get("scale") is not None:
            raise ClaimError(f"{where}: scale must be one of {sorted(SCALES)}, got "
                             f"{table.get('scale')!r}")
        for key in ("row", "scale", "why"):
            if not isinstance(table.get(key), str) or not table[key]:
                raise ClaimError(f"{where}: {key!r} must be a non-empty string, got "
                                 f"{table.get(key)!r}")
        workloads = table.get("workloads")
        if not isinstance(workloads, list) or not workloads or not all(
                w in SCALES[table["scale"]] for w in workloads):
            raise ClaimError(f"{where}: workloads must be a non-empty list of "
                             f"{list(SCALES[table['scale']])}, got {workloads!r}")
        claims.append(Claim(**{**table, "workloads": tuple(workloads)}))
    if not claims:
        raise ClaimError("prediction file: no [[claim]] table")
    return claims


def prediction_table(records: Mapping[str, Mapping[str, Any]], claims: Sequence[Claim]) -> str:
    """Every registered claim per workload, what the runs show, and hit or miss."""
    lines = ["| PR | scale | registered claim | workload | observed | result |",
             "|---|---|---|---|---|---|"]
    outcomes = [o for c in claims for o in evaluate(c, records)]
    for o in outcomes:
        lines.append(f"| {o.claim.row} | {o.claim.scale} | {o.claim.text()} | {o.workload} | "
                     f"{o.observed} | {'hit' if o.hit else '**miss**'} |")
    hits = sum(o.hit for o in outcomes)
    lines.append(f"\n{hits} of {len(outcomes)} registered claims hit; "
                 f"{len(outcomes) - hits} missed.")
    return "\n".join(lines)


ACCEPTANCE_P = 0.01  # "beats" means the paired median is below 0 at this Wilcoxon p
ACCEPTANCE_SLACK = 0.01  # and "never worse by more than 1 point" on any workload


def acceptance_table(record: Mapping[str, Any], policy: str, rivals: Sequence[str],
                     workloads: Sequence[str] = CALIBRATED_WORKLOADS,
                     needed: int = 3) -> str:
    """``policy`` paired against each rival directly, per workload: the median change
    ``(t_policy - t_rival) / t_rival`` with its 95% interval and the Wilcoxon p. It *beats*
    a rival where the median is below 0 at p < ACCEPTANCE_P; the target is beating every
    rival on ``needed`` workloads and never being worse than one by more than
    ACCEPTANCE_SLACK."""
    lines = ["| workload | " + " | ".join(f"vs `{r}`" for r in rivals) + " | beats all |",
             "|---|" + "---|" * len(rivals) + "---|"]
    beaten_all = 0
    worst = -1.0
    for w in workloads:
        cells, beats = [], True
        for rival in rivals:
            p = paired(record, w, policy, baseline=rival)
            won = p.median < 0 and p.p_value < ACCEPTANCE_P
            beats &= won
            worst = max(worst, p.median)
            cells.append(f"{_pct(p.median)}% [{_pct(p.ci_low)}, {_pct(p.ci_high)}] · "
                         f"p {_p(p.p_value)}, {p.seeds} seeds{' · **beats**' if won else ''}")
        beaten_all += beats
        lines.append(f"| {w} | " + " | ".join(cells) + f" | {'yes' if beats else 'no'} |")
    met = beaten_all >= needed and worst <= ACCEPTANCE_SLACK
    lines.append(f"\nBeats every rival at p < {ACCEPTANCE_P} on {beaten_all} of "
                 f"{len(workloads)} workloads (target: {needed}); its worst median against a "
                 f"rival is {_pct(worst)}% (target: at most {_pct(ACCEPTANCE_SLACK)}%). "
                 f"Target **{'met' if met else 'missed'}**.")
    return "\n".join(lines)
