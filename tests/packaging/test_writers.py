"""Writers take explicit output paths: nothing is written into the package or the cwd.

* ``affinity verify --write-counterexamples DIR`` writes the regenerated Z3 witnesses to
  DIR (byte-equal to the shipped ones) and still checks against the shipped ones;
* ``affinity vectors generate`` requires ``--out DIR`` and writes exactly the shipped tree.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from affinity_proofs import jobs

from affinity_cli.main import build_parser
from affinity_conformance.shipped import shipped_counterexamples, shipped_vectors


def test_write_counterexamples_takes_a_directory(tmp_path: Path) -> None:
    args = build_parser(["verify"]).parse_args(["verify", "--write-counterexamples", "cx"])
    assert args.write_counterexamples == Path("cx")
    rows = jobs.counterexample_job(tmp_path / "cx")
    assert all(row.passed for row in rows), [row.detail for row in rows]
    written = sorted(p.name for p in (tmp_path / "cx").iterdir())
    shipped = sorted(p.name for p in shipped_counterexamples().glob("*.json"))
    assert written == shipped and len(written) >= 5
    for name in written:
        assert (tmp_path / "cx" / name).read_bytes() == \
            (shipped_counterexamples() / name).read_bytes()


def test_vectors_generate_needs_an_output_directory(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "affinity_cli.main", "vectors", "generate"]
    missing = subprocess.run(cli, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and "--out" in missing.stderr
    done = subprocess.run([*cli, "--out", "v"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    out, shipped = tmp_path / "v", shipped_vectors()
    made = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.json"))
    want = sorted(p.relative_to(shipped).as_posix() for p in shipped.rglob("*.json")
                  if not p.relative_to(shipped).as_posix().startswith("schema/"))
    assert made == want
    assert all((out / rel).read_bytes() == (shipped / rel).read_bytes() for rel in made)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v"]
