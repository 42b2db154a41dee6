"""``affinity serve``: every option documented, bad values named, a real process run."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import attrs
import pytest
from affinity_vllm.cli import options_from_args
from affinity_vllm.options import OptionsError, RouterOptions, normalise_backend_url

from affinity_cli.main import build_parser, main

# RouterOptions field -> the flag that sets it
_FLAG_OF = {"backends": "--backend", "lease_accounting": "--no-lease-accounting",
            "retry": "--no-retry", "warm_start": "--cold-start",
            "admin_token": "--admin-token-file"}


def _help() -> str:
    parser = build_parser(["serve"])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve: argparse.ArgumentParser = sub.choices["serve"]
    return serve.format_help()


def test_help_documents_every_option() -> None:
    text = _help()
    for field in attrs.fields(RouterOptions):
        flag = _FLAG_OF.get(field.name, "--" + field.name.replace("_", "-"))
        assert re.search(rf"^\s+{re.escape(flag)}\b", text, re.M), flag
    assert "affinity serve --backend http://127.0.0.1:8001" in text  # the example
    assert "default: 127.0.0.1" in text  # loopback by default


def test_args_map_onto_options() -> None:
    parser = build_parser(["serve"])
    args = parser.parse_args([
        "serve", "--backend", "http://127.0.0.1:1/", "--backend", "http://localhost:2",
        "--margin", "2", "--tie-break", "hashed", "--session-body-field", "user",
        "--scrape-metrics", "--no-lease-accounting", "--port", "0"])
    options = options_from_args(args)
    assert options.backends == ("http://127.0.0.1:1", "http://localhost:2")
    assert options.margin == 2 and options.tie_break == "hashed"
    assert options.session_body_field == "user" and options.scrape_metrics
    assert not options.lease_accounting
    config = options.core_config()
    assert config.affinity_break_margin == 2 and not config.lease_accounting
    assert build_parser(["serve"]).parse_args(
        ["serve", "--backend", "http://h:1", "--margin", "none"]).margin is None


@pytest.mark.parametrize(("argv", "message"), [
    (["--margin", "-1"], "margin must be null or an integer >= 0"),
    (["--margin", "two"], "margin must be 'none' or an integer >= 0, got 'two'"),
])
def test_bad_margin_is_a_usage_error(argv: list[str], message: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--backend", "http://h:1", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--backend", "ftp://h:1"], "backend must be an http:// base URL"),
    (["--backend", "https://h:1"], "https:// backends are not supported"),
    (["--backend", "http://h:1", "--health-failure-threshold", "0"],
     "health_failure_threshold must be an integer in [1, 1000000], got 0"),
    (["--backend", "http://h:1", "--health-success-threshold", "0"],
     "health_success_threshold must be an integer in [1, 1000000], got 0"),
    (["--backend", "http://h:1", "--body-memory-budget", "2048"],
     "body_memory_budget must be >= max_body_bytes (8388608)"),
    (["--backend", "http://h:1/v1"], "must not have a path"),
    (["--backend", "http://h:1", "--backend", "http://h:1/"], "duplicates"),
    (["--backend", "http://h:1", "--cache-size", "0"], "cache_size must be an integer in [1,"),
    (["--backend", "http://h:1", "--port", "70000"], "port must be an integer in [0, 65535]"),
    (["--backend", "http://h:1", "--upstream-timeout", "0"], "upstream_timeout must be"),
    (["--backend", "http://h:1", "--max-body-bytes", "10"], "max_body_bytes must be"),
    (["--backend", "http://h:1", "--session-header", "bad header"], "session_header"),
])
def test_bad_values_name_option_value_and_range(argv: list[str], message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err


def test_options_validate_in_code_too() -> None:
    with pytest.raises(OptionsError, match="at least one backend"):
        RouterOptions(backends=())
    with pytest.raises(OptionsError, match="tie_break must be one of"):
        RouterOptions(backends=("http://h:1",), tie_break="coin")
    assert normalise_backend_url(" http://[::1]:8443/ ") == "http://[::1]:8443"
    # https:// passed validation and then failed every request as "refused"
    with pytest.raises(OptionsError, match=r"https:// backends are not supported.*http://"):
        normalise_backend_url("https://[::1]:8443")


def _read_line(proc: subprocess.Popen[str], pattern: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if re.search(pattern, line):
            return line
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"no line matching {pattern!r} (exit {proc.poll()})")


def test_serve_process_routes_and_stops_on_sigterm() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    stub = subprocess.Popen([sys.executable, "-m", "affinity_vllm.stub", "--name", "p"],
                            stdout=subprocess.PIPE, text=True, env=env)
    router: subprocess.Popen[str] | None = None
    try:
        stub_port = int(_read_line(stub, r"^ready \d+").split()[1])
        router = subprocess.Popen(
            [sys.executable, "-m", "affinity_cli.main", "serve", "--backend",
             f"http://127.0.0.1:{stub_port}", "--port", "0", "--margin", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        line = _read_line(router, r"listening on http://127\.0\.0\.1:\d+")
        port = int(re.findall(r":(\d+) ", line)[0])
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", method="POST",
            data=json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 2}).encode(),
            headers={"content-type": "application/json", "x-session-id": "cli"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert json.loads(resp.read())["backend"] == "p"
            assert resp.headers["x-affinity-path"] == "new"
        router.send_signal(signal.SIGTERM)
        assert router.wait(timeout=10) == 0
    finally:
        for proc in (router, stub):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


README = Path(__file__).resolve().parents[2] / "adapters" / "affinity_vllm" / "README.md"
STUB_BLOCK = re.compile(r"```bash\n# example: stub-fleet\n(.*?)```", re.S)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(shutil.which("curl") is None, reason="the block uses curl")
def test_readme_stub_fleet_block_runs_as_written(tmp_path: Path) -> None:
    """The README's copy-paste block (two stubs, the router, two turns of a session) runs
    in bash as a reader runs it; only its ports are swapped for free ones, and
    ``python``/``affinity`` are this environment's."""
    (block,) = STUB_BLOCK.findall(README.read_text(encoding="utf-8"))
    ports = {"8001": _free_port(), "8002": _free_port(), "8080": _free_port()}
    script = re.sub(r"\b(8001|8002|8080)\b", lambda m: str(ports[m.group(1)]), block)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, command in (("python", f'exec "{sys.executable}" "$@"'),
                          ("affinity", f'exec "{sys.executable}" -m affinity_cli.main "$@"')):
        shim = bindir / name
        shim.write_text(f"#!/bin/sh\n{command}\n", encoding="utf-8")
        shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the block left running
    assert proc.returncode == 0, out
    paths = re.findall(r"^x-affinity-path: (\S+)", out, re.M | re.I)
    backends = re.findall(r"^x-affinity-backend: (\S+)", out, re.M | re.I)
    assert paths == ["new", "kept"], out
    assert len(backends) == 2 and backends[0] == backends[1], out
    assert backends[0] in {f"http://127.0.0.1:{ports['8001']}",
                           f"http://127.0.0.1:{ports['8002']}"}, out
