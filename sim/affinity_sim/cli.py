"""``affinity simulate``: run a sweep, print the paired table, save JSON and PNG.

Theory of operation
-------------------
The command resolves ``--preset`` (a built-in name or a TOML/YAML file) into a
:class:`~affinity_sim.sweep.Sweep`, applies the overrides (seeds, policies, workloads),
runs it with :func:`~affinity_sim.sweep.run_sweep` behind a progress bar, summarizes with
:func:`~affinity_sim.stats.summarize` and renders with :mod:`affinity_sim.report`.
Bad input (unknown preset, policy or workload, malformed file, an output path that
cannot be written, a malformed Ray address) exits with status 2 and a message naming the
value and what is accepted -- before the sweep runs, so nothing is lost to a bad path.
Exit status 0: the sweep ran (and was saved unless ``--no-save``).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from affinity_cli.paths import file_problem

from .presets import CAVEATS, PRESETS, RAY_FREE_PRESETS, load_sweep, preset
from .report import FIGURE_SUFFIXES, render_tables, run_record, write_json, write_png
from .routing import DEFAULT_POLICIES, parse_policies
from .stats import summarize
from .sweep import Sweep, run_sweep

__all__ = ["register", "run"]


MAX_WORKERS = 1024
MAX_SEEDS = 100_000
MAX_REPLICAS = 65_536
MAX_TRAJECTORIES = 1_000_000  # prompts x samples in one step (PR #7435's scale is 8,192)


def _csv(text: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return items


def _address_problem(address: str) -> str | None:
    """Why ``address`` is not a Ray address (``auto``, ``HOST:PORT``, ``ray://HOST:PORT``)."""
    if address == "auto":
        return None
    try:
        parts = urlsplit(address if "://" in address else f"ray://{address}")
        port = parts.port
    except ValueError:
        port, parts = None, urlsplit("")
    if not (parts.scheme in ("ray", "http", "https") and parts.hostname and port):
        return (f"--address {address!r} is not a Ray address; accepted: auto, HOST:PORT or "
                "ray://HOST:PORT with a port in [1, 65535]")
    try:  # Ray itself retries a dead address for minutes before it gives up
        socket.create_connection((parts.hostname, port), timeout=5).close()
    except OSError as exc:
        return f"--address {address!r}: cannot connect to {parts.hostname}:{port}: " \
               f"{exc.strerror or exc}"
    return None


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Discrete-event simulation of rollout generation steps, routed through the real "
        "affinity_engine. Every policy replays the same seeded trajectories; the table shows "
        "the paired median change of step time against the legacy (margin null) balancer."
    )
    parser.add_argument(
        "--preset", default="pr7435", metavar="NAME|FILE",
        help=f"built-in sweep ({', '.join(PRESETS)}) or a .toml/.yaml workload file "
             "(default: pr7435, PR #7435's four workloads with calibrated pools, which "
             "overstate the gain 2-5x, a caveat printed with its results; "
             "pr7435-scale: the same rows at 512 x 16 trajectories with the pool derived "
             "from the model, predicted; pr7435-scale-ablation: one modelled feature "
             "removed at a time; pr7435-scale-context-per-request, -dispersion, "
             "-step-size, -turns and -pool: sensitivity runs; pr7435-scale-replication: "
             "their explaining cells on 100 fresh seeds)")
    parser.add_argument("--seeds", type=int, default=None, metavar="N",
                        help="seeds per workload, 1..100000 (paired; default: the preset's: "
                             "30 for pr7435, 10 for pr7435-scale and its sensitivity runs, 3 "
                             "for its ablation, 100 for its replication)")
    parser.add_argument("--first-seed", type=int, default=None, metavar="N",
                        help="first seed (default: the preset's: 0; 3000 for "
                             "pr7435-scale-replication)")
    parser.add_argument(
        "--policies", type=_csv, default=None, metavar="P1,P2,...",
        help="comma-separated policies: legacy, legacy-first|draw|hashed (margin null "
             "with that tie rule, whatever the workload's), margin-N, dual-ABS[-REL], "
             "band-mM-TT-capC (the context band; -reuse: fed observed reuse), group-only "
             "(PR #6122's group pins), group-margin-N (group pins inside margin N), "
             "prefix-pP-margin-N (prefix-aware placement within min+P, margin N), "
             "prefix-pP-group-margin-N (both; -index: fed the adapters' index), least-loaded "
             f"(default: the preset's, normally {','.join(DEFAULT_POLICIES)}); legacy is "
             "always added as the baseline")
    parser.add_argument("--workloads", type=_csv, default=None, metavar="W1,W2,...",
                        help="run only these workloads of the preset")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="parallel workers, 1..1024 (default: CPU count; 1 runs in-process)")
    parser.add_argument("--address", default=None, metavar="ADDR",
                        help="Ray cluster address to join (default: a local Ray cluster "
                             "when Ray is installed, except for the smoke preset)")
    parser.add_argument("--no-ray", action="store_true",
                        help="use a process pool even when Ray is installed (always so for "
                             f"{', '.join(RAY_FREE_PRESETS)} unless --address is given)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="where to save the run record (default: affinity-sim-<preset>.json)")
    parser.add_argument("--png", default=None, metavar="PATH",
                        help="where to save the figure (default: affinity-sim-<preset>.png)")
    parser.add_argument("--no-save", action="store_true", help="write neither JSON nor PNG")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(run=run)


def _resolve(args: argparse.Namespace) -> Sweep:
    name: str = args.preset
    sweep = load_sweep(name) if name.endswith((".toml", ".yaml", ".yml")) else preset(name)
    changes: dict[str, Any] = {}
    if args.seeds is not None:
        changes["seeds"] = args.seeds
    if args.first_seed is not None:
        changes["first_seed"] = args.first_seed
    if args.policies is not None:
        changes["policies"] = tuple(parse_policies(args.policies))
    if args.workloads is not None:
        known = {w.name: w for w in sweep.workloads}
        unknown = [w for w in args.workloads if w not in known]
        if unknown:
            raise ValueError(f"unknown workloads {unknown} for preset {sweep.name!r}; "
                             f"accepted: {', '.join(known)}")
        changes["workloads"] = tuple(known[w] for w in args.workloads)
    return attrs.evolve(sweep, **changes) if changes else sweep


def _fail(message: str) -> int:
    print(f"affinity simulate: {message}", file=sys.stderr)  # unwrapped, unstyled
    return 2


def run(args: argparse.Namespace) -> int:
    out = Console()
    if not out.is_terminal:
        out = Console(width=150)  # a log or a README: do not wrap the table at 80 columns
    err = Console(stderr=True)
    if args.workers is not None and args.workers < 1:
        return _fail(f"--workers must be >= 1, got {args.workers}")
    # Upper bounds: a huge value would start that many local Ray workers or build that
    # many tasks in memory before the first step runs; past these, split the sweep.
    if args.workers is not None and args.workers > MAX_WORKERS:
        return _fail(f"--workers must be in [1, {MAX_WORKERS}], got {args.workers}")
    if args.seeds is not None and args.seeds > MAX_SEEDS:
        return _fail(f"--seeds must be in [1, {MAX_SEEDS}], got {args.seeds}")
    if args.no_save and (args.json or args.png):
        return _fail(f"--{'json' if args.json else 'png'} names a file to write; it cannot go "
                     "with --no-save")
    if args.address is not None and args.no_ray:
        return _fail(f"--address {args.address!r} joins a Ray cluster; it cannot go with "
                     "--no-ray")
    if args.address is not None and _address_problem(args.address):
        return _fail(str(_address_problem(args.address)))
    try:
        sweep = _resolve(args)
    except ValueError as exc:
        return _fail(str(exc))
    # A workload file can ask for any size; these are refused here, not after the plan or
    # the first step has filled memory.
    if sweep.seeds > MAX_SEEDS:
        return _fail(f"seeds must be in [1, {MAX_SEEDS}], got {sweep.seeds}")
    for w in sweep.workloads:
        if w.replicas > MAX_REPLICAS:
            return _fail(f"workload {w.name!r}: replicas must be in [1, {MAX_REPLICAS}], "
                         f"got {w.replicas}")
        if w.prompts * w.samples > MAX_TRAJECTORIES:
            return _fail(f"workload {w.name!r}: prompts x samples must be at most "
                         f"{MAX_TRAJECTORIES:,}, got {w.prompts} x {w.samples}")
    json_path = args.json or f"affinity-sim-{sweep.name}.json"
    png_path = args.png or f"affinity-sim-{sweep.name}.png"
    if not args.no_save:  # checked now, not after the sweep has run for minutes
        if Path(png_path).suffix not in FIGURE_SUFFIXES:
            return _fail(f"--png {png_path!r}: the figure's file name must end in "
                         f"{', '.join(FIGURE_SUFFIXES)}")
        for option, path in (("--json", json_path), ("--png", png_path)):
            why = file_problem(Path(path))
            if why is not None:
                return _fail(f"{option}: {why}")
    workers = args.workers or os.cpu_count() or 1
    use_ray = not args.no_ray and (args.address is not None
                                   or sweep.name not in RAY_FREE_PRESETS)
    caveat = CAVEATS.get(args.preset)
    if caveat:
        err.print(f"[yellow]caveat:[/] {caveat}", highlight=False)
    simulations = len(sweep.workloads) * len(sweep.policies) * sweep.seeds
    out.print(f"[bold]{sweep.name}[/]: {len(sweep.workloads)} workloads x "
              f"{len(sweep.policies)} policies x {sweep.seeds} seeds = {simulations} simulated "
              f"steps")
    start = time.perf_counter()
    with Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=True,
                  disable=args.no_progress) as bar:
        task = bar.add_task("steps", total=len(sweep.workloads) * sweep.seeds)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        try:
            results, backend = run_sweep(sweep, workers=workers, use_ray=use_ray,
                                         address=args.address, progress=progress)
        except RuntimeError as exc:
            return _fail(str(exc))
    elapsed = time.perf_counter() - start
    summaries = summarize(results)
    render_tables(out, sweep, summaries)
    if caveat:  # right under the numbers it qualifies, on stdout with them
        out.print(f"[bold yellow]caveat:[/] {caveat}", highlight=False)
    out.print(f"{simulations} steps in {elapsed:.1f} s on {backend} "
              f"({elapsed * min(workers, len(sweep.workloads) * sweep.seeds) / simulations:.2f}"
              f" worker-s per step)")
    if not args.no_save:
        meta: dict[str, Any] = {"backend": backend, "elapsed_s": round(elapsed, 2),
                                "workers": workers}
        if caveat:
            meta["caveat"] = caveat
        write_json(json_path, run_record(sweep, summaries, results, meta))
        write_png(png_path, sweep, summaries)
        out.print(f"saved {json_path} and {png_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="affinity simulate")
    register(parser)
    args = parser.parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
