"""``affinity check-router``: many seeded traces, shrunk failures, one report.

Theory of operation
-------------------
:func:`check_router` starts the recording fleet (:mod:`.fleet`), starts the router (or
attaches to it), calibrates the settle delay (:class:`~.target.Target`), then plays
``budget`` traces generated from seeds ``seed``, ``seed + 1``, ... Each trace meets a fresh
router. A failing trace is shrunk (:func:`~.harness.shrink_ops`) unless a failure of the
same kind (the same requirement ids) was already shrunk, re-run to
confirm, and written as a vector. A router that chooses at random (the failing prefix
does not fail again on a rerun) gets several tries per shrinking candidate.
The verdict is ``fail`` if any trace diverged.

The fleet, the router and every held request are released and stopped in ``finally``,
whatever happens. Without ``out``, the run writes into a new temporary directory and
removes it when the check passes (it then holds only the router's log, of a run that
found nothing); a failing run keeps it, with the vectors of its minimal traces.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import attrs

from .claims import Claim
from .fleet import RecordingFleet
from .harness import RunResult, StepDivergence, run_trace, shrink_ops, write_vector
from .presets import DEFAULT_ROUTERS_VENV, Preset, PresetError
from .target import SettlePlan, Target
from .trace import Op, TraceShape, describe, generate, server_ids

__all__ = ["CheckOptions", "Failure", "RouterReport", "check_router"]

RANDOM_TRIES = 4


@attrs.frozen
class CheckOptions:
    preset: Preset
    claim: Claim
    url: str | None = None
    extra: tuple[str, ...] = ()
    routers_venv: Path = DEFAULT_ROUTERS_VENV
    shape: TraceShape = attrs.field(factory=TraceShape)
    budget: int = 5
    seed: int = 1
    settle: float | None = None
    settle_factor: float = 1.0
    shrink_runs: int = 40
    shrink_seconds: float = 180.0
    max_failures: int = 3
    out: Path | None = None
    fleet_ports: tuple[int, ...] = ()


@attrs.frozen
class Failure:
    seed: int
    original_length: int
    minimal: tuple[str, ...]
    divergence: StepDivergence
    vector: str | None
    confirmed: bool
    repeats: int  # further traces that failed the same way (not shrunk)

    def to_json(self) -> dict[str, Any]:
        d = self.divergence
        return {"seed": self.seed, "original_length": self.original_length,
                "minimal_trace": list(self.minimal), "step": d.index + 1, "op": d.op,
                "diagnosis": d.words, "requirements": list(d.requirements),
                "loads_before": d.loads, "consistent_load_views": list(d.views),
                "vector": self.vector, "confirmed_on_rerun": self.confirmed,
                "same_kind_in_other_traces": self.repeats}


@attrs.define
class RouterReport:
    router: str
    command: list[str]
    claim: str
    session_header: str
    settle: SettlePlan | None = None
    traces: int = 0
    passed: int = 0
    failures: list[Failure] = attrs.field(factory=list)
    retries: int = 0
    ties: int = 0        # placements with two or more least-loaded backends (main traces)
    ties_first: int = 0  # ... where the router took the first in pool order
    band: dict[str, int] = attrs.field(factory=dict)  # band decisions met (main traces)
    router_runs: int = 0
    pool_changes: dict[str, int] = attrs.field(factory=dict)  # add/remove/drain driven
    probes: dict[str, int] = attrs.field(factory=dict)
    notes: list[str] = attrs.field(factory=list)
    out_dir: str = ""  # empty: a temporary directory removed after a pass
    seconds: float = 0.0

    @property
    def verdict(self) -> str:
        return "fail" if self.failures else ("pass" if self.passed else "no traces")

    def to_json(self) -> dict[str, Any]:
        s = self.settle
        return {"router": self.router, "command": self.command, "claim": self.claim,
                "session_header": self.session_header, "verdict": self.verdict,
                "settle": None if s is None else {"delay_s": round(s.delay, 4), "mode": s.mode,
                                                  "factor": s.factor, "how": s.how},
                "traces": self.traces, "passed": self.passed, "retries_seen": self.retries,
                "ties": self.ties, "ties_to_first_in_pool_order": self.ties_first,
                "band_decisions": self.band,
                "router_starts": self.router_runs, "pool_changes": self.pool_changes,
                "backend_probes": self.probes,
                "notes": self.notes, "out_dir": self.out_dir or None,
                "seconds": round(self.seconds, 1),
                "failures": [f.to_json() for f in self.failures]}


def _band(claim: Claim) -> tuple[int, int] | None:
    """The claimed context band's (T, cap) for the router command, or None."""
    tokens, cap = claim.config.affinity_break_tokens, claim.config.affinity_break_band_cap
    return None if tokens is None or cap is None else (tokens, cap)


def _kind(d: StepDivergence) -> tuple[object, ...]:
    return d.requirements


async def check_router(options: CheckOptions) -> RouterReport:
    """Run the whole check (see the module docstring)."""
    started = time.monotonic()
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)  # routers' HTTP/2 probes
    out = options.out or Path(tempfile.mkdtemp(prefix="affinity-check-router-"))
    out.mkdir(parents=True, exist_ok=True)
    preset, claim = options.preset, options.claim
    report = RouterReport(preset.name, [], claim.text, preset.session_header,
                          out_dir=str(out))
    shape = options.shape
    if preset.pool is None and shape.pool_percent:
        shape = attrs.evolve(shape, pool_percent=0)
        report.notes.append("pool changes not driven: the router has no pool-change API")
    if options.url is not None:
        report.notes.append("attached with --url: the router is not restarted between runs; "
                            "each run uses fresh session keys, but per-backend state the "
                            "router keeps (e.g. session counts) carries over")
    fleet = RecordingFleet(shape.backends, ports=options.fleet_ports)
    try:
        await fleet.start()
    except OSError as exc:
        await fleet.stop()
        raise PresetError(f"cannot bind the fleet's ports {options.fleet_ports}: {exc}") from None
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as http:
            target = Target(preset, backends=fleet.urls, routers=options.routers_venv,
                            margin=claim.config.affinity_break_margin,
                            extra=list(options.extra), url=options.url,
                            log_path=out / "router.log",
                            cache_size=claim.config.max_cache_size,
                            band=_band(claim))
            target.fleet = fleet
            try:
                await target.fresh(http)  # starts the router and calibrates the settle
                report.command = target.command or [f"(attached) {options.url}"]
                plan = target.settle_plan(options.settle_factor, options.settle)
                report.settle = plan
                await _run_all(options, shape, target, fleet, http, plan, report, out)
            finally:
                target.stop()
                report.router_runs = target.runs
                report.pool_changes = dict(sorted(target.pool_changes.items()))
                if target.restarts_after_exit:
                    report.notes.append(f"the router exited before it answered "
                                        f"{target.restarts_after_exit} time(s) and was "
                                        f"started again on new ports")
    finally:
        report.probes = dict(sorted(fleet.probes.items()))
        await fleet.stop()
    if options.out is None and report.verdict == "pass":
        shutil.rmtree(out, ignore_errors=True)
        report.out_dir = ""
    report.seconds = time.monotonic() - started
    return report


async def _run_all(options: CheckOptions, shape: TraceShape, target: Target,
                   fleet: RecordingFleet, http: aiohttp.ClientSession, plan: SettlePlan,
                   report: RouterReport, out: Path) -> None:
    claim = options.claim
    kinds: dict[tuple[object, ...], int] = {}
    for i in range(options.budget):
        seed = options.seed + i
        ops = generate(seed, shape)
        result = await run_trace(target, fleet, http, ops, claim, plan)
        report.traces += 1
        report.retries += result.retries
        report.ties += len(result.ties)
        report.ties_first += sum(1 for position, _ in result.ties if position == 0)
        for name, count in result.band.items():
            report.band[name] = report.band.get(name, 0) + count
        if result.divergence is None:
            report.passed += 1
            continue
        kind = _kind(result.divergence)
        if kind in kinds:
            index = kinds[kind]
            old = report.failures[index]
            report.failures[index] = attrs.evolve(old, repeats=old.repeats + 1)
            continue
        if len(report.failures) >= options.max_failures:
            report.notes.append(f"trace seed {seed} failed too; not shrunk (--max-failures)")
            continue
        kinds[kind] = len(report.failures)
        failure = await _shrunk(options, seed, ops, result, target, fleet, http, plan, out,
                                len(report.failures) + 1, report.notes)
        kinds.setdefault(_kind(failure.divergence), len(report.failures))
        report.failures.append(failure)


async def _shrunk(options: CheckOptions, seed: int, ops: list[Op], first: RunResult,
                  target: Target, fleet: RecordingFleet, http: aiohttp.ClientSession,
                  plan: SettlePlan, out: Path, number: int, notes: list[str]) -> Failure:
    assert first.divergence is not None
    prefix = ops[: first.divergence.index + 1]
    tries = 1
    last: list[RunResult] = []

    async def fails(candidate: Sequence[Op]) -> bool:
        for _ in range(tries):
            run = await run_trace(target, fleet, http, list(candidate), options.claim, plan)
            if run.divergence is not None:
                last[:] = [run]
                return True
        return False

    if not await fails(prefix):  # random choices: a candidate fails if any of its tries does
        tries = RANDOM_TRIES
        notes.append(f"trace seed {seed}: the failure did not recur on a rerun, so the router "
                     f"chooses at random here; each shrinking candidate got {tries} tries")
    deadline = time.monotonic() + options.shrink_seconds
    minimal = await shrink_ops(prefix, fails, options.shrink_runs, deadline)
    # The shrunk trace has failed once already; one rerun that passes is more likely a
    # router's passing glitch than a shrink gone wrong, so confirming gets RANDOM_TRIES
    # reruns in all, and a confirmation that needed more than one says so.
    confirmed = False
    for attempt in range(1, (RANDOM_TRIES if tries == 1 else 1) + 1):
        if await fails(minimal):
            confirmed = True
            if attempt > 1:
                notes.append(f"trace seed {seed}: the shrunk trace passed {attempt - 1} "
                             f"rerun(s) before it failed again; the router did not act the "
                             f"same on every run")
            break
    final = last[0] if confirmed else first
    if not confirmed:  # not reproduced: keep the unshrunk prefix
        minimal = prefix
    assert final.divergence is not None
    d = final.divergence
    kept = [op for op in minimal[: d.index + 1]]
    name = f"check_router_{options.preset.name.replace(':', '_').replace('-', '_')}_{number:02d}"
    description = (f"affinity check-router {options.preset.name} --policy {options.claim.text} "
                   f"(trace seed {seed}): step {d.index + 1} {d.op}: {d.words}")
    path = write_vector(out, name, description, options.claim.config,
                        server_ids(fleet.size), final.events, d.requirements)
    return Failure(seed, len(ops), tuple(describe(op) for op in kept), d, str(path),
                   confirmed, 0)


def run_sync(options: CheckOptions) -> RouterReport:
    return asyncio.run(check_router(options))
