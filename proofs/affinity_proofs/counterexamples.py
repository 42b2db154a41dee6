"""Z3 counterexample traces as replayable JSON files (``proofs/counterexamples/``).

Theory of operation
-------------------
R-SKEW-4 states two facts, and each fact has a witness trace found by
:func:`~affinity_proofs.z3_bmc.shortest_trace`:

* the legacy rule (margin None) violates per-decision skew: a sticky hit lands on a
  server above ``min + band``;
* global skew is unbounded under adversarial releases, *with* the margin: after the
  trace, ``max - min > bound``.

A witness becomes a document of this shape (the vector suite's ``counterexamples``
holds each as a vector)::

    {"format": "affinity-counterexample/1", "name": ..., "description": ...,
     "property": "decision_above_band" | "spread_exceeds", "parameters": {...},
     "requirements": [...], "config": <affinity_engine.codec config>, "servers": [...],
     "steps": [{"event": <codec event>, "expect": {"server_id": ..., "path": ...}},
               {"event": {"op": "release", ...}, "expect": {"result": "applied"}}, ...],
     "generator": ...}

:func:`replay` runs a document through the *real* core: every ``expect`` must match, and
:func:`violation` then evaluates the documented property on the replayed trace. So a
file is checked twice -- the Z3 decisions must be the core's, and the property must
really fail. Each witness is the lexicographically least shortest trace (see
:func:`~affinity_proofs.z3_bmc.shortest_trace`), a function of the formula alone, so
``affinity verify`` regenerates the documents and fails if they differ from the checked-in
files; ``affinity verify --write-counterexamples DIR`` writes them to ``DIR``
(``proofs/counterexamples`` in a checkout).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path as FsPath
from typing import Any

import attrs

from affinity_engine import Acquired, Config, Released, initial_state, step
from affinity_engine.codec import config_to_json, event_from_json

from .z3_bmc import BmcResult, shortest_trace

__all__ = ["COUNTEREXAMPLES", "DIRECTORY", "CounterexampleSpec", "generate", "load",
           "replay", "violation"]

FORMAT = "affinity-counterexample/1"
# proofs/counterexamples/, linked into the package as package data (affinity_conformance/shipped.py)
DIRECTORY = FsPath(str(resources.files("affinity_proofs").joinpath("counterexamples")))
JSON = dict[str, Any]


@attrs.frozen
class CounterexampleSpec:
    name: str
    description: str
    servers: int
    keys: int
    max_depth: int
    margin: int | None  # the configured affinity_break_margin
    bad: str  # z3_bmc bad-state predicate
    bound: int  # band (decision_skew) or spread bound (global_skew)
    requirements: tuple[str, ...]

    @property
    def property_name(self) -> str:
        return "decision_above_band" if self.bad == "decision_skew" else "spread_exceeds"

    @property
    def parameters(self) -> dict[str, int]:
        return {"band": self.bound} if self.bad == "decision_skew" else {"bound": self.bound}


COUNTEREXAMPLES: tuple[CounterexampleSpec, ...] = (
    *(CounterexampleSpec(
        f"legacy_decision_above_band_{m}",
        f"margin None (legacy): a sticky hit lands on a server above min + {m}",
        3, 3, 8, None, "decision_skew", m, ("R-SKEW-4", "R-SKEW-1", "R-LEG-1"))
      for m in (0, 1, 2)),
    CounterexampleSpec(
        "margin_1_global_spread_above_3",
        "margin 1: arrivals, then releases chosen by the environment, reach max - min > 3",
        2, 2, 12, 1, "global_skew", 3, ("R-SKEW-4", "R-SKEW-2")),
    CounterexampleSpec(
        "margin_0_global_spread_above_2",
        "margin 0: even the strictest margin leaves max - min unbounded under releases",
        2, 2, 12, 0, "global_skew", 2, ("R-SKEW-4", "R-SKEW-5")),
)


def _config(spec: CounterexampleSpec) -> Config:
    return Config(affinity_break_margin=spec.margin, max_cache_size=max(spec.keys, 1))


def document(spec: CounterexampleSpec, found: BmcResult) -> JSON:
    servers = [f"s{i}" for i in range(spec.servers)]
    steps: list[JSON] = []
    for s in found.steps:
        if s.op == "acquire":
            steps.append({"event": {"op": "acquire", "request_id": f"r{s.index}"},
                          "expect": {"server_id": servers[s.server], "path": s.path}})
        else:
            steps.append({"event": {"op": "release", "server_id": servers[s.server]},
                          "expect": {"result": "applied"}})
    return {
        "format": FORMAT, "name": spec.name, "description": spec.description,
        "property": spec.property_name, "parameters": spec.parameters,
        "requirements": list(spec.requirements), "config": config_to_json(_config(spec)),
        "servers": servers, "steps": steps,
        "generator": f"affinity verify: z3 bmc servers={spec.servers} keys={spec.keys} "
                     f"depth={found.depth} (shortest)",
    }


def generate(spec: CounterexampleSpec) -> JSON | None:
    """The shortest witness as a document, or None if Z3 finds none within the depth."""
    found = shortest_trace(spec.servers, spec.keys, spec.max_depth, margin=spec.margin,
                           bad=spec.bad, bound=spec.bound)
    return document(spec, found) if found.found else None


def dumps(doc: JSON) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def load(path: FsPath) -> JSON:
    doc = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not an {FORMAT} document")
    return doc


@attrs.frozen
class Replayed:
    loads_before: tuple[int, ...]  # pool order
    chosen: str | None  # the acquired server, for acquires
    final_loads: tuple[int, ...]


def replay(doc: JSON) -> list[Replayed]:
    """Run the document through the real core; raise ValueError on any mismatch."""
    from affinity_engine.codec import config_from_json

    config = config_from_json(doc["config"])
    state = initial_state(config, doc["servers"])
    out: list[Replayed] = []
    for i, item in enumerate(doc["steps"]):
        event = event_from_json(item["event"])
        before = tuple(n for _, n in state.pool.items())
        t = step(config, state, event)
        expect, o = item.get("expect", {}), t.outcome
        if "server_id" in expect and not (
                isinstance(o, Acquired) and o.server_id == expect["server_id"]
                and o.path.value == expect.get("path", o.path.value)):
            raise ValueError(f"{doc['name']} step {i}: expected {expect}, core gave {o!r}")
        if "result" in expect and not (isinstance(o, Released)
                                       and o.result.value == expect["result"]):
            raise ValueError(f"{doc['name']} step {i}: expected {expect}, core gave {o!r}")
        state = t.state
        chosen = o.server_id if isinstance(o, Acquired) else None
        out.append(Replayed(before, chosen, tuple(n for _, n in state.pool.items())))
    return out


def violation(doc: JSON) -> str | None:
    """The documented property violation, observed on the core's replay (None if absent)."""
    trace = replay(doc)
    servers: list[str] = doc["servers"]
    if doc["property"] == "decision_above_band":
        band = doc["parameters"]["band"]
        for i, r in enumerate(trace):
            if r.chosen is not None:
                load = r.loads_before[servers.index(r.chosen)]
                if load > min(r.loads_before) + band:
                    return f"step {i}: {r.chosen} chosen at load {load} > min " \
                           f"{min(r.loads_before)} + {band}"
        return None
    if doc["property"] == "spread_exceeds":
        final = trace[-1].final_loads if trace else ()
        bound = doc["parameters"]["bound"]
        spread = max(final) - min(final) if final else 0
        return f"final loads {list(final)}: max - min = {spread} > {bound}" \
            if spread > bound else None
    raise ValueError(f"unknown property {doc['property']!r}")
