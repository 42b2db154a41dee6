"""Routers under test: presets, command templates, start/stop, settle probes, pool admin.

Theory of operation
-------------------
A :class:`Preset` says how to start one router in front of the recording fleet and what
the harness may use to observe it:

* ``template``: the command, one token per argument. Placeholders: ``{port}`` (the
  router's port), ``{metrics_port}``, ``{backends}`` (a token that expands to one argument
  per backend URL), ``{backend}`` inside a token (the token is repeated per backend, e.g.
  ``--backend={backend}``), ``{python}`` (this interpreter), ``{routers}`` (the venv with
  the Rust routers), ``{margin}`` (the claimed margin, or ``none``), ``{cache_size}``
  (the claimed sticky-map capacity), ``{band_tokens}`` and ``{band_cap}`` (the claimed
  context band's ``T`` and cap, or ``none``), ``{admin_port}`` (a free port for a
  pool API on its own port);
* ``session_header``: where the router reads the session key;
* ``settle``: how the harness knows the router has seen a completion before the next
  acquire -- ``status`` polls ``affinity serve``'s ``/status`` until ``total_inflight``
  equals the requests the fleet still holds; ``smg`` polls sglang-router's Prometheus
  gauge ``smg_worker_requests_active`` the same way; ``delay`` has nothing to poll and
  relies on the calibrated settle delay alone (which is always applied as well);
* ``pool``: ``vllm-admin`` if the router has an API to remove and re-add workers
  (vllm-router's ``/remove_worker`` and ``/add_worker``), ``affinity-admin`` for
  ``affinity serve``'s pool API on ``{admin_port}`` (``/backends/add``, ``/remove``,
  ``/drain``: removals alternate between remove and drain), else None (no pool changes).

:class:`RouterProcess` starts a command in its own process group, waits until a request
without a session key is answered (sglang-router registers workers asynchronously after
it starts listening), measures the round-trip of a few such requests (the settle delay is
calibrated from it), and stops the group by PID.

The Rust routers live in their own venv, created on first use with ``pip install
vllm-router==0.1.17 sglang-router==0.3.2`` -- the same pins as
``benchmarks/bench_router.py``. Its default (:func:`default_routers_venv`) is
``.venv-routers`` in a checkout and a per-user cache folder otherwise: from a wheel the
package sits in site-packages, which is no place for a 220 MB venv (and may be read-only).
Every venv path is made absolute against the directory the command was started in before
it is used, because the router process runs in another working directory.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import attrs

from .fleet import MODEL

__all__ = ["DEFAULT_ROUTERS_VENV", "PRESETS", "ROUTER_PACKAGES", "Preset", "PresetError",
           "RouterProcess", "default_routers_venv", "ensure_routers_venv", "expand",
           "free_port", "routers_available"]

ROUTER_PACKAGES = ("vllm-router==0.1.17", "sglang-router==0.3.2")
REPO_ROOT = Path(__file__).resolve().parents[2]


def default_routers_venv(repo_root: Path = REPO_ROOT) -> Path:
    """``<checkout>/.venv-routers`` in a checkout (``repo_root`` holds ``pyproject.toml``);
    otherwise ``$XDG_CACHE_HOME/affinity-routing/venv-routers`` (``~/.cache`` when unset),
    never inside site-packages."""
    if (repo_root / "pyproject.toml").is_file():
        return repo_root / ".venv-routers"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).absolute() / "affinity-routing" / "venv-routers"


DEFAULT_ROUTERS_VENV = default_routers_venv()


class PresetError(ValueError):
    """A bad preset name, template or router start."""


class RouterExited(PresetError):
    """The router exited before it answered: a bad command, or a port picked free that
    another process took before the router could bind it."""


@attrs.frozen
class Preset:
    name: str
    template: tuple[str, ...]
    session_header: str
    claim: str          # the policy the router's documentation implies
    settle: str         # status | smg | delay
    pool: str | None    # vllm-admin | affinity-admin | None
    needs_routers_venv: bool
    about: str
    cache_flag: str | None = None  # passes a non-default claimed cache size, e.g. --cache-size
    # flags that pass a claimed context band's T and cap, appended only when one is claimed
    band_flags: tuple[str, str] | None = None


def _vllm(policy: str) -> tuple[str, ...]:
    return ("{routers}/bin/vllm-router", "--host", "127.0.0.1", "--port", "{port}",
            "--worker-urls", "{backends}", "--policy", policy,
            "--prometheus-port", "{metrics_port}", "--log-level", "warning")


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("affinity", ("{python}", "-m", "affinity_cli.main", "serve", "--host", "127.0.0.1",
                        "--port", "{port}", "--backend={backend}", "--margin", "{margin}",
                        "--admin-port", "{admin_port}", "--log-level", "WARNING"),
           "x-session-id", "margin=2", "status", "affinity-admin", False,
           "affinity serve with the claimed margin and context band (override with "
           "--router-extra)",
           cache_flag="--cache-size",
           band_flags=("--affinity-break-tokens", "--affinity-break-band-cap")),
    Preset("vllm-router:sticky_least_loaded", _vllm("sticky_least_loaded"), "x-session-id",
           "legacy", "delay", "vllm-admin", True,
           "vllm-router 0.1.17, sticky_least_loaded: never migrates for load"),
    Preset("vllm-router:consistent_hash", _vllm("consistent_hash"), "x-session-id",
           "deterministic", "delay", "vllm-admin", True,
           "vllm-router 0.1.17, consistent_hash: placement by a hash ring of the key"),
    Preset("sglang-router:manual",
           ("{routers}/bin/python", "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
            "--port", "{port}", "--worker-urls", "{backends}", "--policy", "manual",
            "--prometheus-port", "{metrics_port}", "--log-level", "warn"),
           "x-smg-routing-key", "legacy", "smg", None, True,
           "sglang-router 0.3.2, manual: sticky on x-smg-routing-key"),
)}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def expand(template: Sequence[str], *, port: int, metrics_port: int, backends: Sequence[str],
           routers: Path, margin: int | None, cache_size: int = 10000,
           band: tuple[int, int] | None = None, admin_port: int = 0) -> list[str]:
    """The command line for ``template`` (see the module docstring for placeholders)."""
    values = {"port": str(port), "metrics_port": str(metrics_port), "python": sys.executable,
              "routers": str(Path(routers).absolute()),
              "margin": "none" if margin is None else str(margin),
              "cache_size": str(cache_size),
              "band_tokens": "none" if band is None else str(band[0]),
              "band_cap": "none" if band is None else str(band[1]),
              "admin_port": str(admin_port)}
    out: list[str] = []
    for token in template:
        if token == "{backends}":
            out += list(backends)
            continue
        try:
            if "{backend}" in token:
                out += [token.replace("{backend}", b).format(**values) for b in backends]
            else:
                out.append(token.format(**values))
        except (KeyError, IndexError, ValueError) as exc:
            raise PresetError(f"router command token {token!r}: unknown or malformed "
                              f"placeholder ({exc}); known: {{port}}, {{metrics_port}}, "
                              "{backends}, {backend}, {python}, {routers}, {margin}, "
                              "{cache_size}, {band_tokens}, {band_cap}, {admin_port}") from None
    return out


def parse_template(text: str) -> tuple[str, ...]:
    try:
        tokens = tuple(shlex.split(text))
    except ValueError as exc:  # unbalanced quotes: name the option and the value
        raise PresetError(f"--router-cmd {text!r}: {exc}") from None
    if not tokens:
        raise PresetError("--router-cmd is empty")
    if not any("{port}" in t for t in tokens):
        raise PresetError(f"--router-cmd must contain {{port}}, got {text!r}")
    if not any(t == "{backends}" or "{backend}" in t for t in tokens):
        raise PresetError(f"--router-cmd must contain {{backends}} or {{backend}}, got {text!r}")
    return tokens


def routers_available(venv: Path = DEFAULT_ROUTERS_VENV) -> bool:
    return (venv / "bin/vllm-router").exists() and (venv / "bin/python").exists()


def ensure_routers_venv(venv: Path = DEFAULT_ROUTERS_VENV) -> Path:
    """Create ``venv`` with the pinned routers when missing (about 30 s, 220 MB); the
    absolute path of the venv."""
    venv = venv.absolute()
    marker = venv / ".affinity-routers"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin/pip"), "install", "-q", *ROUTER_PACKAGES], check=True)
        marker.write_text(" ".join(ROUTER_PACKAGES) + "\n")
    return venv


class RouterProcess:
    """One started router (see the module docstring); use as an async context manager."""

    def __init__(self, command: Sequence[str], url: str, log_path: Path) -> None:
        self.command, self.url, self.log_path = list(command), url, log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.round_trip = 0.0  # median seconds of an unkeyed request, measured at start

    async def start(self, session: aiohttp.ClientSession, timeout: float = 60.0) -> None:
        with open(self.log_path, "ab") as log:
            try:
                self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True,
                                             cwd=REPO_ROOT)
            except OSError as exc:
                raise PresetError(f"cannot start router {self.command[0]!r}: {exc}") from None
        deadline = time.monotonic() + timeout
        while not await self._answers(session):
            if self.proc.poll() is not None:
                raise RouterExited(f"router exited with status {self.proc.returncode}: "
                                   f"{self._log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise PresetError(f"router not ready after {timeout:.0f} s: {self._log_tail()}")
            await asyncio.sleep(0.1)
        times = []
        for _ in range(5):
            started = time.perf_counter()
            await self._answers(session)
            times.append(time.perf_counter() - started)
        self.round_trip = statistics.median(times)

    async def _answers(self, session: aiohttp.ClientSession) -> bool:
        body = {"model": MODEL, "prompt": "ready?", "max_tokens": 1}
        try:
            async with session.post(self.url + "/v1/completions", json=body,
                                    timeout=aiohttp.ClientTimeout(total=5)) as resp:
                await resp.read()
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    def _log_tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return text[-1500:].strip() or "(empty log)"

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
