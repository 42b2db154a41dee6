"""Router options: one validated, immutable value built from the CLI or from code.

Theory of operation
-------------------
:class:`RouterOptions` gathers everything ``affinity serve`` accepts. It is validated
when built (like :class:`affinity_engine.Config`): a bad value raises
:class:`OptionsError` naming the option, the value and the accepted range, before any
socket is opened. :meth:`RouterOptions.core_config` derives the core configuration;
the routing semantics themselves are not duplicated here.

Backends are identified by their normalised base URL (``http://host:port``, no trailing
slash); that string is the core's server id, the ``backend`` label in /metrics and the
key in /status.
"""

from __future__ import annotations

import ipaddress
import math
from typing import Any
from urllib.parse import urlsplit

import attrs

from affinity_engine import Config, ConfigError, validate_margin

__all__ = ["CONTEXT_MODES", "OptionsError", "RouterOptions", "normalise_backend_url",
           "parse_margin"]

# Where the context band's c comes from (affinity_vllm.context); here so the CLI can list
# them without importing the server modules.
CONTEXT_MODES = ("estimate", "tokenize", "off")


class OptionsError(ValueError):
    """A router option is outside its accepted range."""


def normalise_backend_url(url: str) -> str:
    """``http://host:port`` with no path; raises :class:`OptionsError` otherwise."""
    text = url.strip().rstrip("/")
    parts = urlsplit(text)
    if parts.scheme == "https":
        # The router speaks plain HTTP/1.1 to backends; an https:// backend passed here
        # and then failed every request as "refused".
        raise OptionsError(f"backend {url!r}: https:// backends are not supported (the "
                           "router connects to backends over plain HTTP); accepted: an "
                           "http:// base URL such as http://127.0.0.1:8000, with TLS "
                           "terminated in front of the router if needed")
    if parts.scheme != "http" or not parts.hostname:
        raise OptionsError(
            f"backend must be an http:// base URL such as http://127.0.0.1:8000, got {url!r}"
        )
    if parts.path or parts.query or parts.fragment:
        raise OptionsError(f"backend URL must not have a path or query, got {url!r}")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:  # a backend cannot listen on port 0 (that means "any free port")
        raise OptionsError(f"backend URL has an invalid port (accepted: 1..65535): {url!r}")
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def parse_margin(text: str, name: str = "margin") -> int | None:
    """``none`` (never break a pin) or an integer >= 0; ``name`` is what errors call it."""
    if text.strip().lower() in ("none", "null"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise OptionsError(f"{name} must be 'none' or an integer >= 0, got {text!r}") from None
    try:
        return validate_margin(value, name)
    except ConfigError as exc:
        raise OptionsError(str(exc)) from None


# The core names its options as verl does; on this command line they are flags.
_FLAG_NAMES = (
    ("affinity_break_band_cap", "--affinity-break-band-cap"),
    ("affinity_break_tokens", "--affinity-break-tokens"),
    ("affinity_break_margin", "--margin"),
    ("max_group_cache_size", "--max-group-cache-size"),
    ("group_break_margin", "--group-break-margin"),
    ("group_stickiness", "--group-stickiness"),
    ("placement_margin", "--placement-margin"),
)


def _as_flags(message: str) -> str:
    for option, flag in _FLAG_NAMES:
        message = message.replace(option, flag)
    return message


def _backends(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise OptionsError(f"backends must be a list of URLs, got {value!r}")
    urls = tuple(normalise_backend_url(v) for v in value)
    if not urls:
        raise OptionsError("at least one backend is required (--backend URL)")
    dupes = sorted({u for u in urls if urls.count(u) > 1})
    if dupes:
        raise OptionsError(f"backends must be distinct, got duplicates {dupes}")
    return urls


def _in_range(name: str, low: float, high: float, integral: bool = False) -> Any:
    def check(_inst: Any, _attr: Any, value: Any) -> None:
        ok_type = isinstance(value, int) if integral else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok_type or not (low <= value <= high) or (
            isinstance(value, float) and math.isnan(value)
        ):
            # Exact bounds: %g would print 2**63 - 1 as 9.22337e+18, which is not the limit.
            kind, bounds = (("an integer", f"[{int(low)}, {int(high)}]") if integral
                            else ("a number", f"[{low:g}, {high:g}]"))
            raise OptionsError(f"{name} must be {kind} in {bounds}, got {value!r}")

    return check


def _flag(name: str) -> Any:
    def check(_inst: Any, _attr: Any, value: Any) -> None:
        if not isinstance(value, bool):
            raise OptionsError(f"{name} must be True or False, got {value!r}")

    return check


def _header_name(_inst: Any, attr: Any, value: Any) -> None:
    ok = isinstance(value, str) and value != "" and all(
        c.isalnum() or c in "-_" for c in value
    )
    if not ok:
        raise OptionsError(f"{attr.name} must be an HTTP header name, got {value!r}")


def _context_mode(_inst: Any, _attr: Any, value: Any) -> None:
    if value not in CONTEXT_MODES:
        raise OptionsError(f"context_tokens must be one of {', '.join(CONTEXT_MODES)}, "
                           f"got {value!r}")


def _optional_field(_inst: Any, attr: Any, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or value == ""):
        raise OptionsError(f"{attr.name} must be a non-empty field name, got {value!r}")


def _optional_path(_inst: Any, _attr: Any, value: Any) -> None:
    # "" used to mean "no log" in silence: the user asked for a log and got none.
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise OptionsError(f"decision_log must be a file path (or omitted), got {value!r}")


def _optional_access_log(_inst: Any, _attr: Any, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise OptionsError(f"access_log must be a file path or '-' (or omitted), got {value!r}")


def _optional_socket(_inst: Any, _attr: Any, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()
                              or "\x00" in value):
        raise OptionsError(f"admin_socket must be a file path (or omitted), got {value!r}")


def _optional_token(_inst: Any, _attr: Any, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, str) or len(value) < 16 or any(
            c.isspace() or not c.isprintable() for c in value) or not value.isascii():
        raise OptionsError("admin_token must be at least 16 printable ASCII characters "
                           "without spaces (--admin-token-file holds it on one line)")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@attrs.frozen(kw_only=True)
class RouterOptions:
    """Validated options of ``affinity serve`` (see ``affinity serve --help``)."""

    backends: tuple[str, ...] = attrs.field(converter=_backends)
    margin: int | None = None
    affinity_break_tokens: int | None = None  # the context band (SPEC §7.5)
    affinity_break_band_cap: int | None = None
    context_tokens: str = attrs.field(default="estimate", validator=_context_mode)
    context_reuse: bool = attrs.field(default=False, validator=_flag("context_reuse"))
    tie_break: str = "draw"
    full_determinism: bool = False
    hash_mode: str = "stable"
    cache_size: int = attrs.field(default=10000, validator=_in_range("cache_size", 1, 10**9, True))
    lease_accounting: bool = True
    seed: int = attrs.field(default=0, validator=_in_range("seed", 0, 2**63 - 1, True))
    host: str = "127.0.0.1"
    port: int = attrs.field(default=8080, validator=_in_range("port", 0, 65535, True))
    session_header: str = attrs.field(default="x-session-id", validator=_header_name)
    session_body_field: str | None = attrs.field(default=None, validator=_optional_field)
    # Group pins (SPEC §7.6): a request's group comes from this header, else this body
    # field, and is read only with group_stickiness "fallback" or "only".
    group_stickiness: str = "off"
    group_break_margin: int | None = None
    max_group_cache_size: int = attrs.field(
        default=10000, validator=_in_range("max_group_cache_size", 1, 10**9, True))
    group_header: str = attrs.field(default="x-group-id", validator=_header_name)
    group_body_field: str | None = attrs.field(default=None, validator=_optional_field)
    # Prefix-aware placement (SPEC §8.1): placements within min + placement_margin go to
    # the backend the router's index says holds the most of the prompt.
    placement_margin: int | None = None
    prefix_block_size: int = attrs.field(
        default=16, validator=_in_range("prefix_block_size", 1, 1 << 20, True))
    prefix_index_blocks: int = attrs.field(
        default=65536, validator=_in_range("prefix_index_blocks", 1, 1 << 30, True))
    max_body_bytes: int = attrs.field(
        default=8 << 20, validator=_in_range("max_body_bytes", 1024, 1 << 31, True))
    max_header_bytes: int = attrs.field(
        default=8190, validator=_in_range("max_header_bytes", 256, 1 << 20, True))
    max_concurrency: int = attrs.field(
        default=4096, validator=_in_range("max_concurrency", 1, 10**6, True))
    connect_timeout: float = attrs.field(
        default=3.0, validator=_in_range("connect_timeout", 0.01, 3600))
    upstream_timeout: float = attrs.field(
        default=600.0, validator=_in_range("upstream_timeout", 0.01, 86400))
    header_timeout: float = attrs.field(
        default=10.0, validator=_in_range("header_timeout", 0.01, 3600))
    body_timeout: float = attrs.field(
        default=60.0, validator=_in_range("body_timeout", 0.01, 3600))
    idle_timeout: float = attrs.field(
        default=75.0, validator=_in_range("idle_timeout", 0.01, 86400))
    max_connections: int = attrs.field(
        default=10000, validator=_in_range("max_connections", 1, 10**6, True))
    shutdown_grace: float = attrs.field(
        default=30.0, validator=_in_range("shutdown_grace", 0, 86400))
    eject_5xx: int = attrs.field(default=5, validator=_in_range("eject_5xx", 0, 10**6, True))
    retry: bool = True
    eject_connect_errors: int = attrs.field(
        default=1, validator=_in_range("eject_connect_errors", 1, 10**6, True))
    ejection_base: float = attrs.field(
        default=5.0, validator=_in_range("ejection_base", 0.01, 86400))
    ejection_max: float = attrs.field(
        default=300.0, validator=_in_range("ejection_max", 0.01, 86400))
    health_interval: float = attrs.field(
        default=1.0, validator=_in_range("health_interval", 0.01, 3600))
    health_timeout: float = attrs.field(
        default=2.0, validator=_in_range("health_timeout", 0.01, 3600))
    scrape_metrics: bool = False
    scrape_interval: float = attrs.field(
        default=1.0, validator=_in_range("scrape_interval", 0.01, 3600))
    decision_log: str | None = attrs.field(default=None, validator=_optional_path)
    decision_log_max_bytes: int = attrs.field(
        default=64 << 20, validator=_in_range("decision_log_max_bytes", 4096, 1 << 40, True))
    require_decision_log: bool = False
    # Warm restart and retention of the decision log (R-LOG-3): a restart continues the
    # old log's state; rotation keeps this many old files and/or bytes, plus the newest
    # crash and every run a restart could not replay.
    warm_start: bool = attrs.field(default=True, validator=_flag("warm_start"))
    decision_log_keep: int = attrs.field(
        default=10, validator=_in_range("decision_log_keep", 0, 10**6, True))
    decision_log_keep_bytes: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(
            _in_range("decision_log_keep_bytes", 0, 1 << 50, True)))
    # The run-time pool API (admin.py): its own port, off by default; beyond loopback
    # only with a bearer token.
    admin_host: str = "127.0.0.1"
    admin_port: int | None = attrs.field(default=None, validator=attrs.validators.optional(
        _in_range("admin_port", 0, 65535, True)))
    admin_token: str | None = attrs.field(default=None, repr=False,
                                          validator=_optional_token)
    # ... and/or a unix socket (mode 0600: the file system says who may use it).
    admin_socket: str | None = attrs.field(default=None, validator=_optional_socket)
    # One JSON line per request (access_log.py); "-" is stdout.
    access_log: str | None = attrs.field(default=None, validator=_optional_access_log)

    health_failure_threshold: int = attrs.field(
        default=3, validator=_in_range("health_failure_threshold", 1, 10**6, True))
    health_success_threshold: int = attrs.field(
        default=2, validator=_in_range("health_success_threshold", 1, 10**6, True))
    body_memory_budget: int = attrs.field(
        default=256 << 20, validator=_in_range("body_memory_budget", 1024, 1 << 40, True))

    def __attrs_post_init__(self) -> None:
        if self.admin_port is not None and self.admin_token is None and not _loopback(
                self.admin_host):
            raise OptionsError(f"admin API on {self.admin_host!r} is reachable beyond this "
                               "machine: it needs a bearer token (--admin-token-file), or "
                               "bind it to a loopback address such as 127.0.0.1 "
                               "(--admin-host)")
        if self.body_memory_budget < self.max_body_bytes:
            raise OptionsError(f"body_memory_budget must be >= max_body_bytes "
                               f"({self.max_body_bytes}), or no request of the largest "
                               f"accepted size could ever be held, got "
                               f"{self.body_memory_budget!r}")
        if self.require_decision_log and not self.decision_log:
            raise OptionsError("require_decision_log needs a decision_log path "
                               "(--require-decision-log without --decision-log)")
        if self.ejection_max < self.ejection_base:
            raise OptionsError(f"ejection_max must be >= ejection_base ({self.ejection_base:g})"
                               f", got {self.ejection_max!r}")
        self.core_config()  # margin, band, tie_break, hash_mode: fail now, in the core's words
        if self.group_stickiness == "off" and (self.group_body_field is not None
                                               or self.group_header != "x-group-id"):
            # The user named where groups come from, and nothing would ever read them.
            raise OptionsError("group_header and group_body_field name where a request's "
                               "group comes from, which group_stickiness 'off' never reads; "
                               "accepted with them: group_stickiness 'fallback' or 'only' "
                               "(--group-header/--group-body-field without "
                               "--group-stickiness)")
        if self.context_reuse and self.affinity_break_tokens is None:
            raise OptionsError("context_reuse scales the context band's c, so it needs "
                               "affinity_break_tokens (an integer >= 1), got None "
                               "(--context-reuse without --affinity-break-tokens)")
        if self.context_reuse and self.context_tokens == "off":
            raise OptionsError("context_reuse scales the prompt length, which context_tokens "
                               "'off' never counts; accepted with it: estimate, tokenize "
                               "(--context-reuse with --context-tokens off)")
        if self.context_reuse and self.full_determinism:
            # The core ignores c under full determinism: the meter would parse every kept
            # response and report a reuse that changes nothing.
            raise OptionsError("context_reuse scales the context band's c, which "
                               "full_determinism ignores (pins are always kept, new keys hashed); "
                               "accepted with it: full_determinism False "
                               "(--context-reuse with --full-determinism)")

    def core_config(self) -> Config:
        try:
            return Config(
                affinity_break_margin=self.margin,
                affinity_break_tokens=self.affinity_break_tokens,
                affinity_break_band_cap=self.affinity_break_band_cap,
                max_cache_size=self.cache_size,
                tie_break=self.tie_break,
                full_determinism=self.full_determinism,
                hash_mode=self.hash_mode,
                lease_accounting=self.lease_accounting,
                group_stickiness=self.group_stickiness,
                group_break_margin=self.group_break_margin,
                max_group_cache_size=self.max_group_cache_size,
                placement_margin=self.placement_margin,
            )
        except ConfigError as exc:
            raise OptionsError(_as_flags(str(exc))) from None
