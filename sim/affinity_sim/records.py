"""Run records combined: several ``affinity simulate --json`` files read as one, by seed.

Theory of operation
-------------------
A sweep is often run in pieces: a policy added later on the same seeds, a replication on
fresh seeds, a run split in chunks because the CLI saves only at the end. The simulator is
deterministic in (workload, policy, seed), so two pieces that share a row must agree on
it; :func:`merge_records` takes the union of the rows and refuses a pair that differs by
more than the records' rounding (``ROUNDING_S``), naming the row. :func:`select_seeds`
keeps the rows of some seeds only, so every policy's summary is taken over the same seeds
(a policy run on more seeds than another would otherwise be summarized on a different
sample). Summaries are recomputed from the rows by :func:`affinity_sim.stats.summarize`,
never copied from a piece.

``python -m affinity_sim.band A.json B.json --seeds 0-29 --band NAME`` uses both, and
``python -m affinity_sim.records A.json B.json [--seeds 0-29] --json MERGED.json`` writes
the merged record for any other reader. :func:`load` is the one reader of a record file:
a file that is unreadable, not JSON or has no ``results`` list is a :class:`RecordError`
that names the file, so every CLI over records fails with one line, not a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from affinity_cli.paths import file_problem

from .simulate import StepResult
from .stats import summarize

__all__ = ["ROUNDING_S", "RecordError", "load", "main", "merge_records", "parse_seed_ranges",
           "select_seeds"]

ROUNDING_S = 1e-3  # write_json rounds step times; equal rows may differ by that much


class RecordError(ValueError):
    """Records that cannot be combined, or a bad seed selection."""


def _key(row: Mapping[str, Any]) -> tuple[str, str, int]:
    return (str(row["workload"]), str(row["policy"]), int(row["seed"]))


def _with_summary(rows: list[dict[str, Any]], sources: list[str]) -> dict[str, Any]:
    fields = {a.name for a in StepResult.__attrs_attrs__}
    results = []
    for row in rows:
        kwargs: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v)
                                  for k, v in row.items() if k in fields}
        results.append(StepResult(**kwargs))
    return {
        "sweep": " + ".join(sources),
        "seeds": sorted({int(row["seed"]) for row in rows}),
        "results": rows,
        "summary": [s.as_dict() for s in summarize(results)],
    }


def merge_records(records: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """The union of the named records' rows; a shared row must agree within ROUNDING_S."""
    if not records:
        raise RecordError("no record to merge")
    rows: dict[tuple[str, str, int], dict[str, Any]] = {}
    origin: dict[tuple[str, str, int], str] = {}
    for name, record in records:
        results = record.get("results")
        if not isinstance(results, list):
            raise RecordError(f"{name}: not a run record (no 'results' list)")
        for row in results:
            key = _key(row)
            if key in rows:
                old = rows[key]["step_time_s"]
                if abs(old - row["step_time_s"]) > ROUNDING_S:
                    raise RecordError(
                        f"{name} and {origin[key]} disagree on {key}: step time "
                        f"{row['step_time_s']} vs {old} (same code and seed must give the "
                        "same step)")
                continue
            rows[key] = dict(row)
            origin[key] = name
    return _with_summary(list(rows.values()), [name for name, _ in records])


def parse_seed_ranges(text: str) -> list[int]:
    """``"0-29,200-299"`` -> the seeds; each range ``a-b`` with ``0 <= a <= b``."""
    seeds: list[int] = []
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        try:
            a = int(low)
            b = int(high) if sep else a
        except ValueError:
            raise RecordError(f"--seeds: {part.strip()!r} is not N or A-B "
                              "(integers >= 0, A <= B)") from None
        if a < 0 or b < a:
            raise RecordError(f"--seeds: {part.strip()!r} needs 0 <= A <= B")
        seeds.extend(range(a, b + 1))
    return seeds


def select_seeds(record: Mapping[str, Any], seeds: Iterable[int]) -> dict[str, Any]:
    """Only the rows of ``seeds``; fails if a chosen seed has no row at all."""
    wanted = set(seeds)
    rows = [dict(r) for r in record["results"] if int(r["seed"]) in wanted]
    present = {int(r["seed"]) for r in rows}
    missing = sorted(wanted - present)
    if missing:
        raise RecordError(f"--seeds: no results for seeds {missing[:10]}"
                          + (" ..." if len(missing) > 10 else ""))
    return _with_summary(rows, [str(record.get("sweep", "record"))])


_ROW_KEYS = ("workload", "policy", "seed", "step_time_s")


def load(path: str | Path) -> dict[str, Any]:
    """A run record read from ``path``; a RecordError naming the file if it is not one."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise RecordError(f"{path}: cannot be read ({reason})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list):
        raise RecordError(f"{path}: not a run record of `affinity simulate --json` "
                          "(no 'results' list)")
    for index, row in enumerate(results):
        missing = [k for k in _ROW_KEYS if not isinstance(row, dict) or k not in row]
        if missing:
            raise RecordError(f"{path}: results[{index}] lacks {', '.join(missing)}")
    record: dict[str, Any] = data
    if "summary" not in record or "seeds" not in record:  # a hand-made or trimmed record
        try:
            derived = _with_summary([dict(row) for row in results], [str(path)])
        except (TypeError, ValueError) as exc:
            raise RecordError(f"{path}: its rows are not step results ({exc})") from None
        record = {**derived, "sweep": record.get("sweep", derived["sweep"])}
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m affinity_sim.records", description=(
        "Merge `affinity simulate --json` records by seed (rows they share must agree) and "
        "write the union, its summaries recomputed, as one record."))
    parser.add_argument("record", nargs="+", help="run records (JSON)")
    parser.add_argument("--seeds", default=None, metavar="A-B[,C-D]",
                        help="keep only these seeds (every policy summarized on the same seeds)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="write the merged record here (default: print a summary only)")
    args = parser.parse_args(argv)
    try:  # the output path is checked before any record is read
        if args.json is not None:
            why = file_problem(Path(args.json))
            if why is not None:
                raise RecordError(f"--json: {why}")
        record = merge_records([(path, load(path)) for path in args.record])
        if args.seeds is not None:
            record = select_seeds(record, parse_seed_ranges(args.seeds))
    except RecordError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    workloads = sorted({row["workload"] for row in record["results"]})
    policies = sorted({row["policy"] for row in record["results"]})
    print(f"{len(record['results'])} rows from {len(args.record)} record(s): "
          f"{len(workloads)} workloads {workloads}, {len(policies)} policies {policies}, "
          f"{len(record['seeds'])} seeds")
    if args.json is not None:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
