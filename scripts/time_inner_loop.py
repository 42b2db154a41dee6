"""Time ``make check`` step by step and record it in ``docs/inner-loop.json``.

``docs/inner-loop.md`` renders its timing paragraph from that file
(``scripts/render_docs.py``), so the page says what was measured, on which machine and
under what load, and never a typed number. Run from the checkout root with the
development venv::

    .venv/bin/python scripts/time_inner_loop.py [--venv .venv] [--out docs/inner-loop.json]

The steps are the ones ``make check`` runs, in its order: ``lint`` and ``typecheck``
one after the other, then ``test-fast`` and ``proofs-small`` side by side (one make
invocation with ``-j2``). A failing step fails the script: a timing of a red check
means nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["main", "time_steps"]

# (label, make arguments): the serial steps, then the side-by-side pair, as `make check`.
STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("lint", ("lint",)),
    ("typecheck", ("typecheck",)),
    ("test-fast and proofs-small, side by side", ("-j2", "--output-sync=target",
                                                  "test-fast", "proofs-small")),
)


def time_steps(venv: str) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for label, args in STEPS:
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        done = subprocess.run(["make", "--no-print-directory", f"VENV={venv}", *args],
                              cwd=ROOT, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            sys.stdout.write(done.stdout + done.stderr)
            raise SystemExit(f"time_inner_loop: `make {' '.join(args)}` failed "
                             f"(exit {done.returncode}); nothing recorded")
        rows.append({"step": label, "seconds": round(seconds, 1),
                     "load_average_before": round(load_before, 2)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", default=".venv")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "inner-loop.json")
    args = parser.parse_args(argv)
    rows = time_steps(args.venv)
    record = {
        "make_check": {
            "steps": rows,
            "seconds": round(sum(float(str(r["seconds"])) for r in rows), 1),
            "load_average_after": round(os.getloadavg()[0], 2),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        }
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"make check: {record['make_check']['seconds']} s -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
