"""Warm restart of ``affinity serve`` from its decision log (R-LOG-3).

A router killed with SIGKILL under load and restarted on the same ``--decision-log``
continues from the log's state: at least 99% of the sticky sessions go to the backend
they had before the kill (measured; a cold start keeps about a third of them, which the
negative control checks), the requests the dead process had in flight are released as
abandoned and logged with that reason, and ``affinity replay`` of the whole log set --
the crashed run and the runs after it -- exits 0 and counts the runs. Clean restarts
after a crash never rotate the crash's log away.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from affinity_conformance.decision_log import read_log
from affinity_runtime.decision_log import DecisionLogWriter
from affinity_runtime.warm_start import ABANDONED

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
SESSIONS = 300
BODY = {"model": "tiny", "prompt": "hello there", "max_tokens": 8}


def _lines_until(proc: subprocess.Popen[str], pattern: str, timeout: float = 60) -> list[str]:
    """Output lines of ``proc`` up to and including the first matching ``pattern``."""
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen.append(line)
        if re.search(pattern, line):
            return seen
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"no line matching {pattern!r} (exit {proc.poll()}): {seen}")


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=ENV)


class Cluster:
    def __init__(self, tmp_path: Path) -> None:
        self.log = tmp_path / "logs" / "decisions.ndjson"
        self.log.parent.mkdir()  # the router creates no directories
        self.procs: list[subprocess.Popen[str]] = []
        self.backends: list[str] = []

    def start_stubs(self, n: int) -> None:
        for i in range(n):
            stub = _spawn("affinity_vllm.stub", "--name", f"s{i}", "--token-delay", "0.02",
                          "--max-num-seqs", "64")
            self.procs.append(stub)
            port = int(_lines_until(stub, r"^ready \d+")[-1].split()[1])
            self.backends.append(f"http://127.0.0.1:{port}")

    def start_router(self, *extra: str) -> tuple[subprocess.Popen[str], int, list[str]]:
        args = ["affinity_cli.main", "serve", "--port", "0", "--decision-log", str(self.log),
                "--health-interval", "60", *extra]
        for backend in self.backends:
            args += ["--backend", backend]
        router = _spawn(*args)
        self.procs.append(router)
        lines = _lines_until(router, r"listening on http://")
        port = int(re.findall(r":(\d+) ", lines[-1])[0])
        return router, port, lines

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()


async def _one(client: aiohttp.ClientSession, port: int, session: str) -> str | None:
    async with client.post(f"http://127.0.0.1:{port}/v1/completions", json=BODY,
                           headers={"x-session-id": session}) as resp:
        await resp.read()
        return resp.headers.get("x-affinity-backend") if resp.status == 200 else None


async def _each_session(port: int, sessions: list[str]) -> dict[str, str | None]:
    limit = asyncio.Semaphore(16)
    async with aiohttp.ClientSession() as client:
        async def go(session: str) -> tuple[str, str | None]:
            async with limit:
                return session, await _one(client, port, session)
        return dict(await asyncio.gather(*(go(s) for s in sessions)))


async def _load_then_kill(port: int, router: subprocess.Popen[str],
                          pinned: dict[str, str | None]) -> int:
    """Keep 32 requests of random sessions in flight, SIGKILL the router mid-load;
    ``pinned`` gets each completed answer's backend. Returns requests cut by the kill."""
    cut = 0
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as client:
        async def worker(k: int) -> None:
            nonlocal cut
            i = k
            while not stop.is_set():
                session = f"conv-{(i * 7919) % SESSIONS}"
                i += 32
                try:
                    backend = await _one(client, port, session)
                except aiohttp.ClientError:
                    cut += 1
                    return
                if backend is not None:
                    pinned[session] = backend

        workers = [asyncio.create_task(worker(k)) for k in range(32)]
        await asyncio.sleep(1.5)
        router.send_signal(signal.SIGKILL)
        router.wait(timeout=10)
        stop.set()
        await asyncio.gather(*workers)
    return cut


def _replay(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "affinity_cli.main", "replay",
                           *map(str, paths)], capture_output=True, text=True, timeout=300,
                          env=ENV, check=False)


def _same(before: dict[str, str | None], after: dict[str, str | None]) -> float:
    known = [s for s, b in before.items() if b is not None]
    return sum(after.get(s) == before[s] for s in known) / len(known)


def test_sigkill_under_load_then_restart_keeps_the_sticky_sessions(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    sessions = [f"conv-{i}" for i in range(SESSIONS)]
    try:
        cluster.start_stubs(3)
        first, port, _ = cluster.start_router()
        pinned = asyncio.run(_each_session(port, sessions))
        assert all(pinned.values()), "every session was answered before the load"
        assert len(set(pinned.values())) == 3  # spread over all backends
        cut = asyncio.run(_load_then_kill(port, first, pinned))
        assert first.returncode == -signal.SIGKILL
        assert cut > 0, "the kill hit requests in flight"

        second, port, lines = cluster.start_router()
        started = next(line for line in lines if "warm start" in line)
        abandoned = int(re.findall(r"(\d+) requests in flight released", started)[0])
        assert abandoned > 0, started
        after = asyncio.run(_each_session(port, sessions))
        kept = _same(pinned, after)
        assert kept >= 0.99, f"only {kept:.1%} of sticky sessions kept their backend"
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0

        # Negative control: the same restart, cold, loses most pins.
        third, port, lines = cluster.start_router("--cold-start")
        assert any("cold start, warm start is off" in line for line in lines), lines
        cold = _same(after, asyncio.run(_each_session(port, sessions)))
        assert cold < 0.9, f"a cold start kept {cold:.1%}: the warm check proves nothing"
        third.send_signal(signal.SIGTERM)
        assert third.wait(timeout=30) == 0
    finally:
        cluster.stop_all()

    files = DecisionLogWriter(cluster.log).files()
    done = _replay(*files)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 run(s)" in done.stdout, done.stdout
    releases = [r.data for r in read_log(files[-2]) if not r.is_header
                and r.data.get("reason") == ABANDONED]
    assert len(releases) == abandoned  # each abandoned request, released and logged
    assert all(r["event"]["op"] == "release" for r in releases)
    header = json.loads(files[-2].read_text(encoding="utf-8").split("\n", 1)[0])
    assert header["restart"] == {"mode": "warm", "previous_end": "crash",
                                 "abandoned": abandoned}


def _restarts(cluster: Cluster, *, crash: bool) -> list[Path]:
    """A first router -- SIGKILLed with requests in flight when ``crash``, else stopped
    cleanly -- then five routers each started and stopped with SIGTERM on the same log,
    as the deploys after it would, keeping 3 rotated files (the count that once deleted a
    crash). Returns the log's files, oldest first."""
    keep = ("--decision-log-keep", "3")
    first, port, _ = cluster.start_router(*keep)
    if crash:
        assert asyncio.run(_load_then_kill(port, first, {})) > 0  # the kill cut requests
    else:
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0
    for _ in range(5):
        router, port, _ = cluster.start_router(*keep)
        assert all(asyncio.run(_each_session(port, ["after"])).values())
        router.send_signal(signal.SIGTERM)
        assert router.wait(timeout=30) == 0
    return DecisionLogWriter(cluster.log).files()


def _previous_end(path: Path) -> object:
    header = json.loads(path.read_text(encoding="utf-8").split("\n", 1)[0])
    return header["restart"]["previous_end"] if "restart" in header else None


def test_clean_restarts_after_a_crash_keep_the_crash_log(tmp_path: Path) -> None:
    """Five clean restarts after a crash, with ``--decision-log-keep 3``: the crashed
    run's file and the restart that records the crash are kept beyond the count, and the
    whole set replays. The control makes the same restarts after a clean stop: the count
    then deletes the oldest runs, so the kept crash is the exception. (Its first SIGTERM
    comes as soon as the ready line is read: a clean stop too, exit 0.)"""
    cluster = Cluster(tmp_path)
    try:
        cluster.start_stubs(1)
        files = _restarts(cluster, crash=True)
        # the crash, the restart after it, 3 backups, the live file
        assert [_previous_end(f) for f in files][:2] == [None, "crash"], files
        assert len(files) == 6, files
        done = _replay(*files)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "6 run(s)" in done.stdout, done.stdout

        for path in DecisionLogWriter(cluster.log).files():
            path.unlink()
        files = _restarts(cluster, crash=False)
        assert len(files) == 4 and _previous_end(files[0]) == "stop", files
    finally:
        cluster.stop_all()
