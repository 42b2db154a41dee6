"""Render every count, time and ratio the READMEs state from the data file that holds it.

Theory of operation
-------------------
A number in prose that a person keeps by hand drifts the moment the data behind it is
re-recorded. So the docs hold no such number: each one sits in a marked region,

    <!-- render:NAME -->...<!-- /render -->

and this script replaces the region's content with what :data:`RENDERERS` ``[NAME]``
computes from a committed data file: the ``affinity verify --json`` report
(``proofs/verify-default.json``), the vectors' ``MANIFEST.json``, the benchmark record
(``benchmarks/bench_core.json``), the simulator's run records (``sim/*.json``, and the
registered prediction they are checked against, ``sim/studies/verl-routing-prediction.toml``)
and the audit catalogue (``tools/mutation_audit``). A region whose rendering is one line stays
inline; a multi-line one (a table) sits on its own lines between the markers. Files in
:data:`GENERATED` are written whole (``docs/requirement-ids.md`` from ``spec/SPEC.md``).

    python scripts/render_docs.py           # rewrite the regions and generated files
    python scripts/render_docs.py --check   # exit 1 naming every stale file; write nothing

``tests/packaging/test_rendered_docs.py`` runs the check, so a re-recorded data file
without a re-rendered doc, or a number edited by hand inside a region, fails the tests.
To refresh the verify record: ``affinity verify --json proofs/verify-default.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "sim", ROOT / "proofs"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

__all__ = ["GENERATED", "RENDERED", "RENDERERS", "RenderError", "check", "main", "render_text",
           "requirement_ids"]

# The files whose regions are rendered (every file that has a region must be listed, so
# the check cannot miss one).
RENDERED = ("README.md", "proofs/README.md", "sim/README.md", "sim/studies/README.md",
            "benchmarks/README.md", "docs/conformance.md", "docs/inner-loop.md",
            "docs/verl-routing.md", "spec/vectors/README.md")
REGION = re.compile(r"<!-- render:([\w.-]+) -->(.*?)<!-- /render -->", re.S)


class RenderError(Exception):
    """A region names no renderer, or a data file lacks what a renderer needs."""


@cache
def _json(rel: str) -> Any:
    with open(ROOT / rel, encoding="utf-8") as handle:
        return json.load(handle)


def _verify() -> dict[str, Any]:
    report: dict[str, Any] = _json("proofs/verify-default.json")
    return report


# ------------------------------------------------------------------ affinity verify

def _obligations() -> list[dict[str, Any]]:
    return [o for o in _verify()["obligations"] if o["obligation"] >= 1]


def verify_obligation_count() -> str:
    return str(len(_obligations()))


def _mutant_names() -> set[str]:
    return {m["name"] for r in _verify()["rows"] for m in r["mutants"]}


def verify_summary() -> str:
    report = _verify()
    rows = report["rows"]
    all_n = sum(1 for r in rows if r["scope_kind"] == "all N")
    versions = report.get("versions", {})
    return (f"{len(_obligations())} obligations in {len(rows)} checks ({all_n} of them proved "
            f"for every pool size N), {len(_mutant_names())} mutants refuted, "
            f"{report['seconds']:.0f} s wall on 2 workers at the {report['scope']} scope "
            f"(`proofs/verify-default.json`, Python {versions.get('python', '?')}, "
            f"z3-solver {versions.get('z3-solver', '?')})")


def _row(obligation: int, method: str) -> dict[str, Any]:
    for r in _verify()["rows"]:
        if r["obligation"] == obligation and r["method"] == method:
            row: dict[str, Any] = r
            return row
    raise RenderError(f"proofs/verify-default.json has no row {method!r} of obligation "
                      f"{obligation}; re-run affinity verify --json")


def verify_config_cases() -> str:
    return str(_row(19, "exhaustive edge-value table")["evidence"]["cases"])


def verify_event_values() -> str:
    return str(_row(19, "event edge-value table")["evidence"]["values"])


def verify_decision_acquires() -> str:
    return f"{_row(15, 'decision table (plain rules)')['evidence']['acquires']:,}"


# Where each method of the report is implemented (the modules under proofs/affinity_proofs).
METHOD_MODULES: dict[str, str] = {
    "Z3 lemma, all N": "z3_param_lemmas",
    "Z3 induction step, all N": "z3_param_lemmas",
    "Z3 LoadTable merge, induction": "z3_structures",
    "Z3 all-N encoding == real core (wide)": "conformance_wide",
    "Z3 encoding == real core (concrete)": "conformance",
    "Z3 fact (witness)": "z3_lemmas",
    "Z3 BMC (releases adversarial)": "z3_bmc",
    "Z3 BMC witnesses -> proofs/counterexamples": "z3_bmc",
    "BFS all interleavings": "bfs_checks",
    "BFS of the reference, group pins": "bfs_groups",
    "Z3 prefix encoding == reference (points)": "conformance_prefix",
    "BFS symmetry reduction sound": "bfs",
    "BFS in-flight ground truth": "bfs_envs",
    "BFS lease ground truth": "bfs_envs",
    "CrossHair contracts": "contracts",
    "CrossHair diffbehavior": "crosshair_run",
    "engine vs reference (wide traces, vectors, old states)": "refinement",
    "LoadTable vs plain definition": "structures",
    "StickyLru vs plain definition": "structures",
    "subprocesses x PYTHONHASHSEED": "det_trace",
    "decision table (plain rules)": "decision_table",
    "draw_for feedback table": "refinement_table",
    "predicate exhibits": "predicate_table",
    "SPEC worked examples": "jobs_tables",
    "exhaustive edge-value table": "config_table",
    "event edge-value table": "input_table",
    "encoding round trip": "input_table",
    "derived configuration flags": "input_table",
    "unread acquire inputs": "input_table",
    "configuration defaults": "input_table",
}


def _module(obligation: int, method: str) -> str:
    if obligation == 20 and method == "Z3 lemma, all N":
        return "z3_band_lemmas"
    if obligation == 20 and method == "BFS all interleavings":
        return "bfs_band_checks"
    if obligation in (15, 16, 17, 18) and method == "BFS all interleavings":
        return "bfs_spec_checks"
    try:
        return METHOD_MODULES[method]
    except KeyError:
        raise RenderError(f"verify method {method!r} has no module in "
                          "scripts/render_docs.py's METHOD_MODULES") from None


def _bounded_scope(rows: list[dict[str, Any]]) -> str:
    # The widest bounded scope of the obligation: its explicit-state run if it has one
    # (every interleaving), else its first bounded row.
    bounded = [r for r in rows if r["scope_kind"] == "bounded"]
    bfs = [r for r in bounded if r["method"] == "BFS all interleavings"]
    chosen = (bfs or bounded)[:1]
    return chosen[0]["scope"].removeprefix("bounded: ") if chosen else "—"


def verify_obligations_table() -> str:
    rows = _verify()["rows"]
    lines = ["| # | Obligation | For every N | Bounded scope (widest run) | Checks | "
             "Mutants | Where (`affinity_proofs/`) |",
             "|---|---|---|---|---|---|---|"]
    for o in _verify()["obligations"]:
        mine = [r for r in rows if r["obligation"] == o["obligation"]]
        all_n = sum(1 for r in mine if r["scope_kind"] == "all N")
        modules = sorted({_module(r["obligation"], r["method"]) for r in mine})
        mutants = len({m["name"] for r in mine for m in r["mutants"]})
        lines.append(f"| {o['obligation']} | {o['title']} | "
                     f"{f'{all_n} Z3' if all_n else 'no'} | {_bounded_scope(mine)} | "
                     f"{len(mine)} | {mutants} | {', '.join(modules)} |")
    return "\n".join(lines)


def verify_all_n_lemmas() -> str:
    lines = ["| Lemma (for every N) | Obligation | Seconds |", "|---|---|---|"]
    for r in _verify()["rows"]:
        lemma = r["evidence"].get("lemma")
        if r["scope_kind"] == "all N" and isinstance(lemma, str):
            lines.append(f"| `{lemma}` | {r['obligation']} | {r['seconds']:.2f} |")
    return "\n".join(lines)


# ------------------------------------------------------------------ vectors

def vectors_total() -> str:
    manifest = _json("spec/vectors/MANIFEST.json")
    return f"{manifest['cases']} portable cases in {len(manifest['suites'])} suites"


def vectors_cases() -> str:
    return str(_json("spec/vectors/MANIFEST.json")["cases"])


def _node_replayed() -> tuple[int, int]:
    """What the Node consumer replays: the cases whose features are all in its SUPPORTED
    set (read from consumer.mjs), construction refusals aside, as the consumer decides;
    and the number of cases."""
    source = (ROOT / "spec/vectors/consumers/node/consumer.mjs").read_text(encoding="utf-8")
    found = re.search(r"const SUPPORTED = new Set\(\[(.*?)\]\);", source, re.S)
    if found is None:
        raise RenderError("consumer.mjs: no `const SUPPORTED = new Set([...]);` line")
    supported = set(re.findall(r'"([a-z_]+)"', found.group(1)))
    manifest = _json("spec/vectors/MANIFEST.json")
    replayed = 0
    for rel in manifest["files"]:
        case = _json(f"spec/vectors/{rel}")
        replayed += case.get("valid", True) is not False and set(case["features"]) <= supported
    return replayed, manifest["cases"]


def node_consumer_support() -> str:
    replayed, total = _node_replayed()
    return (f"passes all {replayed} cases it supports and reports the other "
            f"{total - replayed} as unsupported")


def node_consumer_replayed() -> str:
    return str(_node_replayed()[0])



# ------------------------------------------------------------------ mutation audit

def audit_catalogue() -> str:
    from tools.mutation_audit.catalogue import CATALOGUE
    from tools.mutation_audit.catalogue_core import CORE_CATALOGUE

    def counts(catalogue: Any) -> tuple[int, int]:
        return len(catalogue), sum(1 for m in catalogue if m.equivalent is not None)

    core, core_eq = counts(CORE_CATALOGUE)
    engine, engine_eq = counts(CATALOGUE)
    return (f"{core} one-line mutants of the reference (`affinity_core`, {core_eq} argued "
            f"equivalent) and {engine} of the engine (`affinity_engine` and the modules it "
            f"shares, {engine_eq} argued equivalent)")


# The audit records: ``python -m tools.mutation_audit.run --package P --scope default
# --worktree --out proofs/mutation-audit-P.json`` (one file per package).
AUDIT_RECORDS = {"core": "proofs/mutation-audit-core.json",
                 "engine": "proofs/mutation-audit-engine.json"}
AUDIT_NAMES = {"core": "reference (`affinity_core`)", "engine": "engine (`affinity_engine`)"}


def _audit_record(package: str) -> dict[str, Any] | None:
    path = ROOT / AUDIT_RECORDS[package]
    return _json(AUDIT_RECORDS[package]) if path.exists() else None


def _commits(commit: str | list[str]) -> str:
    """The commits an audit ran against (a resumed audit may span several)."""
    commits = [commit] if isinstance(commit, str) else commit
    return ("commit " if len(commits) == 1 else "commits ") + ", ".join(
        f"`{c}`" for c in commits)


def audit_rates() -> str:
    """One line per package: what ``affinity verify`` alone killed of its audit set."""
    lines = []
    for package, name in AUDIT_NAMES.items():
        record = _audit_record(package)
        if record is None:
            lines.append(f"* {name}: no recorded run of this catalogue "
                         f"(`{AUDIT_RECORDS[package]}` is absent)")
            continue
        summary = record["packages"][package]
        lines.append(
            f"* {name}: `affinity verify --scope {record['scope']}` alone killed "
            f"**{summary['killed']} of {summary['non_equivalent']}** non-equivalent mutants "
            f"({100 * summary['kill_rate']:.1f} %); {summary['equivalent']} argued equivalent; "
            f"{_commits(record['commit'])}, load average at the end "
            f"{', '.join(f'{x:.1f}' for x in record['load_average'])} "
            f"(`{AUDIT_RECORDS[package]}`)")
    return "\n".join(lines)


def audit_survivors() -> str:
    """Every mutant of a recorded run that ``affinity verify`` did not kill, with its
    argument (the catalogue's equivalence claim) or, lacking one, the word survivor."""
    from tools.mutation_audit.run import by_id

    rows = ["| package | mutant | one-line bug | why it survives |", "|---|---|---|---|"]
    for package in AUDIT_NAMES:
        record = _audit_record(package)
        for result in record["results"] if record else []:
            if result["verdict"] == "killed":
                continue
            claim = by_id(result["id"]).equivalent
            why = f"equivalent: {claim}" if claim else "**survivor: not argued**"
            rows.append(f"| {package} | `{result['id']}` | {result['description']} | "
                        f"{why} |")
    return "\n".join(rows)


# ------------------------------------------------------------------ benchmarks

def bench_core_table() -> str:
    record = _json("benchmarks/bench_core.json")
    compiled = record["bench_core"]["compiled"]["rows"]
    pure = {r["replicas"]: r for r in record["bench_core"]["pure"]["rows"]}
    lines = ["| Replicas | core / PR #7435 class, compiled | adapter, compiled | core target | "
             "core, pure source | memory per sticky entry vs verl |",
             "|---|---|---|---|---|---|"]
    for r in compiled:
        lines.append(f"| {r['replicas']:,} | {r['core_ratio']:.2f}× | {r['adapter_ratio']:.2f}× "
                     f"| ≤ {r['targets']['core']:g}× | {pure[r['replicas']]['core_ratio']:.2f}× "
                     f"| {r['memory_ratio']:.2f}× |")
    return "\n".join(lines)


def bench_core_full() -> str:
    record = _json("benchmarks/bench_core.json")["bench_core"]
    lines = ["| replicas x sessions | pairs | PR #7435 µs | verl µs | core µs | adapter µs | "
             "core / PR | adapter / PR | target core / adapter | verl B/entry | "
             "core B/entry | memory ratio |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    runs = [(build, r) for build in ("pure", "compiled") for r in record[build]["rows"]]
    for build, r in sorted(runs, key=lambda run: run[1]["replicas"]):
        bold = "**" if build == "compiled" else ""
        target = r["targets"]
        lines.append(
            f"| {r['replicas']:,} x {r['sessions']:,}, {build} | {r['pairs']:,} | "
            f"{r['pr7435_us']:.2f} | {r['verl_us']:.2f} | {r['core_us']:.2f} | "
            f"{r['adapter_us']:.2f} | {bold}{r['core_ratio']:.2f}{bold} | "
            f"{bold}{r['adapter_ratio']:.2f}{bold} | "
            f"≤ {target['core']:g} / ≤ {target['adapter']:g} "
            f"| {r['verl_bytes_per_entry']:.0f} | {r['core_bytes_per_entry']:.0f} | "
            f"{r['memory_ratio']:.2f} |")
    return "\n".join(lines)


def bench_core_runs() -> str:
    record = _json("benchmarks/bench_core.json")
    runs = record["bench_core"]
    loads = "; ".join(f"{build} {runs[build]['load_before']} → {runs[build]['load_after']}"
                      for build in ("compiled", "pure"))
    return (f"Recorded {record['recorded'].split(',')[0]}, Python {record['python']}, margin "
            f"{record['margin']}, one process per build, the four implementations alternating "
            f"on the same trace; load average (1/5 min) before → after: {loads} "
            "(`benchmarks/bench_core.json`).")


def bench_lru_table() -> str:
    runs = _json("benchmarks/bench_core.json")["bench_lru"]
    rows = [("`touch` of a present key", "touch", "verl_touch"),
            ("`put` of a new key into a full map", "put_evict", "verl_put_evict"),
            ("`key in` map", "in", "verl_in"),
            ("kept hit, `step` acquire + release (PR #7435 class)", "kept_pair",
             "pr7435_kept_pair"),
            ("bytes per entry after the puts", "lru_mem_after_puts", "verl_mem_after_puts"),
            ("bytes per entry, peak while touching", "lru_mem_touching", "verl_mem_touching")]
    lines = ["| operation (ns, or bytes) | compiled | pure | verl / PR #7435 |",
             "|---|---:|---:|---:|"]
    for label, ours, theirs in rows:
        compiled, pure = runs["compiled"]["ns"], runs["pure"]["ns"]
        lines.append(f"| {label} | {compiled[ours]:,.0f} | {pure[ours]:,.0f} | "
                     f"{compiled[theirs]:,.0f} |")
    return "\n".join(lines)


def bench_router_table() -> str:
    rows = _json("benchmarks/results/bench_router.json")["rows"]
    clients = rows[0]["overhead_concurrency"] if rows else 0
    lines = ["| Router / policy | Prompts | Hit rate | Makespan (s, median) | p50 (ms) | p95 (ms) "
             f"| Overhead (ms/req) | Overhead, {clients} clients (ms/req) | Split | Errors |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['prompts']} | {r['hit_rate']:.3f} | {r['makespan_s']:.2f} "
            f"| {r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {r['overhead_ms']:.2f} "
            f"| {r['overhead_concurrent_ms']:.2f} | {'/'.join(map(str, r['split']))} "
            f"| {r['errors']} |")
    return "\n".join(lines)


def bench_router_overhead() -> str:
    """``bench_router.py --overhead-only``'s record: medians over its rounds, each ratio
    against vllm-router measured in the same run."""
    record = _json("benchmarks/results/bench_router_overhead.json")
    lines = [f"Medians of {record['rounds']} rounds on {record['cpus']} CPUs (Python "
             f"{record['python']}; affinity_engine {record['affinity_build']}; load "
             f"average {record['load_average_start']:.1f} at the "
             f"start, {record['load_average_end']:.1f} at the end; "
             "`benchmarks/results/bench_router_overhead.json`); each throughput phase "
             f"timed {record['throughput_requests']:,} requests; in brackets, the ratio to "
             "vllm-router in the same run.", "",
             f"| Router | Overhead, 1 client | Overhead, {record['concurrency']} clients | "
             f"Req/s, {record['throughput_clients']} clients | Router CPU per request |",
             "|---|---|---|---|---|"]
    for row in record["rows"]:
        ratios = row.get("ratios", {})
        cells = []
        for text, key in ((f"{row['overhead_ms']:.3f} ms", "overhead"),
                          (f"{row['overhead_concurrent_ms']:.3f} ms", "overhead_concurrent"),
                          (f"{row['requests_per_second']:,.0f}", "requests_per_second"),
                          (f"{row['router_cpu_us']:.0f} us", "router_cpu")):
            cells.append(f"{text} ({ratios[key]:.2f}x)" if key in ratios else text)
        lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bench_router_overhead_runs() -> str:
    """Every recorded ``--overhead-only`` run (``bench_router_overhead_runs.json``, which
    the script appends to): the spread that one run's medians hide."""
    record = _json("benchmarks/results/bench_router_overhead_runs.json")
    runs = record["runs"]
    lines = ["Every recorded run, in order "
             "(`benchmarks/results/bench_router_overhead_runs.json`; the script appends "
             "each run to it): Affinity margin=2 against vllm-router sticky_least_loaded "
             "in the same run, 2-core machine, no other job running.", "",
             "| Run | When | Build | Requests timed | Overhead, 1 client | Req/s, 64 clients "
             "| Router CPU per request | Load average |",
             "|---|---|---|---|---|---|---|---|"]
    for number, run in enumerate(runs, 1):
        ratios = run["ratios"]
        build = run["affinity_build"].split(" ")[0]
        mark = " (the record above)" if number == len(runs) else ""
        lines.append(f"| {number}{mark} | {run['when']} | {build} "
                     f"| {run['throughput_requests']:,} | {ratios['overhead']:.2f}x "
                     f"| {ratios['requests_per_second']:.2f}x | {ratios['router_cpu']:.2f}x "
                     f"| {run['load_average_start']:.1f} to {run['load_average_end']:.1f} |")
    return "\n".join(lines)


def bench_compare_routers() -> str:
    """``compare_routers.py``'s table of its last recorded run (the script writes it
    beside its JSON record)."""
    return (ROOT / "benchmarks/results/compare_routers.md").read_text(encoding="utf-8").strip()


# ------------------------------------------------------------------ simulator

def _sim(name: str) -> dict[str, Any]:
    record: dict[str, Any] = _json(f"sim/{name}.json")
    return record


def sim_margin2_at_pr_scale() -> str:
    from affinity_sim.prscale_report import ROWS
    record = _sim("pr7435-scale")
    lines = ["| PR #7435 row | PR: margin 2 | simulated: margin 2 [95% CI] |", "|---|---|---|"]
    for row in ROWS:
        ref = record["reference"][row]
        m2 = next(s for s in record["summary"]
                  if s["workload"] == row and s["policy"] == "margin-2")
        lines.append(f"| {ref['context']} | {ref['change'] * 100:+.1f}% | "
                     f"{m2['median_change'] * 100:+.1f}% [{m2['ci_low'] * 100:+.1f}%, "
                     f"{m2['ci_high'] * 100:+.1f}%] |")
    seeds = record["seeds"]
    lines.append(f"\n({len(seeds) if isinstance(seeds, list) else seeds} paired seeds; "
                 "`sim/pr7435-scale.json`)")
    return "\n".join(lines)


def _prscale(table: str) -> Callable[[], str]:
    def render() -> str:
        from affinity_sim import prscale_report as report
        scale = _sim("pr7435-scale")
        if table == "prediction":
            return report.prediction_table(scale)
        if table == "policies":
            return report.policies_table(scale)
        if table == "ablation":
            return report.ablation_table(_sim("pr7435-scale-ablation"))
        if table == "context-per-request":
            return report.sensitivity_table(scale, _sim("pr7435-scale-context-per-request"))
        if table == "replication":
            return report.replication_table(scale, _sim("pr7435-scale-replication"), {
                n: _sim(n) for n in ("pr7435-scale-step-size", "pr7435-scale-pool")})
        grid = {"dispersion": report.dispersion_table, "step-size": report.step_size_table,
                "turns": report.turns_table, "pool": report.pool_table}[table]
        return grid(scale, _sim(f"pr7435-scale-{table}"))
    return render


def _band(table: str, name: str, policy: str = "band-m1-T8192-cap4") -> Callable[[], str]:
    def render() -> str:
        from affinity_sim import band
        record = _sim(name)
        if table == "head-to-head":
            return band.markdown(record, policy)
        return {"policies": band.policy_table, "regret": band.regret_table}[table](record)
    return render


# The registered predictions behind docs/verl-routing.md, each rendered as its own table:
# region suffix -> prediction file (sim/studies/).
VERL_ROUTING_PREDICTIONS = {"": "verl-routing-prediction.toml",
                            "-groups": "group-pins-prediction.toml",
                            "-prefix": "prefix-placement-prediction.toml",
                            "-prefix-index": "prefix-index-prediction.toml",
                            "-prefix-index-prscale": "prefix-index-prscale-prediction.toml"}


@cache
def _verl_routing() -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The records behind docs/verl-routing.md's simulated column, and the registered claims
    of each prediction file. The group-pin and prefix runs join the PR runs by seed; a
    shared ``legacy`` row that differs refuses the merge (records.merge_records)."""
    from affinity_sim import verl_routing
    from affinity_sim.records import merge_records
    calibrated = merge_records([(name, _sim(name)) for name in (
        "verl-routing", "verl-routing-groups", "verl-routing-prefix",
        "verl-routing-prefix-index")])
    pr_scale = merge_records([
        ("verl-routing-prscale", verl_routing.pr_scale_record(_sim("verl-routing-prscale"),
                                                              _sim("context-band-prscale"))),
        ("verl-routing-groups-prscale", _sim("verl-routing-groups-prscale")),
        ("verl-routing-prefix-prscale", _sim("verl-routing-prefix-prscale")),
        ("verl-routing-prefix-index-prscale", _sim("verl-routing-prefix-index-prscale")),
    ])
    records = {
        "calibrated": calibrated,
        "pr-scale": pr_scale,
        "context-band": _sim("context-band"),  # the same workloads with random ties
    }
    claims = {suffix: verl_routing.load_claims(
        (ROOT / "sim" / "studies" / name).read_text(encoding="utf-8"))
        for suffix, name in VERL_ROUTING_PREDICTIONS.items()}
    return records, claims


# Region names cannot hold spaces: the slugs of the policy rows that are not PRs.
VERL_ROUTING_ROW_SLUGS = {"group-band": "group pins with a band",
                          "prefix-band": "prefix placement in the band",
                          "prefix-group-band": "group pins and prefix placement in the band",
                          "prefix-index-band": "prefix placement in the band, adapters' index",
                          "prefix-index-group-band": "both together, adapters' index"}


def verl_routing_column(row: str) -> str:
    from affinity_sim import verl_routing
    records, claims = _verl_routing()
    row = VERL_ROUTING_ROW_SLUGS.get(row, row)
    if row == "main":
        return verl_routing.baseline_cell(records)
    every = [c for file_claims in claims.values() for c in file_claims]
    return verl_routing.column(records, row, every)


VERL_ROUTING_RUNS = (
    ("verl-routing", "context-band.toml's workloads"),
    ("verl-routing-groups", "group pins on them"),
    ("verl-routing-prefix", "prefix placement on them"),
    ("verl-routing-prefix-index", "prefix placement fed the adapters' index on them"),
    ("verl-routing-prscale", "PR #7435's scale"),
    ("verl-routing-groups-prscale", "group pins at PR #7435's scale"),
    ("verl-routing-prefix-prscale", "prefix placement at PR #7435's scale"),
    ("verl-routing-prefix-index-prscale",
     "prefix placement fed the adapters' index at PR #7435's scale"),
)


def verl_routing_runs() -> str:
    """What the runs behind docs/verl-routing.md's column were: steps, seeds, time."""
    parts = []
    for name, what in VERL_ROUTING_RUNS:
        record = _sim(name)
        seeds = record["seeds"]
        workloads = sorted({r["workload"] for r in record["results"]})
        policies = list(dict.fromkeys(r["policy"] for r in record["results"]))
        parts.append(f"{what}: {len(record['results']):,} steps ({len(workloads)} workloads x "
                     f"{len(policies)} policies x seeds {min(seeds)}–{max(seeds)}), "
                     f"{record['elapsed_s']:.0f} s wall on {record['backend']} "
                     f"(`sim/{name}.json`)")
    return "Runs: " + "; ".join(parts) + "."


def verl_routing_prediction(suffix: str = "") -> Callable[[], str]:
    def render() -> str:
        from affinity_sim import verl_routing
        records, claims = _verl_routing()
        return verl_routing.prediction_table(records, claims[suffix])
    return render


def verl_routing_acceptance(policy: str) -> Callable[[], str]:
    """Prefix placement in the band against margin 2 and #6122, paired seed by seed."""
    def render() -> str:
        from affinity_sim import verl_routing
        records, _ = _verl_routing()
        return verl_routing.acceptance_table(records["calibrated"], policy,
                                             ("margin-2", "group-only"))
    return render


def package_lines() -> str:
    """The sizes of the reference and the engine, counted from the source tree."""
    def lines(package: str) -> int:
        return sum(len(path.read_text(encoding="utf-8").splitlines())
                   for path in sorted((ROOT / package).glob("*.py")))

    return (f"`affinity_core` {lines('affinity_core'):,} lines, "
            f"`affinity_engine` {lines('affinity_engine'):,} lines")


def inner_loop_timing() -> str:
    """``make check``'s recorded timing (scripts/time_inner_loop.py)."""
    record = _json("docs/inner-loop.json")["make_check"]
    steps = "; ".join(f"{s['step']} {s['seconds']:.0f} s" for s in record["steps"])
    return (f"{record['seconds']:.0f} s wall on {record['cpus']} CPUs ({steps}; load average "
            f"{record['steps'][0]['load_average_before']:.2f} before, "
            f"{record['load_average_after']:.2f} after; Python {record['python']}; "
            f"`docs/inner-loop.json`)")


RENDERERS: dict[str, Callable[[], str]] = {
    "packages.lines": package_lines,
    "inner-loop.timing": inner_loop_timing,
    "verify.obligations": verify_obligation_count,
    "verify.summary": verify_summary,
    "verify.config-cases": verify_config_cases,
    "verify.event-values": verify_event_values,
    "verify.decision-acquires": verify_decision_acquires,
    "verify.obligations-table": verify_obligations_table,
    "verify.all-n-lemmas": verify_all_n_lemmas,
    "vectors.total": vectors_total,
    "vectors.cases": vectors_cases,
    "vectors.node": node_consumer_support,
    "vectors.node.replayed": node_consumer_replayed,
    "audit.catalogue": audit_catalogue,
    "audit.rates": audit_rates,
    "audit.survivors": audit_survivors,
    "bench.core": bench_core_table,
    "bench.core-full": bench_core_full,
    "bench.core-runs": bench_core_runs,
    "bench.lru": bench_lru_table,
    "bench.router": bench_router_table,
    "bench.router-overhead": bench_router_overhead,
    "bench.router-overhead-runs": bench_router_overhead_runs,
    "bench.compare-routers": bench_compare_routers,
    "sim.margin2-at-pr-scale": sim_margin2_at_pr_scale,
    **{f"sim.prscale.{t}": _prscale(t) for t in (
        "prediction", "policies", "ablation", "context-per-request", "replication",
        "dispersion", "step-size", "turns", "pool")},
    "sim.band.policies": _band("policies", "context-band"),
    "sim.band.head-to-head": _band("head-to-head", "context-band"),
    "sim.band-prscale.policies": _band("policies", "context-band-prscale"),
    "sim.band-prscale.head-to-head": _band("head-to-head", "context-band-prscale"),
    "sim.band-reuse.policies": _band("policies", "context-band-reuse"),
    "sim.band-reuse.head-to-head": _band("head-to-head", "context-band-reuse",
                                         "band-m1-T8192-cap4-reuse"),
    "sim.band-reuse.regret": _band("regret", "context-band-reuse"),
    **{f"verl-routing.prediction{suffix}": verl_routing_prediction(suffix)
       for suffix in VERL_ROUTING_PREDICTIONS},
    "verl-routing.prefix-acceptance": verl_routing_acceptance("prefix-p2-margin-2"),
    "verl-routing.prefix-index-acceptance": verl_routing_acceptance("prefix-p2-margin-2-index"),
    "verl-routing.runs": verl_routing_runs,
}


def vectors_suite(suite: str) -> str:
    suites = _json("spec/vectors/MANIFEST.json")["suites"]
    if suite not in suites:
        raise RenderError(f"spec/vectors/MANIFEST.json has no suite {suite!r}")
    return str(suites[suite])


# Renderers that take the rest of the region's name as their argument.
PREFIX_RENDERERS: dict[str, Callable[[str], str]] = {"vectors.suite.": vectors_suite,
                                                    "verl-routing.column.": verl_routing_column}


def _renderer(name: str, where: str) -> Callable[[], str]:
    if name in RENDERERS:
        return RENDERERS[name]
    for prefix, render in PREFIX_RENDERERS.items():
        if name.startswith(prefix):
            return lambda: render(name.removeprefix(prefix))
    raise RenderError(f"{where}: region {name!r} names no renderer; known: "
                      f"{', '.join(sorted([*RENDERERS, *(p + '*' for p in PREFIX_RENDERERS)]))}")


def render_text(text: str, where: str = "") -> str:
    """``text`` with every region's content replaced by its renderer's output."""
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        out = _renderer(name, where)().strip("\n")
        body = f"\n{out}\n" if "\n" in out else out
        return f"<!-- render:{name} -->{body}<!-- /render -->"
    return REGION.sub(replace, text)


# ------------------------------------------------------------------ requirement ids

_HEADING = re.compile(r"^(#{2,3}) (.+)$")
_DEFINITION = re.compile(r"^[ \t]*[-*][ \t]+\*\*(R-[A-Z]+-[0-9]+)\*\*[ \t]*(.*)$")


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    # a sentence ends at a full stop before a space; "e.g." and "i.e." do not end one
    end = re.search(r"(?<!e\.g)(?<!i\.e)\.(\s|$)", text)
    sentence = text[:end.start() + 1] if end else text
    if ": - " in sentence:  # a list follows: name its start only
        sentence = sentence.split(": - ")[0] + ": ..."
    return sentence if len(sentence) <= 200 else sentence[:197].rsplit(" ", 1)[0] + " ..."


def requirement_ids() -> str:
    """docs/requirement-ids.md: every id SPEC.md defines, under its section, with the
    start of its definition."""
    lines = ["# Requirement ids", "",
             "<!-- generated by scripts/render_docs.py from spec/SPEC.md; do not edit -->", "",
             "Every requirement id [spec/SPEC.md](../spec/SPEC.md) defines, in its order, "
             "with the first", "sentence of its definition (SPEC.md is normative). Tests, "
             "proofs and vectors cite an id", "by writing it literally (e.g. `R-LRU-1`); "
             "`tests/test_spec_coverage.py` fails when an id", "is cited nowhere."]
    section = ""
    spec = (ROOT / "spec" / "SPEC.md").read_text(encoding="utf-8").splitlines()
    current: list[str] | None = None
    entries: list[tuple[str, str, list[str]]] = []
    for line in spec:
        heading = _HEADING.match(line)
        definition = _DEFINITION.match(line)
        if heading:
            section, current = heading.group(2).strip(), None
        elif definition:
            current = [definition.group(2)]
            entries.append((section, definition.group(1), current))
        elif current is not None and line.startswith("  ") and line.strip():
            current.append(line)
        else:
            current = None
    shown = ""
    for section_name, rid, text in entries:
        if section_name != shown:
            lines += ["", f"## {section_name}", ""]
            shown = section_name
        lines.append(f"- {rid} {_first_sentence(' '.join(text))}")
    return "\n".join(lines) + "\n"


GENERATED: dict[str, Callable[[], str]] = {"docs/requirement-ids.md": requirement_ids}


def check() -> list[str]:
    """The files whose committed text differs from their rendering (nothing written)."""
    stale = []
    for rel in RENDERED:
        text = (ROOT / rel).read_text(encoding="utf-8")
        if render_text(text, rel) != text:
            stale.append(rel)
    for rel, generate in GENERATED.items():
        path = ROOT / rel
        if not path.exists() or path.read_text(encoding="utf-8") != generate():
            stale.append(rel)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/render_docs.py", description=(
        "Render the numbers in the READMEs from the committed data files."))
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming every file that is not rendered")
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = check()
            for rel in stale:
                print(f"stale: {rel} (run python scripts/render_docs.py)", file=sys.stderr)
            return 1 if stale else 0
        for rel in RENDERED:
            path = ROOT / rel
            text = path.read_text(encoding="utf-8")
            new = render_text(text, rel)
            if new != text:
                path.write_text(new, encoding="utf-8")
                print(f"rendered {rel}")
        for rel, generate in GENERATED.items():
            (ROOT / rel).write_text(generate(), encoding="utf-8")
    except (RenderError, OSError, KeyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
