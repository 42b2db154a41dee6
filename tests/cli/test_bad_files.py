"""Bad files, and implementations that misbehave, given to ``affinity``: one line naming
the file, the field and what is accepted; exit status 2 (or 1 where the implementation
fails); no traceback.

Each case guards a failure a new user's pass found: a workload file with a list where a name
belongs or a non-list ``policies`` (TypeError tracebacks), a constant below what the
simulator uses (``turns = -1`` ran, silently clamped), sizes that fill memory before the
first step, a decision log or vector whose event ``op`` is a list (TypeError traceback),
a log whose ``seq`` is ``true`` (passed as 1), and an IMPL calling ``sys.exit(0)``
(``affinity check`` exited 0, silently).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from .clirun import ROOT, one_clean_line, run


def test_simulate_workload_file_errors_are_one_line(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("a: [\n")
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe")
    folder = tmp_path / "dir.toml"
    folder.mkdir()
    for path, needle in ((bad_yaml, "invalid YAML at line 2 column 1: expected the node"),
                         (binary, "not UTF-8 text (invalid start byte at byte 0)"),
                         (folder, "is a directory")):
        code, _, err = run("simulate", "--preset", str(path), "--no-save")
        assert len(err.strip().splitlines()) == 1, err
        one_clean_line(code, err, needle)



def test_an_impl_that_exits_is_never_a_pass(tmp_path: Path) -> None:
    """A module or balancer calling sys.exit(0) made ``affinity check`` exit 0, silently."""
    at_import = tmp_path / "exits_at_import.py"
    at_import.write_text("import sys\nsys.exit(0)\n")
    code, _, err = run("check", f"{at_import}:Balancer", "--budget", "0")
    one_clean_line(code, err, "called sys.exit(0)")
    mid_check = tmp_path / "exits_mid_check.py"
    mid_check.write_text(
        (ROOT / "tests" / "conformance" / "broken_balancers.py").read_text(encoding="utf-8")
        + "\n\nclass ExitingBalancer(MiniBalancer):\n"
          "    def acquire_server(self, *args: Any, **kwargs: Any) -> Any:\n"
          "        raise SystemExit(0)\n")
    code, _, err = run("check", f"{mid_check}:ExitingBalancer", "--budget", "0",
                       "--out", str(tmp_path / "o"))
    one_clean_line(code, err, "called sys.exit(0) while being checked", status=1)


def _decision_log(tmp_path: Path) -> list[dict[str, object]]:
    from affinity_verl import AffinityLoadBalancer

    path = tmp_path / "decisions.ndjson"
    lb = AffinityLoadBalancer(servers={"s0": None, "s1": None}, affinity_break_margin=1,
                              decision_log=str(path))
    for rid in ("a", "b", "a"):
        lb.acquire_server(request_id=rid)
    lb.release_server(server_id="s0")
    del lb
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(("field", "value", "status", "needle"), [
    (("event", "op"), [], 2, "event op must be an event name, got list"),  # a traceback
    (("event", "op"), {"a": 1}, 2, "event op must be an event name, got dict"),
    (("seq",), True, 1, "seq True where 1 was due"),  # true == 1 in Python: was accepted
])
def test_replay_wrong_json_types(tmp_path: Path, field: tuple[str, ...], value: object,
                                 status: int, needle: str) -> None:
    records = _decision_log(tmp_path)
    target: Any = records[2]  # the second event record (seq 1)
    for key in field[:-1]:
        target = target[key]
    target[field[-1]] = value
    bad = tmp_path / "bad.ndjson"
    bad.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, _, err = run("replay", str(bad))
    assert code == status and "Traceback" not in err, err
    assert needle in err, err


def test_vector_with_a_non_string_op_is_bad_input(tmp_path: Path) -> None:
    """Was a TypeError traceback from the codec (unhashable op)."""
    vectors = tmp_path / "v"
    shutil.copytree(ROOT / "spec" / "vectors", vectors)
    case = vectors / "legacy" / "acquire_release_acquire_keeps_server.json"
    data = json.loads(case.read_text())
    data["steps"][0]["event"]["op"] = ["acquire"]
    case.write_text(json.dumps(data))
    code, _, err = run("check", "affinity_verl:AffinityLoadBalancer", "--vectors", str(vectors),
                       "--suite", "legacy", "--budget", "0")
    one_clean_line(code, err, "steps[0].event.op: must be an event name, got list")


WORKLOAD = """name = "t"
seeds = 1
policies = ["legacy", "margin-1"]
[[workloads]]
name = "w"
replicas = 4
prompts = 8
samples = 4
max_context = 2048
turns = {dist = "uniform_int", low = 1, high = 4}
prompt_tokens = 200
output_tokens = 300
tool_tokens = 100
tool_latency_s = 0.1
"""


@pytest.mark.parametrize(("change", "needle"), [
    # a constant below what the simulator uses was clamped silently (turns = -1 ran)
    (("turns = {", "turns = -1\n#"), "workloads[0].turns must be >= 1, got -1"),
    (("prompt_tokens = 200", "prompt_tokens = -5"), "prompt_tokens must be >= 1, got -5"),
    (("tool_latency_s = 0.1", "tool_latency_s = -1"), "tool_latency_s must be >= 0, got -1"),
    # these were TypeError tracebacks
    (('policies = ["legacy", "margin-1"]', "policies = 5"),
     "'policies' must be a list of policy names, got 5"),
    (('name = "w"', "name = [1]"), "workloads[0].name must be a string, got [1]"),
    (('turns = {dist = "uniform_int", low = 1, high = 4}', "turns = {dist = [1]}"),
     "workloads[0].turns: malformed distribution"),
    # sizes that would fill memory before the first step
    (("seeds = 1", "seeds = 1000000"), "seeds must be in [1, 100000], got 1000000"),
    (("prompts = 8", "prompts = 1000000"), "prompts x samples must be at most 1,000,000"),
    (("replicas = 4", "replicas = 100000"), "replicas must be in [1, 65536], got 100000"),
])
def test_workload_file_values_are_checked(tmp_path: Path, change: tuple[str, str],
                                          needle: str) -> None:
    assert change[0] in WORKLOAD
    path = tmp_path / "w.toml"
    path.write_text(WORKLOAD.replace(change[0], change[1], 1))
    code, out, err = run("simulate", "--preset", str(path), "--no-save", "--workers", "1",
                         "--no-progress")
    one_clean_line(code, err, needle)
    assert "simulated steps" not in out




def test_vectors_generate_never_replaces_a_folder_that_is_not_a_vector_tree(
        tmp_path: Path) -> None:
    """``--out .`` in a project deleted every ``<dir>/<file>.json`` there (and empty dirs)."""
    project = tmp_path / "project"
    (project / "config").mkdir(parents=True)
    settings = project / "config" / "settings.json"
    settings.write_text('{"keep": true}\n')
    (project / "empty").mkdir()
    code, _, err = run("vectors", "generate", "--out", str(project))
    one_clean_line(code, err, "is not empty and holds no MANIFEST.json")
    assert settings.read_text() == '{"keep": true}\n' and (project / "empty").is_dir()


def test_replay_streams_and_bounds_what_it_reads(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole file was read into memory: /dev/zero or a huge log was a MemoryError."""
    if Path("/dev/zero").exists():
        code, _, err = run("replay", "/dev/zero")
        one_clean_line(code, err, "/dev/zero: a device, not a log file")
    monkeypatch.setattr("affinity_conformance.decision_log.MAX_LINE_CHARS", 64)
    long_line = tmp_path / "long.ndjson"
    long_line.write_text("x" * 1000 + "\n")
    code, _, err = run("replay", str(long_line))
    one_clean_line(code, err, "long.ndjson:1: line longer than 64 characters")


def test_replay_names_a_missing_file_as_missing(tmp_path: Path) -> None:
    """A mistyped name is "no such file", not a malformed log, even after a good file;
    a file that exists but is not a log is still "malformed" (the control)."""
    missing = tmp_path / "decisions.ndjson"
    code, _, err = run("replay", str(missing))
    line = one_clean_line(code, err, f"{missing}: no such file")
    assert "malformed" not in line
    not_a_log = tmp_path / "notes.txt"
    not_a_log.write_text("hello\n")
    code, _, err = run("replay", str(not_a_log), str(missing))
    one_clean_line(code, err, f"{missing}: no such file")
    code, _, err = run("replay", str(tmp_path))
    one_clean_line(code, err, f"{tmp_path}: is a directory")
    code, _, err = run("replay", str(not_a_log))
    one_clean_line(code, err, "malformed log", str(not_a_log))
