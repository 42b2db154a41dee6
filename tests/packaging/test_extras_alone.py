"""Each extra, installed alone from the built wheel into a fresh venv, runs its doc's first
command from an empty folder.

A doc names one extra (``pip install 'affinity-routing[verl]'``); if the command after it
needs a module that only another extra (or the checkout's ``[tests]``) brings, a user
following the doc fails where the test suite, which installs everything, does not. So:

* ``[verl]``: from the bare wheel, docs/verl.md's no-GPU setup (the extra, then
  ``verl==0.9.1 --no-deps``) exactly as the error printed when verl's router module cannot
  be loaded gives it, then the doc's ``yaml-preflight`` and ``yaml-plugin`` examples, each
  run on its own;
* ``[vllm]``: ``affinity serve`` in front of one backend (a stub HTTP server standing in for
  vLLM) and one completion through it, as adapters/affinity_vllm/README.md starts;
* ``[sim]``: ``affinity simulate --preset smoke`` (README.md, sim/README.md);
* ``[proofs]``: ``affinity verify`` (README.md's quick start), on one obligation at the
  small scope to keep the leg short; the full run from the wheel and the sdist is in
  test_installed_package.py.

Every leg also checks ``affinity --version`` against pyproject.toml's version. One wheel
(the pure build: the compiled one changes nothing here) is built for all four; pip's cache
makes the installs a few tens of seconds each. About 3-4 minutes in all; marked ``slow``.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import venv
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from affinity_conformance.upstream import INSTALL_HINT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
    "version"]
VERL_DOC = ROOT / "docs" / "verl.md"
FENCE = re.compile(r"```(\w+)\n# (example|example-file): (\S+)\n(.*?)```", re.DOTALL)

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["RAY_AUTH_MODE"] = "disabled"  # Ray 2.60 would write ~/.ray/auth_token
    return env


def _run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)


def _ok(cmd: list[str], cwd: Path, timeout: float = 600) -> str:
    done = _run(cmd, cwd, timeout)
    assert done.returncode == 0, (f"{' '.join(cmd)} -> {done.returncode}\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory,
          copy_source: Callable[[Path], Path]) -> Path:
    base = tmp_path_factory.mktemp("extras-build")
    src = copy_source(base / "src")
    out = base / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out),
                            str(src)], cwd=base, capture_output=True, text=True,
                           env={**_env(), "AFFINITY_BUILD": "pure"}, timeout=900)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (found,) = out.glob("*.whl")
    return found


def _install(tmp_path: Path, requirement: str) -> Path:
    """A fresh venv with ``requirement`` (the wheel with one extra); returns its bin dir."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    bindir = env_dir / "bin"
    # --no-compile: byte-compiling Ray, SciPy and matplotlib would double the install time.
    _ok([str(bindir / "pip"), "install", "-q", "--no-compile", requirement], tmp_path)
    version = _ok([str(bindir / "affinity"), "--version"], tmp_path)
    assert version.startswith(f"affinity {VERSION};"), version
    return bindir


def _empty(tmp_path: Path) -> Path:
    work = tmp_path / "empty"
    work.mkdir()
    return work


def _hint_commands() -> list[list[str]]:
    """The ``pip install`` commands of the advice printed when verl's router module cannot
    be loaded, with the wheel standing in for the package index's name."""
    commands = [shlex.split(text) for text in re.findall(r"`(pip install [^`]+)`",
                                                         INSTALL_HINT)]
    assert len(commands) == 2, INSTALL_HINT
    return commands


def test_verl_extra_runs_the_docs_examples(wheel: Path, tmp_path: Path) -> None:
    """From the bare wheel, the loader's error gives the setup; its commands, run as
    printed (the package name resolves to the installed wheel, which no index has), make
    the docs' examples run."""
    bindir = _install(tmp_path, str(wheel))
    load = [str(bindir / "python"), "-c", "from affinity_conformance.upstream import "
            "load_upstream_router_module as load; load()"]
    refused = _run(load, tmp_path)
    assert refused.returncode != 0 and INSTALL_HINT in refused.stderr, refused.stderr
    for command in _hint_commands():
        assert command[:2] == ["pip", "install"], command
        _ok([str(bindir / "pip"), "install", "-q", "--no-compile", *command[2:]], tmp_path)
    blocks = {name: body for _lang, _kind, name, body in
              FENCE.findall(VERL_DOC.read_text(encoding="utf-8"))}
    work = _empty(tmp_path)
    (work / "router.yaml").write_text(blocks["router.yaml"], encoding="utf-8")
    for name in ("yaml-preflight", "yaml-plugin"):  # each alone, as a reader runs it
        _ok([str(bindir / "python"), "-c", blocks[name] + "\nimport sys\n"
             "if 'ray' in sys.modules:\n    sys.modules['ray'].shutdown()\n"], work)


class _StubBackend(http.server.BaseHTTPRequestHandler):
    """Answers every request with a small completion, the way vLLM's server would."""

    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        body = json.dumps({"object": "text_completion", "choices": [{"text": "hi"}]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *_: object) -> None:  # keep the test's output clean
        pass


@pytest.fixture
def stub_backend() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StubBackend)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_vllm_extra_serves_a_completion(wheel: Path, tmp_path: Path, stub_backend: str) -> None:
    bindir = _install(tmp_path, f"{wheel}[vllm]")
    port = _free_port()
    router = subprocess.Popen(
        [str(bindir / "affinity"), "serve", "--backend", stub_backend, "--margin", "2",
         "--host", "127.0.0.1", "--port", str(port)],
        cwd=_empty(tmp_path), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert router.poll() is None, router.communicate()
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as health:
                    if health.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "affinity serve did not become healthy"
            time.sleep(0.2)
        request = urllib.request.Request(
            f"{base}/v1/completions", data=b'{"model": "MODEL", "prompt": "hi"}',
            headers={"x-session-id": "conv-17", "content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 200
            assert reply.headers["x-affinity-backend"] == stub_backend
            assert json.loads(reply.read())["choices"][0]["text"] == "hi"
    finally:
        router.terminate()
        try:
            router.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            router.kill()
            router.communicate()


def test_sim_extra_runs_the_smoke_preset(wheel: Path, tmp_path: Path) -> None:
    bindir = _install(tmp_path, f"{wheel}[sim]")
    work = _empty(tmp_path)
    out = _ok([str(bindir / "affinity"), "simulate", "--preset", "smoke", "--no-progress"],
              work)
    assert "margin-2" in out and "Wilcoxon p" in out
    assert (work / "affinity-sim-smoke.json").is_file()
    assert (work / "affinity-sim-smoke.png").read_bytes()[:4] == b"\x89PNG"


def test_proofs_extra_runs_verify(wheel: Path, tmp_path: Path) -> None:
    bindir = _install(tmp_path, f"{wheel}[proofs]")
    out = _ok([str(bindir / "affinity"), "verify", "--scope", "small", "--only", "13"],
              _empty(tmp_path))
    assert "PASS" in out
