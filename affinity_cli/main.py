"""``affinity``: one console command, one subcommand per job.

Subcommands register themselves through :data:`SUBCOMMANDS`: each entry names a module
with ``register(parser)``. Only the module of the subcommand being run is imported, so
``affinity --help`` stays fast, a missing optional extra affects only its own
subcommand, and a broken module cannot take the other commands down with it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

__all__ = ["SUBCOMMANDS", "build_parser", "main", "version_text"]

# name -> (module, one-line help). The module defines register(subparsers) and run(args).
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "verify": ("affinity_proofs.cli", "run the proof suite (Z3, model checking, CrossHair)"),
    "serve": ("affinity_vllm.cli", "HTTP router in front of vLLM servers (session affinity)"),
    "simulate": ("affinity_sim.cli", "simulate rollout steps and compare routing policies"),
    "check": ("affinity_conformance.cli_check",
              "check a balancer class (module:Class) against the spec and vectors: a "
              "verdict per conformance level (core, features, strict-config)"),
    "check-router": ("affinity_conformance.router_check.cli",
                     "check an HTTP router (affinity serve, vllm-router, sglang-router) "
                     "black-box against the spec"),
    "replay": ("affinity_conformance.cli_replay",
               "validate NDJSON decision logs against the spec"),
    "vectors": ("affinity_conformance.cli_vectors",
                "generate or verify the conformance vectors in spec/vectors/"),
}


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (the first argument that is not an option)."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in SUBCOMMANDS else None
    return None


def version_text() -> str:
    """The package version and which build of affinity_core this process runs."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        number = version("affinity-routing")
    except PackageNotFoundError:
        number = "unknown (not installed)"
    from affinity_core._build import BUILD_INFO

    return f"affinity {number}; affinity_core: {BUILD_INFO}"


class _VersionAction(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(version_text())
        parser.exit()


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser; the subcommand named in ``argv`` (if any) gets its full options."""
    parser = argparse.ArgumentParser(
        prog="affinity",
        description=(
            "Affinity: the formally specified reference implementation of load-aware "
            "sticky routing (verl's affinity_break_margin)."
        ),
    )
    parser.add_argument("--version", action=_VersionAction, nargs=0,
                        help="print the version and the build of affinity_core "
                             "(pure or compiled), then exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = _chosen(argv)
    for name, (module, help_text) in SUBCOMMANDS.items():
        child = sub.add_parser(name, help=help_text, description=help_text)
        if name != chosen:
            continue
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # any import failure is reported, never a traceback
            child.set_defaults(_unavailable=f"{type(exc).__name__}: {exc}")
            continue
        mod.register(child)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if _chosen(args_list) == "verify" and "affinity_core" not in sys.modules:
        # The proofs monkeypatch and symbolically execute the source; a compiled core
        # would ignore the mutants. Its workers inherit the choice.
        os.environ["AFFINITY_BUILD"] = "pure"
    parser = build_parser(args_list)
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "_unavailable", None):
        print(f"affinity {args.command}: unavailable: {args._unavailable}", file=sys.stderr)
        return 2
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
