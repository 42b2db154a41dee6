"""``affinity``: one console command, one subcommand per job.

Subcommands register themselves through :data:`SUBCOMMANDS`: each entry names a module
with ``register(parser)``. Only the module of the subcommand being run is imported, so
``affinity --help`` stays fast, a missing optional extra affects only its own
subcommand, and a broken module cannot take the other commands down with it.

Every subcommand's ``--help`` ends with its exit status (:data:`EXIT_STATUS`, kept here
in one table so the statuses read alike; tests/cli checks each against the command).
Usage errors exit 2 with one line on stderr naming the value and what is accepted.

A subcommand whose optional extra is not installed (:data:`EXTRAS`; the plain wheel has
none) says so -- which modules are missing and the ``pip install`` line -- in its
``--help`` and, whatever options follow, when run (exit 2), instead of listing no
options, rejecting its own options as unrecognized, or (``serve``) dying in a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import textwrap
from collections.abc import Sequence

__all__ = ["EXIT_STATUS", "EXTRAS", "SUBCOMMANDS", "build_parser", "main", "version_text"]

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
                "generate, verify or export the conformance vectors (shipped in the "
                "package)"),
}


# subcommand -> (the extra that provides what it needs, the top-level modules it imports).
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "verify": ("proofs", ("z3", "crosshair", "rich", "hypothesis")),
    "serve": ("vllm", ("aiohttp", "httptools")),
    "simulate": ("sim", ("simpy", "scipy", "matplotlib", "rich", "yaml")),
    "check-router": ("vllm", ("aiohttp", "httptools")),
}


def _missing(name: str) -> str | None:
    """Why subcommand ``name`` cannot run here (missing modules and the fix), or None."""
    extra, modules = EXTRAS.get(name, ("", ()))
    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    if not absent:
        return None
    return (f"needs {', '.join(absent)}: pip install 'affinity-routing[{extra}]'")


# What each exit status means, per subcommand (printed at the end of its --help).
EXIT_STATUS: dict[str, str] = {
    "verify": "0 every obligation passed and refuted its mutants; 1 a check failed or a "
              "mutant survived; 2 bad options (output paths are checked before any proof "
              "runs)",
    "serve": "0 after a clean shutdown (SIGTERM/SIGINT); 1 the router could not start (the "
             "address is in use or does not resolve, the decision log cannot be opened or "
             "another router holds it); 2 bad options (a --decision-log whose directory does not "
             "exist among them)",
    "simulate": "0 the sweep ran (and was saved unless --no-save); 2 bad input (preset, "
                "workload file, policy, workload, output path, a Ray address that is "
                "malformed or does not answer, --address without Ray)",
    "check": "0 every claimed level passes; 1 a claimed level fails or is unsupported, or "
             "IMPL calls sys.exit while checked; 2 bad input (IMPL, vectors, options)",
    "check-router": "0 every trace conforms; 1 some trace diverged; 2 bad input, the router "
                    "could not be started, or nothing answers at --url",
    "replay": "0 every record matches the spec; 1 a record diverges; 2 malformed input (a "
              "file that is missing, cannot be read or is not a decision log, a malformed line, a "
              "truncated last line without --allow-truncated)",
    "vectors": "0 the vectors match (verify), were written (generate) or exported (export); "
               "1 verify found differences; 2 bad input (a directory that is missing or a "
               "file, an --out that cannot be created or is a non-empty folder that is not a "
               "vector tree, an export DIR that is not empty or cannot be written, a "
               "generation failure)",
}


def _exit_epilog(name: str) -> str:
    interrupted = "" if name == "serve" else "; 130 interrupted (Ctrl-C)"
    text = (f"exit status: {EXIT_STATUS[name]}{interrupted}. Errors are one line on stderr, "
            "never a traceback.")
    return textwrap.fill(text, width=88)  # pre-wrapped: some commands print raw epilogs


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (the first argument that is not an option)."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in SUBCOMMANDS else None
    return None


def version_text() -> str:
    """The package version and which build of affinity_engine this process runs."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        number = version("affinity-routing")
    except PackageNotFoundError:
        number = "unknown (not installed)"
    from affinity_engine._build import BUILD_INFO

    return f"affinity {number}; affinity_engine: {BUILD_INFO}"


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
        epilog="exit status: 2 for a usage error or a subcommand whose optional extra is "
               "not installed; each subcommand's --help lists its own.",
    )
    parser.add_argument("--version", action=_VersionAction, nargs=0,
                        help="print the version and the build of affinity_engine "
                             "(pure or compiled), then exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = _chosen(argv)
    for name, (module, help_text) in SUBCOMMANDS.items():
        child = sub.add_parser(name, help=help_text, description=help_text)
        if name != chosen:
            continue
        why = _missing(name)
        if why is None:
            try:
                mod = importlib.import_module(module)
            except Exception as exc:  # any import failure is reported, never a traceback
                why = f"{type(exc).__name__}: {exc}"
        if why is not None:
            child.set_defaults(_unavailable=why)
            child.epilog = f"unavailable here: {why}"
            continue
        mod.register(child)
        child.epilog = "\n\n".join(e for e in (child.epilog, _exit_epilog(name)) if e)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if _chosen(args_list) == "verify" and "affinity_engine" not in sys.modules:
        # The proofs monkeypatch and symbolically execute the source; a compiled core
        # would ignore the mutants. Its workers inherit the choice.
        os.environ["AFFINITY_BUILD"] = "pure"
    parser = build_parser(args_list)
    # Known args first: an unavailable subcommand registered no options, so its own
    # options would otherwise be "unrecognized" instead of explained.
    args, unknown = parser.parse_known_args(args_list)
    if unknown and not getattr(args, "_unavailable", None):
        args = parser.parse_args(args_list)  # the usual error for a real typo
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "_unavailable", None):
        print(f"affinity {args.command}: unavailable: {args._unavailable}", file=sys.stderr)
        return 2
    try:
        code: int = args.run(args)
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback (serve handles SIGINT)
        print(f"affinity {args.command}: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
