"""``affinity check-router``: black-box conformance of an HTTP router against the spec.

Exit status: 0 every trace conforms, 1 some trace diverged (each divergence shrunk,
explained and written as a vector), 2 bad input or the router could not be started (or,
with ``--url``, nothing answers there), with a one-line message and no traceback.
"""

from __future__ import annotations

import argparse
import json
import shlex
import socket
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import attrs

from affinity_cli.paths import output_dir
from affinity_conformance.cli_check import int_at_least, int_in

from .claims import CLAIM_FORMS, ClaimError, parse_claim
from .presets import (
    DEFAULT_ROUTERS_VENV,
    PRESETS,
    ROUTER_PACKAGES,
    Preset,
    PresetError,
    ensure_routers_venv,
    parse_template,
    routers_available,
)
from .runner import CheckOptions, RouterReport, run_sync
from .trace import TraceShape

__all__ = ["MAX_BACKENDS", "URL_PATIENCE", "register", "render", "run"]

MAX_BACKENDS = 64  # the recording fleet's limit (RecordingFleet)
URL_PATIENCE = 10.0  # seconds a refused --url is retried (the router may still be binding)

EPILOG = f"""\
presets (--preset):
{chr(10).join(f"  {p.name:<34}{p.about}; claim {p.claim}" for p in PRESETS.values())}

examples:
  affinity check-router --preset affinity --policy margin=2
  affinity check-router --preset affinity --router-extra='--margin 0' --policy margin=2
  # the context band (SPEC 7.5): margin 0, T = 16 tokens, cap 3; prompts of c token ids
  affinity check-router --preset affinity --policy band=0,16,3
  affinity check-router --preset vllm-router:sticky_least_loaded --policy legacy
  affinity check-router --router-cmd 'my-router --port {{port}} --workers {{backends}}' \\
      --session-header x-session-id --policy margin=1
  # a router you run yourself, in front of the fleet's fixed ports 18001-18003:
  affinity check-router --url http://127.0.0.1:8080 --fleet-ports 18001,18002,18003 \\
      --session-header x-session-id --policy legacy

A band claim (band=M,T,CAP) makes every acquire's prompt a list of c token ids, c in
[0, 6T) around multiples of T (--context-step), so the router can count c exactly; the
affinity preset then passes --affinity-break-tokens T --affinity-break-band-cap CAP to
affinity serve. vllm-router and sglang-router have no context band.

The Rust routers are installed into --routers-venv ({' '.join(ROUTER_PACKAGES)}) with
--install-routers. Findings for them: docs/check-router.md in Affinity's source
repository.
"""


def register(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = (
        "Check an HTTP router against the spec, black-box: start it in front of a fleet of "
        "recording stub backends that hold every request until the harness completes it, "
        "drive it with seeded traces of acquires (requests with a session key), releases "
        "(completions, ok or failed, streamed or not) and pool changes where the router has "
        "an API for them, and feed what arrives where to the reference core in refinement "
        "mode (R-REL-2). Divergences are shrunk, explained with requirement ids and written "
        "as vector files.")
    parser.epilog = EPILOG
    which = parser.add_argument_group("router under test (one of)")
    which.add_argument("--preset", choices=sorted(PRESETS), metavar="NAME",
                       help="a known router: " + ", ".join(sorted(PRESETS)))
    which.add_argument("--router-cmd", metavar="TEMPLATE",
                       help="command with {port} and {backends} (one argument per backend URL) "
                       "or {backend} inside an argument (repeated per backend); also "
                       "{metrics_port}, {python}, {routers}, {margin}, {cache_size}, "
                       "{band_tokens}, {band_cap} (the claimed band's T and CAP, or none)")
    which.add_argument("--url", metavar="URL", type=_url,
                       help="attach to a running router instead (never restarted); its "
                       "backends must be the fleet's --fleet-ports, in pool order")
    parser.add_argument("--fleet-ports", type=_ports, default=(), metavar="P1,P2,...",
                        help="bind the stub backends to these 127.0.0.1 ports (needed with "
                        "--url; default: free ports)")
    parser.add_argument("--router-extra", default="", metavar="ARGS",
                        help="extra arguments appended to the router command, written "
                        "--router-extra='ARGS', e.g. --router-extra='--margin 0' or "
                        "--router-extra=--disable-circuit-breaker")
    parser.add_argument("--policy", metavar="CLAIM",
                        help=f"the policy the router claims: {CLAIM_FORMS} (default: the "
                        "preset's claim); band=M,T,CAP is the context band of SPEC 7.5: keep a "
                        "pin iff load <= min + min(M + c // T, CAP), c the prompt's tokens")
    parser.add_argument("--session-header", metavar="NAME",
                        help="header carrying the session key (default: the preset's, else "
                        "x-session-id)")
    parser.add_argument("--cache-size", type=_positive, default=10000, metavar="N",
                        help="claimed sticky-map capacity (default 10000, verl's); the "
                        "affinity preset passes it to affinity serve as --cache-size")
    traces = parser.add_argument_group("traces")
    traces.add_argument("--budget", type=int_in(1, 10_000), default=5, metavar="N",
                        help="seeded traces to run, 1..10000 (default 5)")
    traces.add_argument("--seed", type=int, default=1, help="seed of the first trace (default 1)")
    traces.add_argument("--length", type=int_in(1, 10_000), default=24, metavar="N",
                        help="ops per trace, 1..10000 (default 24)")
    traces.add_argument("--backends", type=int_in(1, MAX_BACKENDS), default=3, metavar="N",
                        help=f"stub backends in the fleet, 1..{MAX_BACKENDS} (default 3)")
    traces.add_argument("--sessions", type=int_in(1, 10_000), default=4, metavar="N",
                        help="distinct session keys per trace, 1..10000 (default 4)")
    traces.add_argument("--context-step", type=_non_negative, default=None, metavar="T",
                        help="send each acquire's prompt as c token ids, c in [0, 6T) around "
                        "multiples of T, and give c to the core as context_tokens (default: "
                        "the claimed band's T, else 0 = text prompts without c); with a "
                        "margin claim this checks that the router applies no unclaimed band")
    traces.add_argument("--no-streams", action="store_true", help="send no streamed requests")
    traces.add_argument("--no-failures", action="store_true",
                        help="complete every request normally (no HTTP 500s, no cut streams)")
    traces.add_argument("--no-pool-changes", action="store_true",
                        help="never remove or re-add backends (they are driven only where the "
                        "router has an admin API)")
    traces.add_argument("--pool-percent", type=_percent, default=8, metavar="P",
                        help="chance per op of a pool change, where driven (default 8)")
    timing = parser.add_argument_group("timing discipline")
    timing.add_argument("--settle", type=_seconds, default=None, metavar="SECONDS",
                        help="fixed settle delay after each completion (default: calibrated, "
                        "max(50 ms, 10 x the router's median round trip))")
    timing.add_argument("--settle-factor", type=_factor, default=1.0, metavar="F",
                        help="multiply every settle delay and poll timeout by F; a run with 2 "
                        "must give the same verdict (default 1)")
    shrink = parser.add_argument_group("shrinking and output")
    shrink.add_argument("--shrink-runs", type=_positive, default=40, metavar="N",
                        help="at most N re-runs to shrink one failure (default 40)")
    shrink.add_argument("--max-failures", type=_positive, default=3, metavar="N",
                        help="shrink at most N distinct kinds of failure (default 3)")
    shrink.add_argument("--out", type=output_dir, default=None, metavar="DIR",
                        help="where minimal traces (vector files) and the router log go, "
                        "kept whatever the verdict (default: a new temporary directory, "
                        "printed and kept when the check fails, removed when it passes)")
    shrink.add_argument("--json", action="store_true", help="print the report as JSON")
    env = parser.add_argument_group("environment")
    env.add_argument("--routers-venv", type=_absolute_path, default=DEFAULT_ROUTERS_VENV,
                     metavar="DIR",
                     help="venv holding vllm-router / sglang-router, relative to the current "
                          f"directory (default: {DEFAULT_ROUTERS_VENV})")
    env.add_argument("--install-routers", action="store_true",
                     help=f"create --routers-venv with {' '.join(ROUTER_PACKAGES)} if missing")
    parser.set_defaults(run=run)


_positive = int_at_least(1)


def _absolute_path(text: str) -> Path:
    # The router runs in another working directory: a relative venv would be looked up
    # there (it installed fine, then the router "did not exist").
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return Path(text).expanduser().absolute()
_non_negative = int_at_least(0)


def _ports(text: str) -> tuple[int, ...]:
    try:
        ports = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ports like 18001,18002, got {text!r}") \
            from None
    bad = [p for p in ports if not 1 <= p <= 65535]
    if bad or len(set(ports)) != len(ports) or len(ports) > MAX_BACKENDS:
        raise argparse.ArgumentTypeError(f"expected 1..{MAX_BACKENDS} distinct ports in "
                                         f"[1, 65535], got {text!r}")
    return ports


def _url(text: str) -> str:
    """An http(s) URL with a host and a port in [1, 65535] (checked before any wait)."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        port, parts = -1, urlsplit("")
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1 or (
            port is not None and not 1 <= port <= 65535):
        raise argparse.ArgumentTypeError(
            f"expected an http(s) URL like http://127.0.0.1:8080 (port in [1, 65535]), "
            f"got {text!r}")
    return text


def _reachable(url: str) -> None:
    """Fail in seconds, not after the 60 s probe wait, when nothing listens at ``url``
    (a refused connection is retried for :data:`URL_PATIENCE` s: a router started just
    before this command may not have bound its port yet)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    deadline = time.monotonic() + URL_PATIENCE
    while True:
        try:
            socket.create_connection((parts.hostname, port), timeout=5).close()
            return
        except ConnectionRefusedError as exc:
            if time.monotonic() >= deadline:
                why = exc.strerror
                break
            time.sleep(0.2)
        except OSError as exc:
            why = exc.strerror or str(exc)
            break
    raise PresetError(f"--url {url}: cannot connect to {parts.hostname}:{port}: {why}")


def _percent(text: str) -> int:
    value = int_at_least(0)(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"expected a percentage in [0, 100], got {value}")
    return value


def _float_in(text: str, low: float, high: float, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value:g}")
    return value


def _seconds(text: str) -> float:
    return _float_in(text, 0.0, 10.0, "seconds in [0, 10]")


def _factor(text: str) -> float:
    return _float_in(text, 1.0, 20.0, "a factor in [1, 20]")


def _preset(args: argparse.Namespace) -> Preset:
    given = [args.preset is not None, args.router_cmd is not None, args.url is not None]
    if args.url is not None and args.preset is not None:
        given[0] = False  # --url with --preset: the preset supplies header and claim
    if sum(given) != 1:
        raise PresetError("give exactly one of --preset NAME, --router-cmd TEMPLATE and --url")
    if args.url is not None:
        if not args.fleet_ports:
            raise PresetError("--url needs --fleet-ports (the ports the router's backends are "
                              "on, in pool order)")
        if args.router_extra:  # nothing is started with --url, so they would be ignored
            raise PresetError(f"--router-extra {args.router_extra!r} cannot go with --url (the "
                              "router is already running; pass its options where it starts)")
        if args.preset is None and args.policy is None:
            raise PresetError("--url needs --policy (what the router claims to implement)")
        if args.preset is not None:
            return attrs.evolve(PRESETS[args.preset], settle="delay", pool=None,
                                needs_routers_venv=False,
                                session_header=args.session_header
                                or PRESETS[args.preset].session_header)
        return Preset("attached", ("{port}", "{backends}"),
                      args.session_header or "x-session-id", args.policy, "delay", None, False,
                      "a running router")
    if args.preset is not None:
        preset = PRESETS[args.preset]
        if args.session_header:
            preset = attrs.evolve(preset, session_header=args.session_header)
        return preset
    template = parse_template(args.router_cmd)
    if args.policy is None:
        raise PresetError("--router-cmd needs --policy (what the router claims to implement)")
    return Preset("custom", template,
                  args.session_header or "x-session-id", args.policy, "delay", None, False,
                  "custom command")


def run(args: argparse.Namespace) -> int:
    try:
        preset = _preset(args)
        claim = parse_claim(args.policy or preset.claim, args.cache_size)
        try:
            extra = tuple(shlex.split(args.router_extra))
        except ValueError as exc:
            raise PresetError(f"--router-extra {args.router_extra!r}: {exc}") from None
        if args.url is not None:
            _reachable(args.url)
        if preset.needs_routers_venv and not routers_available(args.routers_venv):
            if not args.install_routers:
                raise PresetError(f"{preset.name} needs {args.routers_venv} with "
                                  f"{' '.join(ROUTER_PACKAGES)}: add --install-routers")
            ensure_routers_venv(args.routers_venv)
    except (ClaimError, PresetError, ValueError) as exc:
        print(f"affinity check-router: {exc}", file=sys.stderr)
        return 2
    backends = len(args.fleet_ports) if args.fleet_ports else args.backends
    step = claim.config.affinity_break_tokens if args.context_step is None else args.context_step
    shape = TraceShape(backends=backends, sessions=args.sessions, length=args.length,
                       stream_percent=0 if args.no_streams else 25,
                       fail_percent=0 if args.no_failures else 15,
                       pool_percent=0 if args.no_pool_changes else args.pool_percent,
                       band_tokens=step or None)
    options = CheckOptions(preset, claim, args.url, extra, args.routers_venv, shape,
                           args.budget, args.seed, args.settle, args.settle_factor,
                           args.shrink_runs, 180.0, args.max_failures, args.out,
                           args.fleet_ports)
    try:
        report = run_sync(options)
    except PresetError as exc:
        print(f"affinity check-router: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json(), indent=2) if args.json else render(report))
    return 1 if report.verdict == "fail" else 0


def render(report: RouterReport) -> str:
    """The human-readable report."""
    s = report.settle
    lines = [f"affinity check-router {report.router} --policy {report.claim}",
             f"  command: {shlex.join(report.command)}",
             f"  session header: {report.session_header}; traces: {report.traces} "
             f"({report.passed} conform); router starts: {report.router_runs}"]
    if s is not None:
        lines.append(f"  settle: {s.delay * 1000:.0f} ms after each completion ({s.how}); "
                     f"poll: {s.mode}")
    if report.ties:
        lines.append(f"  ties: {report.ties} placements had two or more least-loaded backends; "
                     f"the router took the first in pool order in {report.ties_first}")
    if report.band:
        b = report.band
        lines.append(f"  context band: {b.get('hits', 0)} sticky hits judged by the band; "
                     f"{b.get('kept_by_band', 0)} kept only because of c (load above min + "
                     f"margin), {b.get('broken_by_cap', 0)} broken only because of the cap, "
                     f"{b.get('broken_by_rounding_down', 0)} only because c // T rounds down")
    if report.pool_changes:
        lines.append("  pool changes driven through its API: " + ", ".join(
            f"{n} {action}" for action, n in report.pool_changes.items()))
    if report.retries:
        lines.append(f"  the router retried completed requests {report.retries} time(s) "
                     "(extra arrivals of the same request)")
    lines += [f"  note: {n}" for n in report.notes]
    for f in report.failures:
        d = f.divergence
        lines += ["", f"FAIL trace seed {f.seed}: minimal trace ({len(f.minimal)} of "
                      f"{f.original_length} ops"
                      f"{'' if f.confirmed else '; not reproducible, unshrunk'}): "
                      f"{'; '.join(f.minimal)}",
                  f"  first divergence: step {d.index + 1} {d.op}: {d.words} "
                  f"[{', '.join(d.requirements)}]",
                  f"  spec loads before the step: {d.loads}"]
        if d.views:
            lines.append(f"  the router's choice is least-loaded if load means: "
                         f"{'; '.join(d.views)}")
        if f.repeats:
            lines.append(f"  {f.repeats} more trace(s) failed the same way")
        if f.vector:
            lines.append(f"  as a vector: {f.vector}")
    output = report.out_dir or "none kept (the check passed; --out DIR keeps the router log)"
    lines += ["", f"output: {output}",
              f"verdict: {report.verdict.upper() if report.verdict == 'fail' else report.verdict}"
              f" in {report.seconds:.1f}s"]
    return "\n".join(lines)
