"""The vectors' canonical JSON (spec/vectors/README.md, "Canonical JSON") and
``affinity vectors export DIR``.

* Every shipped file is written as the README says: integers in their one decimal form,
  floats only in a validation config or a malformed event and as Python's ``repr`` without
  an exponent, strings with only ``"``, ``\\`` and control characters escaped.
* The README's recipe for a consumer whose parser loses number text (``JSON.parse``)
  reproduces ``_info.sha256`` from the file text for every case -- and re-serialising such
  a parse does not, which is why the recipe is needed.
* The writer refuses a float the format does not allow.
* ``export`` writes the shipped tree with its README and schema, byte for byte, and
  refuses a destination that is not new or empty in one line with exit status 2.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from affinity_cli.main import main
from affinity_conformance.shipped import shipped_vectors
from affinity_conformance.vector_format import (
    MANIFEST_NAME,
    VectorError,
    case_text,
    float_problems,
    load_manifest,
    vector_files,
)
from affinity_core import canonical_dumps

VECTORS = shipped_vectors()
ROOT = Path(__file__).resolve().parents[2]
CASES = vector_files(VECTORS)
INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")
FLOAT = re.compile(r"-?(0|[1-9][0-9]*)\.[0-9]+")


def _number_texts(text: str) -> tuple[list[str], list[str]]:
    ints: list[str] = []
    floats: list[str] = []

    def keep_int(s: str) -> int:
        ints.append(s)
        return int(s)

    def keep_float(s: str) -> float:
        floats.append(s)
        return float(s)

    json.loads(text, parse_int=keep_int, parse_float=keep_float)
    return ints, floats


def test_every_number_has_its_canonical_text() -> None:
    float_files: set[str] = set()
    for path in CASES:
        ints, floats = _number_texts(path.read_text(encoding="utf-8"))
        assert all(INTEGER.fullmatch(t) and t != "-0" for t in ints), path
        for text in floats:
            assert FLOAT.fullmatch(text) and repr(float(text)) == text, (path, text)
            float_files.add(f"{path.parent.name}/{path.stem}")
        assert not float_problems(json.loads(path.read_text(encoding="utf-8"))), path
    # The README names these as the reason for the section; they must stay floats.
    assert {"validation/accepted_margin_integral_float",
            "validation/accepted_margin_negative_zero"} <= float_files


def test_keys_are_ascii_and_sorted_and_strings_escape_only_what_the_readme_says() -> None:
    for path in [*CASES, VECTORS / MANIFEST_NAME]:
        text = path.read_text(encoding="utf-8")

        def sorted_ascii_keys(members: list[tuple[str, Any]], at: Path = path) -> dict[str, Any]:
            keys = [k for k, _ in members]
            assert all(k.isascii() for k in keys) and keys == sorted(keys), (at, keys)
            return dict(members)

        json.loads(text, object_pairs_hook=sorted_ascii_keys)
        assert text.endswith("\n") and not text.endswith("\n\n") and "\r" not in text
        assert re.search(r"\\u(?!00[01][0-9a-f])", text) is None, path  # only control chars
    sample = {"s": "a\"b\\c/\u00e9\u2028\x01\x1f\t\n\x7f", "b": [True, None, -5, 0]}
    assert canonical_dumps(sample) == \
        '{"b":[true,null,-5,0],"s":"a\\"b\\\\c/\u00e9\u2028\\u0001\\u001f\\t\\n\x7f"}'


def _sha256_without_info_from_text(text: str) -> str:
    # The README's recipe, verbatim: "{" + text after the first "}," without the newline.
    body = "{" + text[text.index("},") + 2:-1]
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def _as_ecmascript_json_parse(value: Any) -> Any:
    """What JSON.parse gives back: one number type (2.0 -> 2, -0.0 -> 0, big ints rounded)."""
    if isinstance(value, dict):
        return {k: _as_ecmascript_json_parse(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_ecmascript_json_parse(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    as_double = float(value)
    return int(as_double) if as_double.is_integer() else as_double


def test_the_text_recipe_checks_every_digest_without_parsing_numbers() -> None:
    reserialised_wrong = []
    for path in CASES:
        text = path.read_text(encoding="utf-8")
        case = json.loads(text)
        assert text.startswith('{"_info":{'), path
        assert _sha256_without_info_from_text(text) == case["_info"]["sha256"], path
        body = {k: v for k, v in _as_ecmascript_json_parse(case).items() if k != "_info"}
        if hashlib.sha256(canonical_dumps(body).encode()).hexdigest() != case["_info"]["sha256"]:
            reserialised_wrong.append(f"{path.parent.name}/{path.stem}")
    # A plain JSON.parse consumer that re-serialises fails on the float and 64-bit cases.
    assert "validation/accepted_margin_negative_zero" in reserialised_wrong
    assert "validation/accepted_margin_integral_float" in reserialised_wrong


@pytest.mark.parametrize(("value", "where", "why"), [
    (1e16, ("config", "affinity_break_margin"), "no canonical text"),
    (1e-5, ("config", "affinity_break_margin"), "no canonical text"),
    (math.nan, ("config", "affinity_break_margin"), "no canonical text"),
    (2.0, ("initial_state", "affinity_kept"), "integers only"),
])
def test_the_writer_refuses_a_float_the_format_does_not_allow(
        value: float, where: tuple[str, str], why: str) -> None:
    case: dict[str, Any] = {"suite": "validation", "case": "x", "config": {},
                            "initial_state": {}}
    case[where[0]][where[1]] = value
    with pytest.raises(VectorError, match=why):
        case_text(case)
    case[where[0]][where[1]] = 3
    assert case_text(case).endswith("}\n")
    if where[0] == "config":  # the same float is fine where floats belong, if canonical
        case["config"]["affinity_break_margin"] = -0.0
        assert '"affinity_break_margin":-0.0' in case_text(case)


def test_export_writes_the_shipped_tree_with_readme_and_schema(tmp_path: Path) -> None:
    dest = tmp_path / "vectors"
    code, out, err = run("vectors", "export", str(dest))
    assert code == 0, err
    assert f"exported {len(CASES)} vectors with README.md" in out
    manifest = load_manifest(dest)
    copied = {str(p.relative_to(dest)) for p in vector_files(dest)}
    assert copied == set(manifest["files"]) and len(copied) == len(CASES)
    for rel in ["README.md", MANIFEST_NAME, "schema/vector.schema.json",
                "schema/manifest.schema.json", *sorted(copied)[:20]]:
        assert (dest / rel).read_bytes() == (VECTORS / rel).read_bytes(), rel
    assert "#### Canonical JSON" in (dest / "README.md").read_text(encoding="utf-8")
    spec = (dest / "SPEC.md").read_bytes()
    assert spec == (ROOT / "spec" / "SPEC.md").read_bytes()  # the spec itself, not a link
    assert not (dest / "SPEC.md").is_symlink()
    verified = run("vectors", "verify", "--dir", str(dest))
    assert verified[0] == 0, verified[2]


# [text](target): a markdown link; the target's #fragment is not a file.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(readme: Path) -> list[str]:
    """The targets of ``readme``'s links that are files relative to it."""
    targets = (t.split("#")[0] for t in LINK.findall(readme.read_text(encoding="utf-8")))
    return [t for t in targets if t and "://" not in t and not t.startswith("mailto:")]


def test_every_relative_link_of_the_vectors_readme_resolves_in_an_export(
        tmp_path: Path) -> None:
    dest = tmp_path / "exported"
    assert run("vectors", "export", str(dest))[0] == 0
    links = relative_links(dest / "README.md")
    assert "SPEC.md" in links  # the README cites the spec it is the executable half of
    broken = [t for t in links if not (dest / t).exists()]
    assert not broken, f"links of the exported README.md that resolve to nothing: {broken}"
    in_repo = [t for t in relative_links(VECTORS / "README.md")
               if not (VECTORS / t).exists()]
    assert not in_repo, f"links of spec/vectors/README.md that resolve to nothing: {in_repo}"


def test_relative_links_finds_a_broken_link(tmp_path: Path) -> None:
    """Negative control of the check above: a README linking outside its folder."""
    readme = tmp_path / "README.md"
    readme.write_text("See [the spec](../SPEC.md#r-keep-1), [web](https://example.org/x) "
                      "and [here](#suites).\n", encoding="utf-8")
    assert relative_links(readme) == ["../SPEC.md"]
    assert not (tmp_path / "../SPEC.md").exists()


def test_verify_takes_the_directory_as_a_positional_too(tmp_path: Path) -> None:
    dest = tmp_path / "vectors"
    assert run("vectors", "export", str(dest))[0] == 0
    code, out, err = run("vectors", "verify", str(dest))
    assert code == 0 and str(dest) in out, err
    case = dest / sorted(load_manifest(dest)["files"])[0]
    case.write_text(case.read_text(encoding="utf-8") + " ", encoding="utf-8")
    code, _, err = run("vectors", "verify", str(dest))  # the positional DIR is what is read
    assert code == 1 and "drift" in err, err
    one_clean_line(*_code_err(run("vectors", "verify", str(dest), "--dir", str(dest))),
                   "as DIR or --dir, not both")


def test_export_refuses_a_destination_that_is_not_new_or_empty(tmp_path: Path) -> None:
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine", encoding="utf-8")
    one_clean_line(*_code_err(run("vectors", "export", str(used))), str(used), "not empty")
    assert [p.name for p in used.iterdir()] == ["keep.txt"]
    a_file = tmp_path / "file"
    a_file.write_text("", encoding="utf-8")
    one_clean_line(*_code_err(run("vectors", "export", str(a_file / "sub"))), "is a file")
    one_clean_line(*_code_err(run("vectors", "export", str(a_file))), "not a directory")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run("vectors", "export", str(empty))[0] == 0  # an empty folder is fine


def run(*args: str) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of ``affinity ARGS``, in-process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def _code_err(result: tuple[int, str, str]) -> tuple[int, str]:
    assert len(result[2].strip().splitlines()) == 1, result[2]  # one line, no usage dump
    return result[0], result[2]


def one_clean_line(code: int, err: str, *needles: str) -> None:
    assert code == 2 and "Traceback" not in err, (code, err)
    for needle in needles:
        assert needle in err, (needle, err)
