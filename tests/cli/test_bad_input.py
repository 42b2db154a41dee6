"""A new user's bad input to every ``affinity`` subcommand: exit status 2 (or the
documented one) with one line naming the value and what is accepted, no traceback, and
nothing created or changed -- checked before any long run starts.

Each case below guards a failure a new user's pass found: a traceback after the run (``verify
--json``, ``simulate --json``, ``check --out``, ``check-router --out``, ``vectors generate
--out``), a wrong status (``vectors verify --dir /missing`` listed 298 "missing" vectors
and exited 1; ``--counterexamples /missing`` was read as an empty directory), a 60 s wait
(``check-router --url http://h:70000``), minutes of Ray retries (``simulate --address``
at a dead port), a silently empty run (``simulate --policies ,``), a message that named
neither option nor value (unbalanced quotes in ``--router-extra``; ``serve --host`` that
does not resolve), a wrong bound (``seed must be an integer in [0, 9.22337e+18]``), a
``--png`` name the figure was not written to, a huge count that would exhaust memory or
start thousands of processes before failing (``check-router --backends 3000`` ended in a
FleetError traceback), or a Ctrl-C traceback.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from affinity_cli.main import EXIT_STATUS, SUBCOMMANDS

from .clirun import one_clean_line, run


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "plain.txt"
    path.write_text("not a directory\n")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------ exit status documented
@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_help_ends_with_its_exit_status(name: str) -> None:
    code, out, _ = run(name, "--help")
    assert code == 0
    tail = " ".join(out.split()[-80:])
    assert "exit status: 0 " in tail and "; 2 " in tail, tail
    assert " ".join(EXIT_STATUS[name].split()) in " ".join(out.split())


# One bad option per subcommand: the status is the documented usage status, 2.
USAGE_ERRORS = {
    "verify": ["--only", "99"],
    "serve": ["--backend", "http://127.0.0.1:0"],
    "simulate": ["--preset", "no-such-preset"],
    "check": ["affinity_verl:AffinityLoadBalancer", "--budget", "-1"],
    "check-router": ["--preset", "affinity", "--pool-percent", "101"],
    "replay": ["/no/such/log.ndjson"],
    "vectors": ["verify", "--dir", "/no/such/dir"],
}


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_the_documented_usage_status_is_the_real_one(name: str) -> None:
    assert "; 2 bad" in EXIT_STATUS[name] or "; 2 malformed" in EXIT_STATUS[name]
    code, _, err = run(name, *USAGE_ERRORS[name])
    one_clean_line(code, err)


def test_no_subcommand_prints_help_and_exits_2() -> None:
    code, out, _ = run()
    assert code == 2 and "exit status: 2 for a usage error" in " ".join(out.split())


# ------------------------------------------------------------ output paths, before any work
def test_verify_output_paths_fail_before_any_proof(tmp_path: Path, a_file: Path) -> None:
    for args, needle in (
            (["--json", str(tmp_path)], "is a directory; expected a file name"),
            (["--json", str(tmp_path / "no" / "r.json")], "does not exist"),
            (["--json", str(a_file / "r.json")], "is a file"),
            (["--json", ""], "expected a path, got an empty string"),
            (["--write-counterexamples", str(a_file)], "exists and is not a directory"),
            (["--write-counterexamples", str(a_file / "cx")], "is a file")):
        code, out, err = run("verify", *args)
        one_clean_line(code, err, f"argument {args[0]}", needle)
        assert out == ""  # no table: nothing ran
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.txt"]  # nothing created


def test_check_and_check_router_out_must_be_a_directory(a_file: Path) -> None:
    code, _, err = run("check", "affinity_verl:AffinityLoadBalancer", "--out", str(a_file))
    one_clean_line(code, err, "argument --out", "exists and is not a directory")
    code, _, err = run("check-router", "--preset", "affinity", "--out", str(a_file / "x"))
    one_clean_line(code, err, "argument --out", "is a file")


def test_vectors_directories_are_checked(tmp_path: Path, a_file: Path) -> None:
    for args, needle in (
            (["verify", "--dir", str(tmp_path / "missing")], "no such directory"),
            (["verify", "--dir", str(a_file)], "is a file; expected a directory"),
            (["verify", "--counterexamples", str(tmp_path / "missing")], "no such directory"),
            (["generate", "--out", "v", "--regressions", str(a_file)], "is a file"),
            (["generate", "--out", str(a_file)], "exists and is not a directory")):
        code, _, err = run("vectors", *args)
        one_clean_line(code, err, needle)
    assert not Path("v").exists()


# ---------------------------------------------------------------------------- simulate
def test_simulate_checks_outputs_and_names_before_the_sweep(tmp_path: Path,
                                                            a_file: Path) -> None:
    base = ["simulate", "--preset", "smoke", "--no-progress", "--workers", "1"]
    for args, needle in (
            (["--json", str(a_file / "r.json")], "--json: "),
            (["--json", str(tmp_path)], "is a directory"),
            (["--png", str(tmp_path / "figure")], "must end in .png, .svg, .pdf"),
            (["--png", str(tmp_path / "figure.txt")], "must end in .png"),
            (["--address", "not-an-address"], "is not a Ray address; accepted: auto"),
            (["--address", "127.0.0.1:70000"], "port in [1, 65535]"),
            (["--address", f"127.0.0.1:{_free_port()}"], "cannot connect to 127.0.0.1:"),
            (["--policies", ","], "expected comma-separated names, got ','"),
            (["--workers", "100000"], "--workers must be in [1, 1024], got 100000"),
            (["--seeds", "1000000000"], "--seeds must be in [1, 100000], got 1000000000"),
            (["--workloads", " , "], "expected comma-separated names")):
        code, out, err = run(*base, *args)
        one_clean_line(code, err, needle)
        assert "simulated steps" not in out  # refused before the sweep
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.txt"]


# ------------------------------------------------------------------------- check-router
def test_check_router_url_is_checked_at_once(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("affinity_conformance.router_check.cli.URL_PATIENCE", 0.5)
    base = ["check-router", "--fleet-ports", "18001,18002,18003", "--policy", "legacy",
            "--out", str(tmp_path)]
    for url in ("not-a-url", "ftp://h:1", "http://127.0.0.1:70000", "http://127.0.0.1:0"):
        code, _, err = run(*base, "--url", url)
        one_clean_line(code, err, "argument --url", "port in [1, 65535]", repr(url))
    refused = f"http://127.0.0.1:{_free_port()}"
    code, _, err = run(*base, "--url", refused)  # seconds, not the 60 s probe wait
    one_clean_line(code, err, f"--url {refused}: cannot connect to")


def test_unbalanced_quotes_name_the_option() -> None:
    code, _, err = run("check-router", "--preset", "affinity", "--router-extra='--margin 1")
    one_clean_line(code, err, "--router-extra", "No closing quotation")
    code, _, err = run("check-router", "--router-cmd", "r \"{port} {backends}",
                       "--policy", "legacy")
    one_clean_line(code, err, "--router-cmd", "No closing quotation")


# -------------------------------------------------------------------------------- serve
@pytest.mark.parametrize(("args", "needle"), [
    (["--backend", "http://127.0.0.1:0"], "invalid port (accepted: 1..65535)"),
    (["--backend", "http://h:1", "--seed", "-1"],
     "seed must be an integer in [0, 9223372036854775807], got -1"),
    (["--backend", "http://h:1", "--cache-size", "0"],
     "cache_size must be an integer in [1, 1000000000], got 0"),
    (["--backend", "http://h:1", "--decision-log="],  # ran with no log at all
     "decision_log must be a file path (or omitted), got ''"),
])
def test_serve_bounds_are_exact(args: list[str], needle: str) -> None:
    code, _, err = run("serve", *args)
    one_clean_line(code, err, needle)


def test_serve_refuses_a_decision_log_in_a_missing_directory(tmp_path: Path) -> None:
    """The router creates no directories: a mistyped one is a bad option, found before
    the port is bound, and nothing is created."""
    log = tmp_path / "no-such-dir" / "sub" / "decisions.ndjson"
    code, out, err = run("serve", "--backend", "http://127.0.0.1:1", "--port", "0",
                         "--decision-log", str(log))
    one_clean_line(code, err, f"--decision-log {log}",
                   f"directory {log.parent} does not exist")
    assert "listening" not in out
    assert sorted(tmp_path.iterdir()) == []


def test_decision_log_check_accepts_an_existing_directory(tmp_path: Path,
                                                          a_file: Path) -> None:
    from affinity_vllm.cli import decision_log_problem

    assert decision_log_problem(None) is None
    assert decision_log_problem(str(tmp_path / "decisions.ndjson")) is None
    assert decision_log_problem(str(tmp_path / "new-run.ndjson")) is None
    under_a_file = decision_log_problem(str(a_file / "decisions.ndjson"))
    assert under_a_file is not None and "is not a directory" in under_a_file


@pytest.mark.parametrize(("backends", "margin", "summary"), [
    (1, None, "1 backend, margin off (null)"),
    (2, 0, "2 backends, margin 0"),
    (3, 2, "3 backends, margin 2"),
])
def test_serve_startup_summary_reads_as_english(backends: int, margin: int | None,
                                                summary: str) -> None:
    from affinity_vllm.cli import startup_summary
    from affinity_vllm.options import RouterOptions

    urls = tuple(f"http://127.0.0.1:{8001 + i}" for i in range(backends))
    assert startup_summary(RouterOptions(backends=urls, margin=margin)) == summary


def test_serve_unresolvable_host_names_the_host() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "affinity_cli.main", "serve", "--backend", "http://127.0.0.1:1",
         "--host", "no-such-host.invalid", "--port", "0"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    one_clean_line(proc.returncode, proc.stderr,
                   "cannot listen on --host 'no-such-host.invalid'", status=1)


# ------------------------------------------------------------------ huge values, Ctrl-C
@pytest.mark.parametrize(("argv", "needle"), [
    (["check", "affinity_verl:AffinityLoadBalancer", "--budget", "100001"],
     "expected an integer in [0, 100000], got 100001"),
    (["check", "affinity_verl:AffinityLoadBalancer", "--length", "1000000000"],
     "expected an integer in [1, 100000], got 1000000000"),
    (["check-router", "--preset", "affinity", "--backends", "3000"],
     "argument --backends: expected an integer in [1, 64], got 3000"),
    (["check-router", "--url", "http://127.0.0.1:1", "--policy", "legacy", "--fleet-ports",
      ",".join(str(20000 + i) for i in range(65))], "expected 1..64 distinct ports"),
    (["check-router", "--preset", "affinity", "--length", "10001"],
     "argument --length: expected an integer in [1, 10000], got 10001"),
])
def test_huge_counts_are_refused_with_the_range(argv: list[str], needle: str) -> None:
    code, _, err = run(*argv)
    one_clean_line(code, err, needle)


def test_ctrl_c_is_one_line_and_status_130(monkeypatch: pytest.MonkeyPatch) -> None:
    import affinity_conformance.cli_replay as replay

    def interrupted(_args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(replay, "run", interrupted)
    code, _, err = run("replay", "any.ndjson")
    one_clean_line(code, err, "affinity replay: interrupted", status=130)
    assert "130 interrupted (Ctrl-C)" in " ".join(run("replay", "--help")[1].split())


@pytest.mark.parametrize(("argv", "needle"), [
    (["simulate", "--preset", "smoke", "--json", "r.json", "--no-save"],
     "--json names a file to write; it cannot go with --no-save"),
    (["simulate", "--preset", "smoke", "--png", "f.png", "--no-save"], "--png names a file"),
    (["check-router", "--url", "http://127.0.0.1:9", "--fleet-ports", "18001",
      "--policy", "legacy", "--router-extra=--margin 1"],
     "--router-extra '--margin 1' cannot go with --url"),
])
def test_conflicting_options_are_refused(argv: list[str], needle: str) -> None:
    """Each pair is refused, not accepted with one option silently ignored."""
    code, _, err = run(*argv)
    one_clean_line(code, err, needle)


def test_serve_prints_a_usable_url_for_an_ipv6_host() -> None:
    """It printed http://::1:PORT, which no client can parse."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 sockets on this machine")
    proc = subprocess.Popen(
        [sys.executable, "-m", "affinity_cli.main", "serve", "--backend", "http://127.0.0.1:1",
         "--host", "::1", "--port", "0", "--log-level", "ERROR"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert line.startswith("affinity serve: listening on http://[::1]:"), line


def test_serve_on_a_port_in_use_exits_1_naming_the_address() -> None:
    """The documented status for a router that cannot start."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "affinity_cli.main", "serve", "--backend",
             "http://127.0.0.1:1", "--port", str(port)],
            capture_output=True, text=True, timeout=60)
    line = one_clean_line(proc.returncode, proc.stderr, "address already in use", status=1)
    assert f"('127.0.0.1', {port})" in line
    assert "could not start (the address is in use" in EXIT_STATUS["serve"]


def _sigint_at_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_a_pooled_simulation_at_once() -> None:
    """With --no-ray the process pool finished every queued step first: Ctrl-C took a
    minute or more. The terminal's SIGINT goes to the whole process group, as here."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "affinity_cli.main", "simulate", "--preset", "pr7435",
         "--no-save", "--no-progress", "--workers", "2", "--no-ray"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        # A terminal's foreground job starts with Ctrl-C at its default action; a test
        # runner started in the background (``nohup ... &``) ignores SIGINT, and an ignored
        # SIGINT is inherited across exec, where Python honours it and never interrupts.
        preexec_fn=_sigint_at_default)
    try:
        time.sleep(3)  # the pool is up and simulating
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    one_clean_line(proc.returncode, err, "affinity simulate: interrupted", status=130)
