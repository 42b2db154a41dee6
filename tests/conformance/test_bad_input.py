"""Bad input to ``affinity check`` / ``affinity replay`` / ``affinity vectors``: a clear
one-line error naming the file and line (or step) and what was expected; exit status 2;
never a traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

from affinity_cli.main import main

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "spec" / "vectors"
BROKEN = ROOT / "tests" / "conformance" / "broken_balancers.py"


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def _assert_clean_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)


# ------------------------------------------------------------------ IMPL paths
@pytest.mark.parametrize(("impl", "needles"), [
    ("no_colon_here", ["expected module:Class"]),
    ("no_such_module_xyz:Thing", ["importing 'no_such_module_xyz' failed",
                                  "ModuleNotFoundError"]),
    ("affinity_verl:NoSuchClass", ["has no attribute 'NoSuchClass'", "AffinityLoadBalancer"]),
    ("affinity_verl:DEFAULT_TIE_BREAK", ["is a str, not a class or factory"]),
    (f"{BROKEN}:NotABalancer", ["missing verl balancer methods", "acquire_server"]),
    ("/nonexistent/impl.py:Balancer", ["no such file"]),
    (f"{BROKEN}:", ["both the module and the attribute"]),
])
def test_bad_impl_is_explained(impl: str, needles: list[str], tmp_path: Path) -> None:
    code, _, err = run("check", impl, "--budget", "0", "--out", str(tmp_path))
    _assert_clean_error(code, err, *needles)


@pytest.mark.parametrize("name", ["router.mjs", "src/router.rs", "router_impl"])
def test_impl_in_another_language_points_to_the_other_routes(name: str,
                                                             tmp_path: Path) -> None:
    # 'router.mjs:Router' must not read "importing 'router.mjs' failed: ModuleNotFoundError:
    # No module named 'router'".
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("export class Router {}\n")
    code, _, err = run("check", f"{path}:Router", "--budget", "0", "--out", str(tmp_path))
    _assert_clean_error(code, err, "is not Python", "affinity vectors export DIR",
                        "affinity replay", "affinity check-router")
    assert len(err.strip().splitlines()) == 1


def test_impl_with_syntax_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad_impl.py"
    bad.write_text("class Balancer:\n    def acquire_server(self\n")
    code, _, err = run("check", f"{bad}:Balancer", "--budget", "0")
    _assert_clean_error(code, err, "syntax error", "bad_impl.py:2")


def test_impl_whose_constructor_always_fails(tmp_path: Path) -> None:
    bad = tmp_path / "ctor.py"
    bad.write_text("class Balancer:\n    def __init__(self, *a, **k):\n"
                   "        raise RuntimeError('no GPU')\n")
    code, _, err = run("check", f"{bad}:Balancer", "--budget", "0")
    _assert_clean_error(code, err, "cannot construct it", "no GPU")


def test_bad_options(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc, contextlib.redirect_stderr(io.StringIO()):
        main(["check", "affinity_verl:AffinityLoadBalancer", "--budget", "-3"])
    assert exc.value.code == 2


# --------------------------------------------------------------------- vectors
@pytest.fixture
def vector_dir(tmp_path: Path) -> Path:
    out = tmp_path / "vectors"
    (out / "legacy").mkdir(parents=True)
    for name in ("first_tie_avalanche.json", "single_server_takes_everything.json"):
        shutil.copy(VECTORS / "legacy" / name, out / "legacy" / name)
    return out


def _check(vectors: Path) -> tuple[int, str, str]:
    return run("check", "affinity_verl:AffinityLoadBalancer", "--vectors", str(vectors),
               "--budget", "0")


def test_good_vector_dir_passes(vector_dir: Path) -> None:
    code, out, _ = _check(vector_dir)
    assert code == 0 and "legacy          pass" in out


def test_vector_with_invalid_json(vector_dir: Path) -> None:
    path = vector_dir / "legacy" / "first_tie_avalanche.json"
    path.write_text('{"format": "affinity-vector/1",\n "suite": "legacy",\n "case": ,\n}')
    code, _, err = _check(vector_dir)
    _assert_clean_error(code, err, "first_tie_avalanche.json:3:10", "not valid JSON")


def test_vector_with_malformed_step(vector_dir: Path) -> None:
    path = vector_dir / "legacy" / "first_tie_avalanche.json"
    data = json.loads(path.read_text())
    data["steps"][2]["event"] = {"op": "acquire", "request_id": ""}
    path.write_text(json.dumps(data))
    code, _, err = _check(vector_dir)
    _assert_clean_error(code, err, "first_tie_avalanche.json: steps[2].event",
                        "request_id must be a non-empty string")


def test_vector_with_missing_field(vector_dir: Path) -> None:
    path = vector_dir / "legacy" / "first_tie_avalanche.json"
    data = json.loads(path.read_text())
    del data["initial_state"]
    path.write_text(json.dumps(data))
    code, _, err = _check(vector_dir)
    _assert_clean_error(code, err, "missing required field 'initial_state'")


def test_vector_edited_by_hand(vector_dir: Path) -> None:
    path = vector_dir / "legacy" / "first_tie_avalanche.json"
    data = json.loads(path.read_text())
    data["steps"][0]["expect"]["server_id"] = "s1"
    path.write_text(json.dumps(data))
    code, _, err = _check(vector_dir)
    _assert_clean_error(code, err, "_info.sha256 does not match")


def test_vector_dir_missing_or_empty(tmp_path: Path) -> None:
    code, _, err = _check(tmp_path / "nowhere")
    _assert_clean_error(code, err, "no such vector directory")
    code, _, err = _check(tmp_path)
    _assert_clean_error(code, err, "no vectors")


def test_vector_dir_given_as_its_manifest_file(vector_dir: Path) -> None:
    shutil.copy(VECTORS / "MANIFEST.json", vector_dir / "MANIFEST.json")
    code, _, err = _check(vector_dir / "MANIFEST.json")
    _assert_clean_error(code, err, "is a file; --vectors takes the vector directory")
    assert f"use {vector_dir}" in err


def test_vectors_verify_reports_drift(vector_dir: Path) -> None:
    code, _, err = run("vectors", "verify", "--dir", str(vector_dir))
    assert code == 1 and "missing:" in err and "Traceback" not in err


# ------------------------------------------------------------------------ logs
@pytest.mark.parametrize(("text", "needles"), [
    ("", ["empty file"]),
    ("hello world\n", [":1: not valid JSON"]),
    ('{"format": "other/1"}\n', [":1: expected header with format"]),
    ('[1, 2]\n', [":1: expected a JSON object"]),
])
def test_malformed_log_files(tmp_path: Path, text: str, needles: list[str]) -> None:
    path = tmp_path / "log.ndjson"
    path.write_text(text)
    code, _, err = run("replay", str(path))
    _assert_clean_error(code, err, *needles)


def test_garbled_log_line_names_its_column(tmp_path: Path) -> None:
    # A record cut short mid-object, followed by more records: the column is where the
    # line stops (not "column 1", the start of the next line).
    path = tmp_path / "log.ndjson"
    path.write_text(_header() + '{"seq":0,"event":{"op"\n' + _header())
    code, _, err = run("replay", str(path))
    _assert_clean_error(code, err, "log.ndjson:2: not valid JSON: Expecting ':' delimiter "
                                   "at column 23")


def _header() -> str:
    return json.dumps({"format": "affinity-log/1", "seq": 0, "config": {},
                       "state": {"servers": [["s0", 0]], "lru": [], "affinity_kept": 0,
                                 "affinity_broken": 0}}) + "\n"


def test_log_record_missing_fields(tmp_path: Path) -> None:
    path = tmp_path / "log.ndjson"
    path.write_text(_header() + json.dumps({"seq": 0, "event": {"op": "acquire",
                                                                 "request_id": "a"}}) + "\n")
    code, _, err = run("replay", str(path))
    _assert_clean_error(code, err, "log.ndjson:2: record is missing", "outcome")


def test_log_record_with_bad_event(tmp_path: Path) -> None:
    path = tmp_path / "log.ndjson"
    record = {"seq": 0, "event": {"op": "teleport"}, "outcome": {}, "summary": {}}
    path.write_text(_header() + json.dumps(record) + "\n")
    code, _, err = run("replay", str(path))
    _assert_clean_error(code, err, "log.ndjson:2: event", "event.op must be one of")


def test_log_path_problems(tmp_path: Path) -> None:
    code, _, err = run("replay", str(tmp_path / "missing.ndjson"))
    _assert_clean_error(code, err, "missing.ndjson: no such file")
    assert "malformed" not in err
    code, _, err = run("replay", str(tmp_path))
    _assert_clean_error(code, err, "is a directory")
    binary = tmp_path / "binary.ndjson"
    binary.write_bytes(b"\xff\xfe\x00garbage\n")
    code, _, err = run("replay", str(binary))
    _assert_clean_error(code, err, "not UTF-8")


def test_vector_listed_in_manifest_but_missing(tmp_path: Path) -> None:
    tree = tmp_path / "vectors"
    shutil.copytree(VECTORS, tree, ignore=shutil.ignore_patterns("README.md"))
    (tree / "legacy" / "first_tie_avalanche.json").unlink()
    code, _, err = _check(tree)
    _assert_clean_error(code, err, "MANIFEST.json lists 1 file(s) that are missing",
                        "legacy/first_tie_avalanche.json")
