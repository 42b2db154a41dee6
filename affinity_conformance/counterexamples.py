"""Turn recorded traces (proof counterexamples, shrunk failures) into vectors.

Theory of operation
-------------------
The proof suite writes each counterexample it finds as JSON into
``proofs/counterexamples/*.json``; shrunk failing traces worth keeping (from Hypothesis
or ``affinity check``) live in ``affinity_conformance/regression_traces/*.json``. Both
use one shape::

    {"config": {...}, "servers": [...], "property": "...", "requirements": [...],
     "steps": [{"event": {...}, "expect": {"server_id": ...}}, ...]}

``config`` may name only the non-default options. :func:`trace_to_vector` re-runs the
events through the core, requires every recorded ``expect`` field to agree with the
core's outcome (a disagreement means the proof encoding and the core have drifted apart,
which must be fixed, not papered over), and writes the core's complete outcomes as the
vector's expectations.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from affinity_engine import CodecError, ConfigError, config_from_json, event_from_json
from affinity_engine.codec import outcome_to_json

from .scenario import Scenario

__all__ = ["TraceError", "load_traces", "trace_to_vector"]


class TraceError(ValueError):
    """A recorded trace is malformed or disagrees with the core."""


def _case_name(stem: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("_") or "trace"


def trace_to_vector(data: Any, *, suite: str, case: str, source: str,
                    where: str = "<trace>") -> dict[str, Any]:
    if not isinstance(data, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(data).__name__}")
    missing = [k for k in ("config", "servers", "steps") if k not in data]
    if missing:
        raise TraceError(f"{where}: missing {missing}; expected config, servers, steps, "
                         "property, requirements")
    try:
        config = config_from_json(data["config"])
    except CodecError as exc:
        raise TraceError(f"{where}: config: {exc}") from None
    servers = data["servers"]
    if not isinstance(servers, list) or not all(isinstance(s, str) for s in servers):
        raise TraceError(f"{where}: servers must be a list of ids, got {servers!r}")
    requirements = data.get("requirements", [])
    if not isinstance(requirements, list) or not all(isinstance(r, str) for r in requirements):
        raise TraceError(f"{where}: requirements must be a list of ids")
    description = str(data.get("property") or data.get("description") or "recorded trace")
    try:
        run = Scenario(suite, case, description, requirements=requirements, servers=servers,
                       source=source, config=config)
    except ConfigError as exc:
        raise TraceError(f"{where}: servers: {exc}") from None
    steps = data["steps"]
    if not isinstance(steps, list):
        raise TraceError(f"{where}: steps must be a list")
    for index, item in enumerate(steps):
        if not isinstance(item, dict) or "event" not in item:
            raise TraceError(f"{where}: steps[{index}] must be an object with 'event'")
        try:
            event = event_from_json(item["event"])
        except CodecError as exc:
            raise TraceError(f"{where}: steps[{index}].event: {exc}") from None
        outcome = outcome_to_json(run.apply(event))
        expect = item.get("expect") or {}
        if not isinstance(expect, dict):
            raise TraceError(f"{where}: steps[{index}].expect must be an object")
        wrong = {k: (v, outcome.get(k)) for k, v in expect.items() if outcome.get(k) != v}
        if wrong:
            details = ", ".join(f"{k}: recorded {a!r}, core {b!r}" for k, (a, b) in wrong.items())
            raise TraceError(f"{where}: steps[{index}] {item['event']}: the recorded "
                             f"expectation disagrees with the core ({details})")
    return run.build()


def load_traces(directory: Path, *, suite: str, source: str) -> list[dict[str, Any]]:
    """Vectors for every ``*.json`` trace in ``directory`` (none if it does not exist)."""
    if not directory.is_dir():
        return []
    vectors = []
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise TraceError(f"{path}: cannot read: {exc}") from None
        vectors.append(trace_to_vector(data, suite=suite, case=_case_name(path.stem),
                                       source=source, where=str(path)))
    return vectors
