"""``affinity vectors generate|verify|export``: rebuild, verify or export the vectors.

``verify [DIR]`` compares a fresh in-memory generation with a directory (``DIR`` or
``--dir DIR``; default: the vectors shipped in the package, which are ``spec/vectors/`` in
a checkout). ``generate`` is a writer, so it takes an explicit ``--out`` (``--out
spec/vectors`` in a checkout). ``export DIR`` copies the shipped tree as a consumer in
another language needs it -- the README (the consumer contract), ``SPEC.md`` (the
specification the README cites), ``MANIFEST.json``, ``schema/*.json`` and every case the
manifest lists -- byte for byte, checking each case against the manifest; it works from
an installed wheel, without a checkout.

Exit status: 0 the vectors match (verify), were written (generate) or exported (export);
1 verify found differences; 2 bad input -- a directory option that is missing or a file
(an input directory is never read as empty), an ``--out`` that cannot be created or is a
non-empty folder without a vector manifest (generate would replace its ``*/*.json``
files), an export ``DIR`` that exists and is not empty or cannot be written, a shipped
file that is missing or differs from the manifest, or a generation failure -- with a
one-line message and no traceback.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from affinity_cli.paths import dir_problem, existing_dir, output_dir

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
from .vector_format import MANIFEST_NAME, VectorError, file_digest, load_manifest

__all__ = ["EXPORTED_DOCUMENTS", "export_tree", "register"]

DEFAULT_DIR = shipped_vectors()
# Copied beside the cases by `export`: the consumer contract and the specification it
# cites (SPEC.md is, in a checkout, a link from spec/vectors/ to spec/SPEC.md, so the
# README's relative link to it resolves in the repository and in an export alike).
EXPORTED_DOCUMENTS = ("README.md", "SPEC.md")


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="vectors_command", metavar="ACTION", required=True)
    gen = sub.add_parser("generate", help="rebuild every vector, the manifest included",
                         description="Rebuild every conformance vector deterministically.")
    gen.add_argument("--out", type=output_dir, required=True, metavar="DIR",
                     help="output directory, required (in a checkout: spec/vectors); case "
                          "files and the manifest are replaced, README and schema kept")
    ver = sub.add_parser("verify", help="fail if the committed vectors differ from a rebuild",
                         description="Regenerate in memory and compare with a directory.")
    # DIR as a positional too, as export takes it: `verify DIR` is what people type.
    ver.add_argument("positional_dir", nargs="?", type=existing_dir, default=None,
                     metavar="DIR", help="vector directory (the same as --dir DIR)")
    ver.add_argument("--dir", type=existing_dir, default=None,
                     help=f"vector directory (default: the shipped vectors, {DEFAULT_DIR})")
    exp = sub.add_parser("export", help="copy the shipped vectors with their README, the "
                                        "spec and the schema",
                         description="Write the shipped vector tree (README.md, SPEC.md, "
                                     "MANIFEST.json, schema/, <suite>/<case>.json) to a new "
                                     "or empty DIR, for a consumer that does not use Python.")
    exp.add_argument("dir", type=Path, metavar="DIR",
                     help="destination: a new directory or an empty one")
    for p in (gen, ver):
        p.add_argument("--counterexamples", type=existing_dir, default=COUNTEREXAMPLE_DIR,
                       help="proof counterexample traces (default: the shipped ones, "
                            f"{COUNTEREXAMPLE_DIR}; proofs/counterexamples in a checkout)")
        p.add_argument("--regressions", type=existing_dir, default=REGRESSION_DIR,
                       help="shrunk failing traces kept as regressions (default: "
                            f"{REGRESSION_DIR})")
    parser.set_defaults(run=run)


def export_tree(source: Path, dest: Path) -> int:
    """Copy the vector tree at ``source`` to ``dest``; the number of cases copied.

    Raises VectorError when a listed case is missing or differs from the manifest, or the
    README or schema is missing: an export is complete or refused.
    """
    manifest = load_manifest(source)
    schemas = sorted(p.relative_to(source) for p in (source / "schema").glob("*.json"))
    documents = [Path(name) for name in EXPORTED_DOCUMENTS]
    absent = [str(d) for d in documents if not (source / d).is_file()]
    if absent or not schemas:
        raise VectorError(f"{source}: {', '.join(absent or ['schema/*.json'])} missing "
                          "from this install")
    cases = [Path(rel) for rel in sorted(manifest["files"])]
    for rel in cases:
        path = source / rel
        if len(rel.parts) != 2 or ".." in rel.parts or rel.suffix != ".json":
            raise VectorError(f"{source / MANIFEST_NAME}: {str(rel)!r} is not <suite>/<case>.json")
        if not path.is_file():
            raise VectorError(f"{path}: listed in {MANIFEST_NAME} but missing")
        if file_digest(path.read_bytes()) != manifest["files"][str(rel)]:
            raise VectorError(f"{path}: differs from its sha256 in {MANIFEST_NAME}")
    for rel in [Path(MANIFEST_NAME), *documents, *schemas, *cases]:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / rel, dest / rel)
    return len(cases)


def run_export(args: argparse.Namespace) -> int:
    dest: Path = args.dir
    why = dir_problem(dest)
    if why is None and dest.is_dir() and any(dest.iterdir()):
        why = f"{dest} is not empty: choose a new or empty directory"
    if why is not None:
        print(f"affinity vectors export: {why}", file=sys.stderr)
        return 2
    source = shipped_vectors()
    try:
        count = export_tree(source, dest)
    except VectorError as exc:
        print(f"affinity vectors export: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"affinity vectors export: cannot write {dest}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    print(f"exported {count} vectors with README.md, SPEC.md, {MANIFEST_NAME} and schema/ "
          f"to {dest}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.vectors_command == "export":
        return run_export(args)
    if args.vectors_command == "verify":
        if args.positional_dir is not None and args.dir is not None:
            print(f"affinity vectors verify: give the directory once, as DIR or --dir, not "
                  f"both (got {args.positional_dir} and --dir {args.dir})", file=sys.stderr)
            return 2
        args.dir = args.positional_dir or args.dir or DEFAULT_DIR
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
