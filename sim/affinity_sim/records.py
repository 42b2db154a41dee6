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

``python -m affinity_sim.band A.json B.json --seeds 0-29 --band NAME`` uses both.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .simulate import StepResult
from .stats import summarize

__all__ = ["ROUNDING_S", "RecordError", "load", "merge_records", "parse_seed_ranges",
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


def load(path: str | Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    return data
