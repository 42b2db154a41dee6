"""``affinity replay LOG...``: validate NDJSON decision logs against the spec.

The files are one rotated set, oldest first: each is replayed from its own header, and
each header must continue the file before it -- next ``seq``, same configuration, the
state the previous file ended in (R-LOG-1). A header marked ``restart`` starts a new run
(a writer restarted on the same path, R-LOG-3): a warm restart must still continue the
file before it, a cold one is replayed alone; the summary says how many runs it read.
``--separate`` checks unrelated files, each alone.

Exit status: 0 every record matches the spec; 1 a record diverges (the first one is
reported with the two records before it; with ``--separate``, the first of each file);
2 malformed input -- a file that is missing (checked for every file before any is
replayed), cannot be read, is not a decision log, has a malformed
line, or ends in a truncated line (unless ``--allow-truncated``) -- with the file and
line and what was expected, no traceback. A truncated file followed by a restart is a
crash the next run recovered from, not an error.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

from .log_replay import FileResult, LogError, count_runs, replay_files

__all__ = ["register"]


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", type=Path, metavar="LOG",
                        help="decision log files of one rotated set, oldest first (e.g. "
                             "log.2 log.1 log): each is replayed from its own header and each "
                             "header must continue the file before it")
    parser.add_argument("--separate", action="store_true",
                        help="the files are unrelated logs: replay each alone, without "
                             "checking that they join up, and report every file that "
                             "diverges")
    parser.add_argument("--allow-truncated", action="store_true",
                        help="accept a truncated last line (a writer that crashed mid-record); "
                             "the records before it are still checked")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(run=run)


def _as_json(results: list[FileResult]) -> list[dict[str, object]]:
    out = []
    for r in results:
        item: dict[str, object] = {"file": r.path, "records": r.records,
                                   "first_seq": r.first_seq, "last_seq": r.last_seq,
                                   "truncated": r.truncated, "restart": r.restart,
                                   "new_run": r.new_run}
        d = r.divergence
        if d is not None:
            item["divergence"] = {"line": d.line, "seq": d.seq, "event": d.event,
                                  "problem": d.problem, "logged": d.logged,
                                  "expected": d.expected, "context": list(d.context),
                                  "requirements": list(d.requirements)}
        out.append(item)
    return out


def unreadable(path: Path) -> str | None:
    """Why ``path`` is not a file replay can open (None if it is one).

    Checked for every file before any is replayed, so a mistyped name is reported as
    missing rather than as a malformed log, and nothing is replayed in vain.
    """
    if not path.exists():
        return f"{path}: no such file"
    if path.is_dir():
        return f"{path}: is a directory, expected a decision log file"
    if not os.access(path, os.R_OK):
        return f"{path}: cannot read: permission denied"
    return None


def run(args: argparse.Namespace) -> int:
    for path in args.logs:
        why = unreadable(path)
        if why is not None:
            print(f"affinity replay: {why}", file=sys.stderr)
            return 2
    try:
        results = replay_files(args.logs, join=not args.separate)
    except LogError as exc:
        print(f"affinity replay: malformed log: {exc}", file=sys.stderr)
        return 2
    diverged = next((r for r in results if r.divergence is not None), None)
    # A cut last line that a restart follows is the crash that restart recovered from.
    recovered = {r.path for r, after in itertools.pairwise(results)
                 if r.truncated and after.restart is not None and not args.separate}
    truncated = [r for r in results if r.truncated and r.path not in recovered]
    code = 1 if diverged else (2 if truncated and not args.allow_truncated else 0)
    runs = len(results) if args.separate else count_runs(results)
    if args.json:
        print(json.dumps({"files": _as_json(results), "runs": runs, "exit": code},
                         indent=2, sort_keys=True))
        return code
    for r in results:
        if r.restart is not None and r.divergence is None:
            print(f"{r.path}: a new run starts here ({r.restart} restart"
                  + (", continuing the run before it" if r.restart == "warm" else "") + ")")
        if r.divergence is None:
            span = "" if r.first_seq is None else f" (seq {r.first_seq}..{r.last_seq})"
            print(f"{r.path}: {r.records} records match the spec{span}")
        if r.path in recovered:
            print(f"{r.path}: its last line is cut (a crash); the restart after it "
                  f"recovered, and the {r.records} records before it match the spec")
        elif r.truncated:
            print(f"{r.path}: TRUNCATED: {r.truncated}; the {r.records} records before it "
                  "match the spec", file=sys.stderr if not args.allow_truncated else sys.stdout)
    if diverged is not None:
        for r in results:  # one with a rotated set (it stops there); each with --separate
            if r.divergence is not None:
                print(f"DIVERGENCE after {r.records} matching records in {r.path}:",
                      file=sys.stderr)
                print(r.divergence.render(), file=sys.stderr)
        if args.separate:
            failed = sum(r.divergence is not None for r in results)
            print(f"{failed} of {len(results)} file(s) diverge", file=sys.stderr)
        return 1
    total = sum(r.records for r in results)
    if code == 0:
        print(f"ok: {total} records in {len(results)} file(s) match the spec; "
              f"{runs} run(s)")
    return code
