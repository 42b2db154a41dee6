"""``affinity check IMPL``: is this balancer class a conforming implementation?

The report gives one verdict per conformance level (core, the feature levels,
strict-config; :mod:`affinity_conformance.levels`), then the per-suite detail and each
failure's shrunk diagnosis.

Exit status: 0 every claimed level passes (``--level``, by default core and the supported
feature levels), 1 a claimed level fails or is unsupported (or the implementation calls
``sys.exit`` while checked), 2 bad input (IMPL, vectors or options), with a one-line
message and no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from affinity_cli.paths import output_dir

from .check import DEFAULT_VECTORS, TRACE_LENGTH, CheckReport, run_check
from .impl_loader import CONVENTIONS, ImplError
from .levels import LEVELS, STRICT_CONFIG, level_words
from .vector_format import SUITES, VectorError

__all__ = ["FAILURES_SHOWN", "MAX_BUDGET", "MAX_LENGTH", "int_at_least", "int_in", "register",
           "render"]

FAILURES_SHOWN = 3  # per suite in the text report
# Upper bounds: traces and the trace plan are built in memory, so a huge value would
# exhaust memory before the first event instead of failing with a message.
MAX_BUDGET = 100_000
MAX_LENGTH = 100_000

_TIE_HELP = ("first: ties must go to the first least-loaded server in pool order (exact, "
             "step for step); any: the implementation breaks ties its own way (e.g. verl "
             "0.9.1's random.choice); each choice must be allowed by the spec and is fed "
             "back to the reference (refinement, R-REL-2)")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("impl", metavar="IMPL",
                        help="module:Class or module:factory (or path/to/file.py:Class) with "
                             "verl's balancer API")
    parser.add_argument("--tie-break", choices=("first", "any"), default="any", help=_TIE_HELP)
    parser.add_argument("--budget", type=int_in(0, MAX_BUDGET), default=200, metavar="N",
                        help=f"generated random traces after the vectors, 0..{MAX_BUDGET} "
                             "(default 200)")
    parser.add_argument("--seed", type=int, default=1,
                        help="seed of the first generated trace (default 1; printed)")
    parser.add_argument("--length", type=int_in(1, MAX_LENGTH), default=TRACE_LENGTH,
                        metavar="N", help=f"events per generated trace, 1..{MAX_LENGTH} "
                                          f"(default {TRACE_LENGTH})")
    parser.add_argument("--ctor", choices=CONVENTIONS, default="auto",
                        help="constructor convention: verl (servers=, max_cache_size=, "
                             "full_determinism=), pr7435 (+ affinity_break_margin=), kwargs "
                             "(+ every option it accepts), yaml (servers, {router_class, ...}); "
                             "auto tries kwargs, then yaml")
    parser.add_argument("--vectors", type=Path, default=DEFAULT_VECTORS, metavar="DIR",
                        help=f"vector directory (default: the shipped vectors, {DEFAULT_VECTORS})")
    parser.add_argument("--suite", action="append", choices=SUITES, metavar="SUITE",
                        help="check only this suite (repeatable)")
    parser.add_argument("--out", type=output_dir, default=None, metavar="DIR",
                        help="where minimal failing traces are written as vectors (default: a "
                             "fresh temporary folder, printed when something is written)")
    parser.add_argument("--level", action="append", choices=LEVELS, metavar="LEVEL",
                        help="claim this conformance level (repeatable; one of "
                             f"{', '.join(LEVELS)}); the exit status is 0 iff every claimed "
                             "level passes. Default: core and every feature level the class "
                             f"supports; {STRICT_CONFIG} (the spec's extra refusals, SPEC "
                             "§18) is reported but claimed only when named")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(run=run)


def int_at_least(lowest: int) -> Callable[[str], int]:
    """An argparse type for integers >= ``lowest``; the error names the value and the range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {lowest}, got {text!r}") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lowest}, got {value}")
        return value

    return parse


def int_in(lowest: int, highest: int) -> Callable[[str], int]:
    """An argparse type for integers in [lowest, highest], named in the error."""
    at_least = int_at_least(lowest)

    def parse(text: str) -> int:
        value = at_least(text)
        if value > highest:
            raise argparse.ArgumentTypeError(
                f"expected an integer in [{lowest}, {highest}], got {value}")
        return value

    return parse


def run(args: argparse.Namespace) -> int:
    fresh = args.out is None
    out = Path(tempfile.mkdtemp(prefix="affinity-check-failures-")) if fresh else args.out
    try:
        report = run_check(args.impl, vectors_dir=args.vectors, tie_mode=args.tie_break,
                           budget=args.budget, seed=args.seed, ctor=args.ctor,
                           out_dir=out, trace_length=args.length, suites=args.suite,
                           levels=args.level)
    except (ImplError, VectorError) as exc:
        print(f"affinity check: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:
        # The implementation tried to end the process (a sys.exit(0) would read as a
        # pass to CI): that is the implementation failing, not a verdict.
        print(f"affinity check: IMPL {args.impl!r} called sys.exit({exc.code!r}) while "
              "being checked; a balancer must not exit the process", file=sys.stderr)
        return 1
    finally:
        if fresh and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # nothing failed: leave no empty temporary folder behind
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        print(render(report))
        written = [f.vector_path for r in report.suites.values() for f in r.failures
                   if f.vector_path and Path(f.vector_path).parent == out]
        if written:
            print(f"{len(written)} minimal failing traces written as vectors to {out}"
                  + (" (a fresh temporary folder; --out DIR to choose)" if fresh else ""))
    return 1 if report.verdict == "fail" else 0


def render(report: CheckReport) -> str:
    """The human-readable report."""
    lines = [
        f"affinity check {report.impl}",
        f"  constructor: {report.convention}; features: {', '.join(report.features) or 'none'}",
        f"  tie-break: {report.tie_mode}; vectors: {report.vectors_dir}; generated traces: "
        f"{report.budget} (seed {report.seed})",
        "",
        f"  {'level':<18}{'claimed':<9}{'vectors p/f/u':<16}{'traces p/f':<13}verdict",
    ]
    for name, level in report.levels.items():
        cases = f"{level.passed}/{level.failed}/{level.unsupported}"
        traces = (f"{level.traces_passed}/{level.traces_failed}"
                  if level.traces_passed or level.traces_failed else "-")
        claimed = "yes" if name in report.claimed else "no"
        lines.append(f"  {name:<18}{claimed:<9}{cases:<16}{traces:<13}"
                     f"{level_words(level, report.tie_mode)}")
    lines += [
        "",
        f"  {'suite':<16}{'verdict':<13}{'vectors p/f/u':<16}{'traces p/f':<13}"
        "unsupported: needs",
    ]
    for name, r in report.suites.items():
        if not (r.passed or r.failed or r.unsupported or r.traces_passed or r.traces_failed):
            continue
        verdict = r.verdict.upper() if r.verdict == "fail" else r.verdict
        if r.failures and not r.traces_failed and all(f.strict_config for f in r.failures):
            verdict = "deviates"  # only strict-config refusals (SPEC section 18)
        cases = f"{r.passed}/{r.failed}/{r.unsupported}"
        traces = (f"{r.traces_passed}/{r.traces_failed}"
                  if r.traces_passed or r.traces_failed else "-")
        needs = ", ".join(sorted(r.missing))
        lines.append(f"  {name:<16}{verdict:<13}{cases:<16}{traces:<13}{needs}".rstrip())
    for r in report.suites.values():
        for failure in r.failures[:FAILURES_SHOWN]:
            lines += ["", *failure.render()]
        hidden = len(r.failures) - FAILURES_SHOWN
        if hidden > 0:
            lines += ["", f"... and {hidden} more {r.suite} failures (--json lists all)"]
    lines += ["", _verdict_line(report)]
    return "\n".join(lines)


def _verdict_line(report: CheckReport) -> str:
    """E.g. ``verdict: pass -- core: pass (random ties); strict-config (not claimed): 6
    deviations (SPEC §18)``."""
    words = [f"{name}: {level_words(report.level(name), report.tie_mode)}"
             for name in report.claimed]
    unclaimed = [f"{name} (not claimed): {level_words(r, report.tie_mode)}"
                 for name, r in report.levels.items()
                 if name not in report.claimed and r.verdict == "fail"]
    head = "pass" if report.verdict == "pass" else "FAIL"
    return (f"verdict: {head} -- " + "; ".join(words + unclaimed)
            + f" (in {report.seconds:.1f}s)")
