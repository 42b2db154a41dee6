"""``affinity serve``: command-line options of the vLLM router.

Every option maps to one field of :class:`~affinity_vllm.options.RouterOptions`, which
validates it; the error names the option, the value and the accepted range. The server
modules are imported only when the command runs, so ``affinity --help`` stays fast.

Exit status: 0 after a clean shutdown (SIGTERM/SIGINT), 1 when the router cannot start
(the address cannot be bound or resolved, or the decision log is unusable or held by
another router), 2 bad options (among them a ``--decision-log`` whose directory does not
exist, and an ``--admin-socket`` path that is taken) -- each with a one-line message and
no traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
from pathlib import Path
from typing import Any

import attrs

from .options import CONTEXT_MODES, OptionsError, RouterOptions, parse_margin

__all__ = ["decision_log_problem", "options_from_args", "register", "run", "startup_summary"]

EPILOG = """\
example (two vLLM servers, sessions keyed by the x-session-id header):
  affinity serve --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002 \\
      --margin 2 --port 8080
  curl -s localhost:8080/v1/completions -H 'x-session-id: conv-17' \\
      -H 'content-type: application/json' -d '{"model": "m", "prompt": "hi"}'

no vLLM at hand: start stub backends (a fake vLLM server, model "tiny") on those ports:
  python -m affinity_vllm.stub --port 8001 --name s1 &
  python -m affinity_vllm.stub --port 8002 --name s2 &

routes: POST /v1/completions, POST /v1/chat/completions (SSE streaming passed through),
GET /v1/models, GET /metrics (Prometheus), GET /status (JSON), GET /health (and HEAD on
the last three).
"""


def _margin(text: str) -> int | None:
    try:
        return parse_margin(text)
    except OptionsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _placement_margin(text: str) -> int | None:
    """``--placement-margin``: 'none' or an integer >= 0, as ``--margin``."""
    try:
        return parse_margin(text, "--placement-margin")
    except OptionsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _group_margin(text: str) -> int | None:
    """``--group-break-margin``: 'none' or an integer >= 0, as ``--margin``."""
    try:
        return parse_margin(text, "--group-break-margin")
    except OptionsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _band_integer(flag: str) -> Any:
    """argparse's own message for ``--affinity-break-tokens 1.5`` was "invalid int value:
    '1.5'", which names no accepted range; the range itself is checked by the core. The
    core's message for 0 says "must be null or an integer >= 1", so 'none' / 'null' are
    accepted too (off, the default), as for --margin."""
    def parse(text: str) -> int | None:
        if text.strip().lower() in ("none", "null"):
            return None
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} must be 'none' or an integer >= 1, got {text!r}") from None

    return parse


def register(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = (
        "Route OpenAI-style requests to a fleet of vLLM servers with load-aware session "
        "affinity. Every decision goes through affinity_engine: acquire on arrival, release "
        "when the response ends or fails.")
    parser.epilog = EPILOG
    d = attrs.fields(RouterOptions)  # defaults live in one place

    route = parser.add_argument_group("routing")
    route.add_argument("--backend", action="append", required=True, metavar="URL",
                       help="base URL of a vLLM server, e.g. http://127.0.0.1:8000 (plain "
                       "http:// only; https:// is refused); repeat for each backend (required)")
    route.add_argument("--margin", type=_margin, default=d.margin.default, metavar="N|none",
                       help="affinity_break_margin: keep a session's pin while its backend's "
                       "load <= least load + N; 'none' never breaks a pin (default: none)")
    route.add_argument("--affinity-break-tokens",
                       type=_band_integer("--affinity-break-tokens"), default=None,
                       metavar="T|none",
                       help="context band: widen the margin by one request per T prompt "
                       "tokens of the request, up to --affinity-break-band-cap, so long "
                       "conversations tolerate more skew before they move; an integer >= 1, "
                       "needs --margin (default: none, off)")
    route.add_argument("--affinity-break-band-cap",
                       type=_band_integer("--affinity-break-band-cap"), default=None,
                       metavar="N|none",
                       help="context band: the widest band, an integer >= 1 and >= the "
                       "margin; required with --affinity-break-tokens (default: none, off)")
    route.add_argument("--context-tokens", choices=CONTEXT_MODES,
                       default=d.context_tokens.default,
                       help="context band: the prompt length of a request with a session key "
                       "is the number of token ids when it carries them (a completions "
                       "prompt of ids, a chat kv_transfer_params.prompt_token_ids); for text, "
                       "'estimate' counts UTF-8 bytes / 4, 'tokenize' asks a backend's POST "
                       "/tokenize (on failure: the estimate, counted in /metrics "
                       "context_sources_total), 'off' counts nothing (the band is the "
                       "margin) (default: %(default)s)")
    route.add_argument("--context-reuse", action="store_true",
                       help="context band: scale the prompt length of a request whose session "
                       "is pinned to backend P by P's observed prefix reuse, c * cached // "
                       "looked-up tokens, summed over P's continuing (kept) turns since it "
                       "joined the pool (cumulative, no window): on a backend whose cache "
                       "thrashes a break throws little away, so the band stays narrow. Needs "
                       "--affinity-break-tokens, not --context-tokens off nor --full-determinism. "
                       "The vLLM servers "
                       "must run with --enable-prompt-tokens-details: otherwise responses "
                       "carry no cached_tokens, nothing is recorded (/metrics "
                       "reuse_reports_total{result=\"no_usage\"}) and c stays the prompt "
                       "length; streams report usage only when the client asks "
                       "stream_options.include_usage (default: off)")
    route.add_argument("--tie-break", choices=["first", "draw", "hashed"],
                       default=d.tie_break.default,
                       help="how to choose among equally loaded backends: first in pool "
                       "order, a seeded random draw, or a hash of the session key "
                       "(default: %(default)s)")
    route.add_argument("--seed", type=int, default=d.seed.default,
                       help="seed of the router's tie-draw RNG (default: %(default)s)")
    route.add_argument("--full-determinism", action="store_true",
                       help="place new sessions by a hash of the session key, ignoring load; "
                       "requests without a key are refused with 400")
    route.add_argument("--hash-mode", choices=["stable", "caller"],
                       default=d.hash_mode.default,
                       help="with --full-determinism: 'stable' indexes the sorted backends, "
                       "'caller' the pool order, both by CRC-32 of the key "
                       "(default: %(default)s)")
    route.add_argument("--cache-size", type=int, default=d.cache_size.default,
                       help="sticky map capacity (LRU, sessions) (default: %(default)s)")
    route.add_argument("--no-lease-accounting", dest="lease_accounting",
                       action="store_false",
                       help="match releases to servers only, as verl does; by default a "
                       "release is matched to its acquire, so requests that were in flight "
                       "on a removed backend cannot undercount it after it is re-added")

    sess = parser.add_argument_group("sessions")
    sess.add_argument("--session-header", default=d.session_header.default, metavar="NAME",
                      help="request header carrying the session key (default: %(default)s)")
    sess.add_argument("--session-body-field", default=None, metavar="NAME",
                      help="JSON body field to take the key from when the header is absent, "
                      "e.g. 'user' (default: none). Requests without a key are routed "
                      "least-loaded and never pinned")

    group = parser.add_argument_group(
        "group pins", "the n samples of one prompt (GRPO's group) share its prefix; a "
        "group pin places them on one backend, judged by the same keep rule as a session's "
        "pin (SPEC 7.6). A request's group is read only with --group-stickiness fallback "
        "or only, and only for a request with a session key")
    group.add_argument("--group-stickiness", choices=["off", "fallback", "only"],
                       default=d.group_stickiness.default,
                       help="'fallback': a session without a pin of its own joins its "
                       "group's pin; 'only': the group's pin alone, the session's own never "
                       "read nor written (PR #6122's GroupStickyLoadBalancer); 'off' ignores "
                       "groups (default: %(default)s)")
    group.add_argument("--group-break-margin", type=_group_margin, default=None,
                       metavar="N|none",
                       help="keep a group's pin while its backend's load <= least load + "
                       "N; 'none' judges it by the session's own rule (--margin, the context "
                       "band) (default: none)")
    group.add_argument("--max-group-cache-size", type=int,
                       default=d.max_group_cache_size.default,
                       help="group map capacity (LRU, groups) (default: %(default)s)")
    group.add_argument("--group-header", default=d.group_header.default, metavar="NAME",
                       help="request header carrying the group id (default: %(default)s)")
    group.add_argument("--group-body-field", default=None, metavar="NAME",
                       help="JSON body field to take the group id from when the header is "
                       "absent (default: none). A keyed request without a group id is "
                       "routed by its session key alone")

    place = parser.add_argument_group(
        "prefix-aware placement", "a placement (a new session, a broken pin, a group with "
        "no pin) may use any backend within least load + M and takes the one the router "
        "has sent the most of this prompt's leading blocks (SPEC 8.1). The router keeps, "
        "per backend, the prompt blocks it routed there (token ids, else the prompt text); "
        "its memory per backend is under /status prefix_index")
    place.add_argument("--placement-margin", type=_placement_margin, default=None,
                       metavar="N|none",
                       help="the load band a placement may use; 'none' (the default) "
                       "places on the least loaded, as without the option; ignored under "
                       "--full-determinism")
    place.add_argument("--prefix-block-size", type=int,
                       default=d.prefix_block_size.default, metavar="TOKENS",
                       help="tokens a block, as the backends' vLLM block_size "
                       "(default: %(default)s)")
    place.add_argument("--prefix-index-blocks", type=int,
                       default=d.prefix_index_blocks.default, metavar="N",
                       help="blocks remembered per backend, least recently routed "
                       "forgotten first (default: %(default)s, about 1M tokens of prompt "
                       "and 8 MiB of index per backend)")

    net = parser.add_argument_group("server and limits")
    net.add_argument("--host", default=d.host.default,
                     help="bind address (default: %(default)s)")
    net.add_argument("--port", type=int, default=d.port.default,
                     help="bind port; 0 picks a free one (default: %(default)s)")
    net.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes.default,
                     help="larger request bodies get 413 (default: %(default)s)")
    net.add_argument("--body-memory-budget", type=int,
                     default=d.body_memory_budget.default, metavar="BYTES",
                     help="request bodies held in memory by all connections at once; a "
                     "body that does not fit gets 503; at least --max-body-bytes "
                     "(default: %(default)s)")
    net.add_argument("--max-header-bytes", type=int, default=d.max_header_bytes.default,
                     help="longest accepted request line / header field; longer ones are "
                     "refused with 400 (default: %(default)s)")
    net.add_argument("--max-concurrency", type=int, default=d.max_concurrency.default,
                     help="requests proxied at once; more get 503 (default: %(default)s)")
    net.add_argument("--max-connections", type=int, default=d.max_connections.default,
                     help="open client connections; more get 503 and are closed. Each "
                     "needs about 2 open files: at start the open-file limit (ulimit -n) is "
                     "raised toward its hard limit, and if it is still short this is "
                     "lowered to fit, with a warning (default: %(default)s)")
    net.add_argument("--header-timeout", type=float, default=d.header_timeout.default,
                     help="seconds from a request's first byte to the end of its headers; "
                     "slower requests get 408 (default: %(default)s)")
    net.add_argument("--body-timeout", type=float, default=d.body_timeout.default,
                     help="seconds from the end of a request's headers to the end of its "
                     "body; slower requests get 408 (default: %(default)s)")
    net.add_argument("--idle-timeout", type=float, default=d.idle_timeout.default,
                     help="seconds a keep-alive client connection may idle between requests "
                     "(default: %(default)s)")
    net.add_argument("--shutdown-grace", type=float, default=d.shutdown_grace.default,
                     help="on SIGTERM/SIGINT the router stops accepting, closes idle "
                     "connections and answers open requests with 'Connection: close'; "
                     "this many seconds later those still open are cancelled and released "
                     "(default: %(default)s)")
    net.add_argument("--connect-timeout", type=float, default=d.connect_timeout.default,
                     help="seconds to connect to a backend; on expiry the request is retried "
                     "once elsewhere and the failure counts toward ejection "
                     "(default: %(default)s)")
    net.add_argument("--upstream-timeout", type=float, default=d.upstream_timeout.default,
                     help="seconds a backend may stay silent (before or between response "
                     "chunks); on expiry the client gets 504 (or a cut stream); a slow "
                     "request does not eject its backend (default: %(default)s)")

    health = parser.add_argument_group("health and load")
    health.add_argument("--health-interval", type=float, default=d.health_interval.default,
                        help="seconds between GET /health rounds; failing backends are "
                        "removed, recovered ones (and ejected ones past their back-off) "
                        "re-added (default: %(default)s)")
    health.add_argument("--health-timeout", type=float, default=d.health_timeout.default,
                        help="timeout of one health check, scrape or /tokenize call "
                        "(default: %(default)s)")
    health.add_argument("--health-failure-threshold", type=int,
                        default=d.health_failure_threshold.default, metavar="N",
                        help="remove a backend after N consecutive failed health checks; "
                        "never the last routable one by health checks alone "
                        "(default: %(default)s)")
    health.add_argument("--health-success-threshold", type=int,
                        default=d.health_success_threshold.default, metavar="N",
                        help="re-add a removed backend after N consecutive passed health "
                        "checks (an ejected one also waits out its back-off) "
                        "(default: %(default)s)")
    health.add_argument("--eject-5xx", type=int, default=d.eject_5xx.default, metavar="N",
                        help="eject a backend after N consecutive 5xx answers (never the last "
                        "routable one); 0: never for 5xx (default: %(default)s)")
    health.add_argument("--no-retry", dest="retry", action="store_false",
                        help="do not retry a request that got a 5xx or a connection closed "
                        "before any response byte (by default it is retried once on another "
                        "backend); a refused connection is always tried elsewhere")
    health.add_argument("--eject-connect-errors", type=int,
                        default=d.eject_connect_errors.default, metavar="N",
                        help="eject a backend after N consecutive connect errors "
                        "(default: %(default)s)")
    health.add_argument("--ejection-base", type=float, default=d.ejection_base.default,
                        help="seconds out for a first ejection, doubling for each ejection "
                        "in a row; a passing health check then re-adds it "
                        "(default: %(default)s)")
    health.add_argument("--ejection-max", type=float, default=d.ejection_max.default,
                        help="longest ejection back-off (default: %(default)s)")
    health.add_argument("--scrape-metrics", action="store_true",
                        help="scrape each backend's /metrics and feed num_requests_running + "
                        "num_requests_waiting to the core as ObserveLoads events")
    health.add_argument("--scrape-interval", type=float, default=d.scrape_interval.default,
                        help="seconds between scrapes (default: %(default)s)")

    logs = parser.add_argument_group("decision log")
    logs.add_argument("--decision-log", default=None, metavar="PATH",
                      help="write every routing event as NDJSON for `affinity replay`; "
                      "PATH's directory must exist (a missing one is refused at start, "
                      "exit 2). Opened only after the port is bound, under an exclusive lock on "
                      "PATH.lock: a second router on the same PATH exits with an error "
                      "naming the holder's PID and changes nothing. An existing log at PATH "
                      "is rotated to PATH.1, not overwritten, and the router continues "
                      "from its state (warm start: sticky pins and counters come back, "
                      "requests the old process had in flight are released as "
                      "abandoned; see --cold-start). Write failures and a log "
                      "deleted or replaced underneath are reported in /metrics "
                      "(affinity_router_decision_log_ok, _errors_total) and the router log, "
                      "and the writer resumes with a new file (default: off)")
    logs.add_argument("--decision-log-max-bytes", type=int,
                      default=d.decision_log_max_bytes.default,
                      help="rotate the decision log at this size; each file replays alone "
                      "(default: %(default)s)")
    logs.add_argument("--cold-start", action="store_true",
                      help="start from a fresh state even when --decision-log PATH holds "
                      "the previous run's log (default: replay it and continue from its "
                      "state; a log that cannot be replayed, or a changed routing "
                      "configuration, starts cold anyway, with the reason in the log)")
    logs.add_argument("--decision-log-keep", type=int, default=d.decision_log_keep.default,
                      metavar="N",
                      help="keep at most N rotated files (PATH.1 ... PATH.N); the newest "
                      "crashed run and any run a restart could not replay are kept beyond "
                      "it (default: %(default)s)")
    logs.add_argument("--decision-log-keep-bytes", type=int, default=None, metavar="BYTES",
                      help="also keep at most BYTES of rotated files, with the same "
                      "exceptions (default: no byte limit)")
    logs.add_argument("--require-decision-log", action="store_true",
                      help="refuse to route (503) while the decision log cannot be written, "
                      "so every routed request is in the log (default: keep routing and "
                      "report the failure)")
    admin = parser.add_argument_group("run-time pool API (off by default)")
    admin.add_argument("--admin-port", type=int, default=None, metavar="PORT",
                       help="serve the pool API on this separate port: GET /backends, POST "
                       "/backends/add, /backends/remove, /backends/drain with a JSON body "
                       '{"url": ..., "reason": ...}; each change is an AddServers or '
                       "RemoveServers event in the decision log with its reason (default: "
                       "off)")
    admin.add_argument("--admin-host", default="127.0.0.1",
                       help="address of the pool API; anything but loopback needs "
                       "--admin-token-file (default: %(default)s)")
    admin.add_argument("--admin-socket", default=None, metavar="PATH",
                       help="serve the pool API on a unix socket at PATH too (or instead), "
                       "created with mode 0600 so only this user can use it; PATH's "
                       "directory must exist, a stale socket there is replaced, and any "
                       "other file, or a socket another process answers on, is refused "
                       "at start, exit 2 (default: off)")
    admin.add_argument("--admin-token-file", default=None, metavar="PATH",
                       help="file holding the bearer token the pool API requires "
                       "(Authorization: Bearer TOKEN; at least 16 characters, one line)")
    parser.add_argument("--access-log", default=None, metavar="PATH",
                        help="append one JSON line per request to PATH ('-': stdout): "
                        "method, path, status, duration_ms, ttfb_ms, backend, decision, "
                        "a hash of the session key, client (default: off)")
    parser.add_argument("--log-level", default="INFO", type=str.upper,
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="router log level (default: %(default)s)")
    parser.set_defaults(run=run)


def options_from_args(args: argparse.Namespace) -> RouterOptions:
    return RouterOptions(
        backends=tuple(args.backend), margin=args.margin, tie_break=args.tie_break,
        affinity_break_tokens=args.affinity_break_tokens,
        affinity_break_band_cap=args.affinity_break_band_cap,
        context_tokens=args.context_tokens, context_reuse=args.context_reuse,
        seed=args.seed, full_determinism=args.full_determinism, hash_mode=args.hash_mode,
        cache_size=args.cache_size, lease_accounting=args.lease_accounting,
        session_header=args.session_header, session_body_field=args.session_body_field,
        group_stickiness=args.group_stickiness, group_break_margin=args.group_break_margin,
        max_group_cache_size=args.max_group_cache_size, group_header=args.group_header,
        group_body_field=args.group_body_field,
        placement_margin=args.placement_margin, prefix_block_size=args.prefix_block_size,
        prefix_index_blocks=args.prefix_index_blocks,
        host=args.host, port=args.port, max_body_bytes=args.max_body_bytes,
        max_header_bytes=args.max_header_bytes, max_concurrency=args.max_concurrency,
        connect_timeout=args.connect_timeout, upstream_timeout=args.upstream_timeout,
        max_connections=args.max_connections, header_timeout=args.header_timeout,
        body_timeout=args.body_timeout, idle_timeout=args.idle_timeout,
        shutdown_grace=args.shutdown_grace, eject_5xx=args.eject_5xx, retry=args.retry,
        eject_connect_errors=args.eject_connect_errors, ejection_base=args.ejection_base,
        ejection_max=args.ejection_max,
        health_interval=args.health_interval, health_timeout=args.health_timeout,
        scrape_metrics=args.scrape_metrics, scrape_interval=args.scrape_interval,
        decision_log=args.decision_log, decision_log_max_bytes=args.decision_log_max_bytes,
        require_decision_log=args.require_decision_log, warm_start=not args.cold_start,
        health_failure_threshold=args.health_failure_threshold,
        health_success_threshold=args.health_success_threshold,
        body_memory_budget=args.body_memory_budget,
        decision_log_keep=args.decision_log_keep,
        decision_log_keep_bytes=args.decision_log_keep_bytes,
        admin_port=args.admin_port, admin_host=args.admin_host,
        admin_socket=args.admin_socket,
        admin_token=_admin_token(args.admin_token_file), access_log=args.access_log,
    )


def _admin_token(path: str | None) -> str | None:
    """The token in ``--admin-token-file`` (read at start; never on the command line,
    where ``ps`` would show it)."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read(4096).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise OptionsError(f"cannot read --admin-token-file {path!r}: "
                           f"{getattr(exc, 'strerror', None) or exc}") from None


def startup_summary(options: RouterOptions) -> str:
    """What the "listening on" line says about the routing: "2 backends, margin 2"."""
    count = len(options.backends)
    margin = "off (null)" if options.margin is None else str(options.margin)
    return f"{count} backend{'' if count == 1 else 's'}, margin {margin}"


def decision_log_problem(path: str | None) -> str | None:
    """Why ``--decision-log PATH`` cannot work, found before anything starts, or None.

    The router never creates directories for its log: a typo in the directory would
    otherwise start a log in a place nobody looks. A missing directory is therefore a
    bad option (exit 2) at configuration time, not a silent ``mkdir -p``.
    """
    if path is None:
        return None
    parent = Path(path).absolute().parent
    if not parent.exists():
        return (f"--decision-log {path}: directory {parent} does not exist (create it "
                "first; the router does not create directories)")
    if not parent.is_dir():
        return f"--decision-log {path}: {parent} is not a directory"
    return None


def run(args: argparse.Namespace) -> int:
    try:
        options = options_from_args(args)
    except OptionsError as exc:
        print(f"affinity serve: {exc}", file=sys.stderr)
        return 2
    problem = decision_log_problem(options.decision_log)
    if problem is None and options.admin_socket is not None:
        from .admin import socket_path_problem

        problem = socket_path_problem(options.admin_socket)
    if problem is not None:
        print(f"affinity serve: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .router import install_uvloop, serve_forever

    install_uvloop()

    host = f"[{options.host}]" if ":" in options.host else options.host  # IPv6 literal

    def ready(port: int) -> None:
        print(f"affinity serve: listening on http://{host}:{port} ({startup_summary(options)})",
              flush=True)

    try:
        asyncio.run(serve_forever(options, ready))
    except socket.gaierror as exc:  # its text alone would not say which name failed
        print(f"affinity serve: cannot listen on --host {options.host!r}: {exc.strerror}",
              file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"affinity serve: {exc}", file=sys.stderr)
        return 1
    return 0
