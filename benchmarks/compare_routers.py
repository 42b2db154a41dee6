"""HTTP-correctness scenarios where vllm-router 0.1.17 once did better than ``affinity serve``,
run against both routers.

Theory of operation
-------------------
Each scenario starts its own backends in this process -- :mod:`affinity_vllm.rogue_backend`
(1xx, stray bytes; every answer carries its request's tag) or :mod:`affinity_vllm.stub`
(a well-behaved vLLM stand-in) -- then each router as a subprocess in front of them, runs
raw HTTP/1.1 exchanges on loopback, scores the outcome and stops the router by PID:

* ``interim_1xx`` -- 20 requests on one keep-alive connection, the backend sending 100 /
  102 / 103 before each answer: every client gets 200 with its own tag;
* ``stray_bytes`` -- answers followed by a copy of themselves, or by a whole extra
  response on the idle connection: every client still gets its own tag;
* ``trailers`` -- a chunked request whose trailer carries ``x-session-id`` and
  ``Authorization``: neither reaches the backend;
* ``request_target`` -- ``POST http://evil.example/v1/completions?a=1#frag``: the backend
  sees an origin-form target, without the scheme, host and fragment (the detail shows
  whether the query string survived);
* ``huge_json_number`` -- a 5,000-digit integer in the body: a 4xx, not a 5xx;
* ``drain_sigterm`` -- 8 keep-alive clients in a loop of POSTs, SIGTERM to the router:
  connections reset (0 is a pass).

Health thresholds (3 failures to remove, 2 successes to return) need each router's own
probe timing and are checked in ``tests/vllm/test_serve_http.py`` only.

Output: a JSON file and a markdown table (``--out``, default ``benchmarks/results``).
Run: ``python benchmarks/compare_routers.py [--routers-venv .venv-routers]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from affinity_vllm.rogue_backend import RogueBackend
from affinity_vllm.stub import StubOptions, StubServer

ROOT = Path(__file__).resolve().parents[1]
Scenario = Callable[[int, Any], Awaitable[tuple[bool, str]]]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def router_command(kind: str, port: int, backend: str, venv: Path) -> list[str]:
    if kind == "affinity":
        return [sys.executable, "-m", "affinity_cli.main", "serve", "--port", str(port),
                "--backend", backend, "--log-level", "WARNING", "--shutdown-grace", "5"]
    return [str(venv / "bin/vllm-router"), "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", backend, "--policy", "round_robin",
            "--prometheus-port", str(free_port()), "--log-level", "warning"]


def _post(tag: str, mode: str = "ok", target: bytes = b"/v1/completions",
          extra: bytes = b"", body: bytes | None = None) -> bytes:
    payload = body if body is not None else json.dumps(
        {"model": "tiny", "prompt": "hi", "max_tokens": 1, "tag": tag, "rogue": mode}).encode()
    return (b"POST " + target + b" HTTP/1.1\r\nHost: r\r\ncontent-type: application/json\r\n"
            b"x-request-tag: " + tag.encode() + b"\r\nx-rogue: " + mode.encode() + b"\r\n"
            + extra + b"content-length: %d\r\n\r\n" % len(payload) + payload)


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes, bytes]:
    """The final response (1xx skipped); Content-Length or chunked bodies."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if not 100 <= status < 200:
            break
    lower = head.lower()
    if b"transfer-encoding: chunked" in lower:
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if not size:
                await reader.readuntil(b"\r\n")
                return status, head, body
            body += (await reader.readexactly(size + 2))[:-2]
    length = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
    return status, head, await reader.readexactly(length)


async def _own_tags(port: int, modes: list[str], pause: float) -> tuple[bool, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    own = 0
    wrong: list[str] = []
    try:
        for i, mode in enumerate(modes):
            try:
                writer.write(_post(f"t{i}", mode))
                status, _, body = await asyncio.wait_for(_response(reader), 5)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
                wrong.append(f"t{i}: {type(exc).__name__}")
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                continue
            try:
                got = json.loads(body).get("id")
            except ValueError:
                got = body[:40].decode(errors="replace")
            if status == 200 and got == f"t{i}":
                own += 1
            else:
                wrong.append(f"t{i}: {status} {got!r}")
            await asyncio.sleep(pause)
    finally:
        writer.close()
    return not wrong, f"{own}/{len(modes)} own answers" + (f"; {wrong[:3]}" if wrong else "")


async def interim_1xx(port: int, backend: Any) -> tuple[bool, str]:
    return await _own_tags(port, ["interim", "ok"] * 10, 0.0)


async def stray_bytes(port: int, backend: Any) -> tuple[bool, str]:
    backend.stray_delay = 0.02
    return await _own_tags(port, ["stray_after", "ok", "stray_idle", "ok"] * 5, 0.1)


async def _exchange(port: int, raw: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        status, _, body = await asyncio.wait_for(_response(reader), 10)
        return status, body
    finally:
        writer.close()


async def trailers(port: int, backend: Any) -> tuple[bool, str]:
    payload = json.dumps({"model": "tiny", "prompt": "hi", "tag": "tr", "rogue": "ok"}).encode()
    raw = (b"POST /v1/completions HTTP/1.1\r\nHost: r\r\ncontent-type: application/json\r\n"
           b"transfer-encoding: chunked\r\n\r\n%x\r\n" % len(payload) + payload
           + b"\r\n0\r\nx-session-id: trailer-key\r\nauthorization: Bearer secret\r\n\r\n")
    status, _ = await _exchange(port, raw)
    seen = [h for _, h in backend.requests if b"authorization" in h or b"x-session-id" in h]
    return status < 500 and not seen, f"status {status}; trailer fields at backend: {len(seen)}"


async def request_target(port: int, backend: Any) -> tuple[bool, str]:
    status, _ = await _exchange(port, _post(
        "rt", target=b"http://evil.example/v1/completions?a=1#frag"))
    targets = [t for t, _ in backend.requests]
    # The scheme, authority and fragment must not reach the backend (origin form).
    ok = bool(targets) and all(t.startswith(b"/") and b"evil" not in t and b"#" not in t
                               for t in targets)
    return ok, f"status {status}; backend saw {[t.decode() for t in targets][:2]}"


async def huge_json_number(port: int, backend: Any) -> tuple[bool, str]:
    body = b'{"model": "tiny", "prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}"
    status, _ = await _exchange(port, _post("big", body=body))
    return 400 <= status < 500, f"status {status}"


async def drain_sigterm(port: int, proc: subprocess.Popen[bytes]) -> tuple[bool, str]:
    outcomes: dict[str, int] = {}

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for i in range(200):
                writer.write(_post(f"d{i}").replace(b"x-request-tag", b"x-session-id"))
                _, head, _ = await asyncio.wait_for(_response(reader), 10)
                if b"connection: close" in head.lower():
                    await reader.read()
                    outcomes["told to close"] = outcomes.get("told to close", 0) + 1
                    return
            outcomes["never told"] = outcomes.get("never told", 0) + 1
        except (ConnectionResetError, asyncio.IncompleteReadError, BrokenPipeError):
            outcomes["reset"] = outcomes.get("reset", 0) + 1
        except asyncio.TimeoutError:
            outcomes["timeout"] = outcomes.get("timeout", 0) + 1
        finally:
            writer.close()

    clients = [asyncio.create_task(client()) for _ in range(8)]
    await asyncio.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    await asyncio.gather(*clients)
    return outcomes.get("reset", 0) == 0, f"of 8 clients: {outcomes}"


SCENARIOS: list[tuple[str, str, Scenario]] = [
    ("interim_1xx", "rogue", interim_1xx),
    ("stray_bytes", "rogue", stray_bytes),
    ("trailers", "rogue", trailers),
    ("request_target", "rogue", request_target),
    ("huge_json_number", "stub", huge_json_number),
    ("drain_sigterm", "stub", drain_sigterm),
]


async def _ready(port: int) -> bool:
    try:
        status, _ = await _exchange(port, _post("ready"))
        return status == 200
    except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError):
        return False


async def run_one(kind: str, name: str, backend_kind: str, scenario: Scenario, venv: Path,
                  log_dir: Path) -> dict[str, Any]:
    backend: Any
    if backend_kind == "rogue":
        backend = RogueBackend()
        await backend.start()
    else:
        backend = StubServer(StubOptions(name="s", delay=0.05))
        await backend.start()
    port = free_port()
    log = log_dir / f"{kind}-{name}.log"
    with open(log, "wb") as handle:
        proc = subprocess.Popen(router_command(kind, port, backend.url, venv), stdout=handle,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while not await _ready(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                return {"router": kind, "scenario": name, "pass": False,
                        "detail": f"router not ready: {log.read_text()[-300:]}"}
            await asyncio.sleep(0.3)
        if backend_kind == "rogue":
            backend.requests.clear()
        passed, detail = await scenario(port, proc if name == "drain_sigterm" else backend)
        return {"router": kind, "scenario": name, "pass": passed, "detail": detail}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        await backend.stop()


def table(results: list[dict[str, Any]]) -> str:
    by = {(r["router"], r["scenario"]): r for r in results}
    lines = ["| scenario | affinity serve | vllm-router 0.1.17 |", "|---|---|---|"]
    for name, _, _ in SCENARIOS:
        cells = []
        for kind in ("affinity", "vllm-router"):
            r = by.get((kind, name))
            cells.append("-" if r is None else
                         f"{'pass' if r['pass'] else 'FAIL'}: {r['detail']}".replace("|", "/"))
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--routers-venv", type=Path, default=ROOT / ".venv-routers")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    parser.add_argument("--only", choices=["affinity", "vllm-router"], default=None)
    args = parser.parse_args(argv)
    kinds = [args.only] if args.only else ["affinity", "vllm-router"]
    if "vllm-router" in kinds and not (args.routers_venv / "bin/vllm-router").exists():
        sys.exit(f"no vllm-router in {args.routers_venv}: pip install vllm-router==0.1.17")
    args.out.mkdir(parents=True, exist_ok=True)
    log_dir = args.out / "compare_routers_logs"
    log_dir.mkdir(exist_ok=True)

    async def run_all() -> list[dict[str, Any]]:
        results = []
        for name, backend_kind, scenario in SCENARIOS:
            for kind in kinds:
                result = await run_one(kind, name, backend_kind, scenario, args.routers_venv,
                                       log_dir)
                print(f"{kind:12} {name:18} {'pass' if result['pass'] else 'FAIL'} "
                      f"{result['detail']}", flush=True)
                results.append(result)
        return results

    results = asyncio.run(run_all())
    (args.out / "compare_routers.json").write_text(json.dumps(results, indent=1) + "\n")
    markdown = table(results)
    (args.out / "compare_routers.md").write_text(markdown + "\n")
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
