"""``affinity vectors generate|verify``: rebuild or verify the conformance vectors.

``verify`` compares a fresh in-memory generation with a directory (default: the vectors
shipped in the package, which are ``spec/vectors/`` in a checkout). ``generate`` is a
writer, so it takes an explicit ``--out`` (``--out spec/vectors`` in a checkout).

Exit status: 0 the vectors match (verify) or were written (generate); 1 verify found
differences; 2 bad input -- a directory option that is missing or a file (an input
directory is never read as empty), an ``--out`` that cannot be created or is a non-empty
folder without a vector manifest (generate would replace its ``*/*.json`` files), or a
generation failure -- with a one-line message and no traceback.
"""

from __future__ import annotations

import argparse
import sys

from affinity_cli.paths import existing_dir, output_dir

from .counterexamples import TraceError
from .generate import (
    COUNTEREXAMPLE_DIR,
    REGRESSION_DIR,
    build_vectors,
    verify_tree,
    write_tree,
)
from .scenario import ScenarioError
from .shipped import shipped_vectors
from .vector_format import MANIFEST_NAME, VectorError

__all__ = ["register"]

DEFAULT_DIR = shipped_vectors()


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="vectors_command", metavar="ACTION", required=True)
    gen = sub.add_parser("generate", help="rebuild every vector, the manifest included",
                         description="Rebuild every conformance vector deterministically.")
    gen.add_argument("--out", type=output_dir, required=True, metavar="DIR",
                     help="output directory, required (in a checkout: spec/vectors); case "
                          "files and the manifest are replaced, README and schema kept")
    ver = sub.add_parser("verify", help="fail if the committed vectors differ from a rebuild",
                         description="Regenerate in memory and compare with a directory.")
    ver.add_argument("--dir", type=existing_dir, default=DEFAULT_DIR,
                     help=f"vector directory (default: the shipped vectors, {DEFAULT_DIR})")
    for p in (gen, ver):
        p.add_argument("--counterexamples", type=existing_dir, default=COUNTEREXAMPLE_DIR,
                       help="proof counterexample traces (default: the shipped "
                            f"proofs/counterexamples, {COUNTEREXAMPLE_DIR})")
        p.add_argument("--regressions", type=existing_dir, default=REGRESSION_DIR,
                       help="shrunk failing traces kept as regressions (default: "
                            f"{REGRESSION_DIR})")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    out = getattr(args, "out", None)
    if out is not None and out.is_dir() and any(out.iterdir()) and not (
            out / MANIFEST_NAME).is_file():
        # generate replaces every <dir>/<file>.json under --out: in a folder that is not a
        # vector tree (`--out .` in a project) that would delete the project's files.
        print(f"affinity vectors generate: --out {out} is not empty and holds no "
              f"{MANIFEST_NAME} (not a vector tree); its */*.json files would be replaced: "
              "choose a new or empty directory", file=sys.stderr)
        return 2
    try:
        vectors = build_vectors(regression_dir=args.regressions,
                                counterexample_dir=args.counterexamples)
    except (VectorError, TraceError, ScenarioError) as exc:
        print(f"affinity vectors: generation failed: {exc}", file=sys.stderr)
        return 2
    if args.vectors_command == "generate":
        count = write_tree(args.out, vectors)
        suites: dict[str, int] = {}
        for rel in vectors:
            suite = rel.split("/", 1)[0]
            suites[suite] = suites.get(suite, 0) + 1
        listing = ", ".join(f"{s} {n}" for s, n in suites.items())
        print(f"wrote {count} vectors to {args.out} ({listing})")
        return 0
    problems = verify_tree(args.dir, vectors)
    if problems:
        print(f"{args.dir}: {len(problems)} difference(s) from a fresh generation:",
              file=sys.stderr)
        for line in problems[:50]:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"{args.dir}: {len(vectors)} vectors and the manifest match a fresh generation")
    return 0
