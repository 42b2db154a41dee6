"""``affinity``: one console command, one subcommand per job.

Subcommands register themselves through :data:`SUBCOMMANDS`: each entry names a module
with ``register(subparsers)``. Modules are imported lazily, so ``affinity --help`` stays
fast and a missing optional extra only affects its own subcommand.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["SUBCOMMANDS", "build_parser", "main"]

# name -> (module, one-line help). The module defines register(subparsers) and run(args).
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "verify": ("affinity_proofs.cli", "run the proof suite (Z3, model checking, CrossHair)"),
    "serve": ("affinity_vllm.cli", "HTTP router in front of vLLM servers (session affinity)"),
    "simulate": ("affinity_sim.cli", "simulate rollout steps and compare routing policies"),
    "check": ("affinity_conformance.cli_check",
              "check a balancer class (module:Class) against the spec and vectors"),
    "replay": ("affinity_conformance.cli_replay",
               "validate NDJSON decision logs against the spec"),
    "vectors": ("affinity_conformance.cli_vectors",
                "generate or verify the conformance vectors in spec/vectors/"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="affinity",
        description=(
            "Affinity: the formally specified reference implementation of load-aware "
            "sticky routing (verl's affinity_break_margin)."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            stub = sub.add_parser(name, help=f"{help_text} (unavailable: {exc})")
            stub.set_defaults(_unavailable=str(exc))
            continue
        mod.register(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
