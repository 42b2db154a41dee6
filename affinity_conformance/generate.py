"""Build every conformance vector in memory; write, or compare with, ``spec/vectors/``.

Theory of operation
-------------------
:func:`build_vectors` is a pure function of the sources (plus the optional proof and
regression trace directories), so the drift test can regenerate the whole tree and
compare it byte for byte with what is committed. Sources, in order:

1. named scenarios (:mod:`affinity_conformance.scenarios`), hand-checked;
2. exhaustive enumeration: every 4-event trace over a 7-event alphabet on two servers,
   reduced to a covering subset (:func:`~affinity_conformance.trace_gen.select_covering`);
3. seeded random traces per :data:`~affinity_conformance.trace_gen.FAMILIES`, kept when
   they add a new feature (ties, evictions, re-adds, ...);
4. regressions: shrunk failing traces in ``affinity_conformance/regression_traces/``;
5. counterexamples written by the proof suite in ``proofs/counterexamples/``.

Every vector's expectations come from running the core; every vector is then replayed
through the reference consumer (:func:`~affinity_conformance.vector_runner.run_case`)
before it is accepted, so the generator cannot emit a case the core does not pass.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from affinity_engine import (
    Acquire,
    AddServers,
    ClearStickyCache,
    Config,
    Event,
    Release,
    RemoveServers,
    config_from_json,
)

from .counterexamples import load_traces
from .scenario import Scenario
from .scenarios import all_scenarios
from .shipped import package_data_dir, shipped_counterexamples
from .trace_gen import (
    FAMILIES,
    SplitMix64,
    enumerate_traces,
    random_trace,
    select_covering,
    trace_features,
)
from .vector_format import (
    GENERATOR,
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    SUITES,
    VectorError,
    case_text,
    file_digest,
    parse_case,
    seal,
    vector_files,
)
from .vector_runner import run_case

__all__ = ["build_vectors", "manifest_for", "verify_tree", "write_tree"]

REGRESSION_DIR = package_data_dir("affinity_conformance", "regression_traces")
COUNTEREXAMPLE_DIR = shipped_counterexamples()

RANDOM_SEED = 20260915
RANDOM_CANDIDATES = 40
RANDOM_KEEP = 5
RANDOM_LENGTH = 30
ENUM_LENGTH = 4
ENUM_KEEP = 14


def _enumeration_cases() -> list[dict[str, Any]]:
    alphabet: Sequence[Event] = (
        Acquire(request_id="a"), Acquire(request_id="b"), Release(server_id="s0"),
        Release(server_id="s1"), RemoveServers(server_ids=["s0"]),
        AddServers(server_ids=["s0"]), ClearStickyCache(),
    )
    configs = (
        ("legacy", "legacy_c1", {"max_cache_size": 1}, "R-LEG-1 R-LRU-3 R-ACQ-3 R-RLS-1"),
        ("margin", "margin0_c2", {"affinity_break_margin": 0, "max_cache_size": 2},
         "R-KEEP-1 R-BREAK-1 R-SKEW-5 R-LRU-3"),
        ("dual_threshold", "gate1_c2", {"dual_threshold": {"balance_abs_threshold": 1,
                                                           "balance_rel_threshold": 1},
                                        "max_cache_size": 2}, "R-GATE-1 R-BREAK-1"),
    )
    servers = ("s0", "s1")
    out = []
    for suite, label, raw, reqs in configs:
        config = config_from_json(raw)
        traces = list(enumerate_traces(alphabet, ENUM_LENGTH))
        for rank, index in enumerate(select_covering(config, servers, traces, ENUM_KEEP)):
            run = Scenario(suite, f"enum_{label}_{rank:02d}",
                           f"Exhaustive enumeration ({len(alphabet)}^{ENUM_LENGTH} traces on "
                           f"two servers), covering trace {rank} of {label}.",
                           requirements=reqs.split(), servers=servers, source="enumeration",
                           config=config)
            for event in traces[index]:
                run.apply(event)
            out.append(run.build())
    return out


def _random_cases() -> list[dict[str, Any]]:
    out = []
    for number, family in enumerate(FAMILIES):
        config = family.config()
        candidates = []
        for i in range(RANDOM_CANDIDATES):
            seed = RANDOM_SEED + 1000 * number + i
            events = random_trace(family, SplitMix64(seed), RANDOM_LENGTH)
            candidates.append((seed, events, trace_features(config, family.servers, events)))
        covered: set[str] = set()
        kept = 0
        for seed, events, features in sorted(candidates, key=lambda c: (-len(c[2]), c[0])):
            if kept >= RANDOM_KEEP:
                break
            if kept and not features - covered:
                continue
            covered |= features
            kept += 1
            run = Scenario(family.suite, f"rand_{family.name}_{seed}",
                           f"Seeded random trace (SplitMix64 seed {seed}) of family "
                           f"{family.name}; exercises {', '.join(sorted(features))}.",
                           requirements=_family_requirements(family.suite, config),
                           servers=family.servers, source="random", config=config)
            for index, event in enumerate(events):
                run.apply(event)
                if index % 10 == 9:
                    run.check()
            out.append(run.build())
    return out


def _family_requirements(suite: str, config: Config) -> list[str]:
    common = ["R-OUT-1", "R-ST-2", "R-CONS-1", "R-ACQ-7", "R-CONF-1"]
    if suite == "band":  # with T set the band decides; without, context_tokens is ignored
        banded = config.affinity_break_tokens is not None
        return common + (["R-BAND-1", "R-BAND-2", "R-KEEP-2", "R-BREAK-1"] if banded
                         else ["R-BAND-3", "R-KEEP-1", "R-BREAK-1"])
    extra = {
        "legacy": ["R-LEG-1", "R-REL-2"], "eviction": ["R-LRU-2", "R-LRU-3", "R-LRU-5"],
        "failover": ["R-POOL-1", "R-POOL-2", "R-POOL-3", "R-HAZ-1"],
        "determinism": ["R-DET-1", "R-DET-2", "R-DET-3"],
        "margin": ["R-KEEP-1", "R-BREAK-1", "R-SKEW-1"], "ties": ["R-TIE-3", "R-TIE-4"],
        "dual_threshold": ["R-GATE-1"], "unkeyed": ["R-ACQ-8"],
        "leases": ["R-LEASE-3", "R-LEASE-5"], "observations": ["R-OBS-1", "R-OBS-2", "R-OBS-3"],
        "group": ["R-GRP-2", "R-GRP-3", "R-GRP-4", "R-GRP-5", "R-GRP-7"]
                 + (["R-GRP-8"] if config.group_stickiness.value == "only" else []),
        "prefix": ["R-PFX-2", "R-PFX-3", "R-PFX-4"],
    }
    return common + extra.get(suite, [])


def _built(item: Scenario | dict[str, Any]) -> dict[str, Any]:
    return item.build() if isinstance(item, Scenario) else item


def build_vectors(*, regression_dir: Path = REGRESSION_DIR,
                  counterexample_dir: Path = COUNTEREXAMPLE_DIR) -> dict[str, dict[str, Any]]:
    """Every vector, sealed, keyed by its path relative to ``spec/vectors/``."""
    raw: list[dict[str, Any]] = [_built(item) for item in all_scenarios()]
    raw += _enumeration_cases()
    raw += _random_cases()
    raw += load_traces(regression_dir, suite="regressions", source="regression")
    raw += load_traces(counterexample_dir, suite="counterexamples", source="counterexample")
    vectors: dict[str, dict[str, Any]] = {}
    for body in raw:
        if body["suite"] not in SUITES:
            raise VectorError(f"{body['case']}: unknown suite {body['suite']!r}")
        rel = f"{body['suite']}/{body['case']}.json"
        if rel in vectors:
            raise VectorError(f"two cases would be written to {rel}")
        sealed = seal(body)
        mismatch = run_case(parse_case(json.loads(case_text(sealed)), rel))
        if mismatch is not None:
            raise VectorError(f"generated vector does not replay: {mismatch}")
        vectors[rel] = sealed
    return dict(sorted(vectors.items()))


def manifest_for(texts: dict[str, str]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for rel in texts:
        suite = rel.split("/", 1)[0]
        counts[suite] = counts.get(suite, 0) + 1
    return {
        "format": MANIFEST_FORMAT, "generator": GENERATOR, "cases": len(texts),
        "suites": dict(sorted(counts.items())),
        "files": {rel: file_digest(text.encode("utf-8")) for rel, text in sorted(texts.items())},
    }


def _texts(vectors: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {rel: case_text(v) for rel, v in vectors.items()}


def write_tree(out: Path, vectors: dict[str, dict[str, Any]]) -> int:
    """Replace every case file under ``out`` (README and schema stay) and the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in vector_files(out):
        stale.unlink()
    texts = _texts(vectors)
    for rel, text in texts.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for directory in sorted(out.iterdir()):
        if directory.is_dir() and directory.name != "schema" and not any(directory.iterdir()):
            directory.rmdir()
    manifest = manifest_for(texts)
    (out / MANIFEST_NAME).write_text(case_text(manifest), encoding="utf-8")
    return len(texts)


def verify_tree(root: Path, vectors: dict[str, dict[str, Any]]) -> list[str]:
    """Differences between ``root`` and a fresh generation (empty when none)."""
    problems: list[str] = []
    texts = _texts(vectors)
    on_disk = {str(p.relative_to(root)): p for p in vector_files(root)}
    for rel in sorted(set(texts) - set(on_disk)):
        problems.append(f"missing: {rel} (run `affinity vectors generate --out DIR`)")
    for rel in sorted(set(on_disk) - set(texts)):
        problems.append(f"stale: {rel} is no longer generated")
    for rel in sorted(set(texts) & set(on_disk)):
        if on_disk[rel].read_bytes() != texts[rel].encode("utf-8"):
            problems.append(f"drift: {rel} differs from the regenerated case")
    manifest_path = root / MANIFEST_NAME
    want = case_text(manifest_for(texts))
    if not manifest_path.is_file():
        problems.append(f"missing: {MANIFEST_NAME}")
    elif manifest_path.read_text(encoding="utf-8") != want:
        problems.append(f"drift: {MANIFEST_NAME} differs from the regenerated manifest")
    return problems
