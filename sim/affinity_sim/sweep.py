"""Sweeps: (workload, seed) tasks fanned out on Ray, on processes, or serially.

Theory of operation
-------------------
A :class:`Sweep` is workloads x policies x seeds. The unit of work is one (workload,
seed) pair: :func:`run_task` draws the seed's trajectories once and simulates them under
every policy, so the pairing is exact and the plan is not redrawn per policy.

:func:`run_sweep` runs the tasks with

* **Ray** when it is importable and not disabled: ``ray.init(address=...)`` joins a
  cluster, or starts a local one by default. Ray is imported only here, lazily, so the
  simulator works without the ``verl`` extra;
* a ``multiprocessing.Pool`` otherwise (or with ``use_ray=False``; Ctrl-C terminates it);
* in-process when ``workers == 1`` (tests, profiling).

Every task is deterministic, so the three back-ends give identical results; results
are re-sorted into (workload, policy, seed) order before they are returned. A callback
reports each finished task, which the CLI turns into a progress bar.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from .routing import PolicySpec
from .simulate import StepResult, simulate_step
from .workload import Workload, plan_step

__all__ = ["Sweep", "run_sweep", "run_task"]


@attrs.frozen(kw_only=True)
class Sweep:
    """What to run: every policy on every workload for ``seeds`` seeds."""

    name: str
    workloads: tuple[Workload, ...]
    policies: tuple[PolicySpec, ...]
    seeds: int
    first_seed: int = 0
    # The PR's reported numbers per workload name, printed next to the results.
    reference: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    description: str = ""

    def __attrs_post_init__(self) -> None:
        if isinstance(self.seeds, bool) or not isinstance(self.seeds, int) or self.seeds < 1:
            raise ValueError(f"seeds must be an integer >= 1, got {self.seeds!r}")
        first = self.first_seed
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise ValueError(f"first_seed must be an integer >= 0, got {first!r}")
        if not self.workloads:
            raise ValueError("a sweep needs at least one workload")
        names = [w.name for w in self.workloads]
        if len(set(names)) != len(names):
            raise ValueError(f"workload names must be unique, got {names}")

    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))

    def reference_for(self, workload: str) -> dict[str, Any]:
        """The PR's numbers for ``workload``; a variant ``row/...`` of a sensitivity run or
        the ablation is read against its row's numbers."""
        references = dict(self.reference)
        found = references.get(workload, references.get(workload.partition("/")[0], ()))
        return dict(found)


def run_task(workload: Workload, policies: Sequence[PolicySpec], seed: int) -> list[StepResult]:
    """One seed of one workload under every policy (same trajectories for all)."""
    plans = plan_step(workload, seed)
    return [simulate_step(workload, policy, seed, plans) for policy in policies]


Progress = Callable[[int, int], None]  # (tasks done, tasks total)


def _order(sweep: Sweep, results: list[StepResult]) -> list[StepResult]:
    rank_w = {w.name: i for i, w in enumerate(sweep.workloads)}
    rank_p = {p.name: i for i, p in enumerate(sweep.policies)}
    return sorted(results, key=lambda r: (rank_w[r.workload], rank_p[r.policy], r.seed))


def _ignore_sigint() -> None:
    """Pool workers leave Ctrl-C to the parent, which terminates them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_packed(job: tuple[Workload, Sequence[PolicySpec], int]) -> list[StepResult]:
    return run_task(*job)


def _ray_module() -> Any:
    try:
        import ray
    except ImportError:
        return None
    return ray


def run_sweep(
    sweep: Sweep,
    *,
    workers: int | None = None,
    use_ray: bool = True,
    address: str | None = None,
    progress: Progress | None = None,
) -> tuple[list[StepResult], str]:
    """All results, in (workload, policy, seed) order, and the back-end that ran them."""
    tasks = [(w, s) for w in sweep.workloads for s in sweep.seed_list()]
    total = len(tasks)
    report = progress or (lambda done, total: None)
    workers = workers or os.cpu_count() or 1
    results: list[StepResult] = []
    if address is not None and not use_ray:
        raise RuntimeError(f"--address {address!r} joins a Ray cluster; it cannot go with --no-ray")
    ray = _ray_module() if use_ray else None
    if address is not None and ray is None:
        raise RuntimeError(
            f"--address {address!r} needs Ray: install the 'verl' extra or drop --address"
        )
    if ray is not None and (workers > 1 or address is not None):
        backend = _run_on_ray(ray, sweep, tasks, workers, address, report, results)
    elif workers > 1 and total > 1:
        # multiprocessing.Pool, not ProcessPoolExecutor: leaving the block on Ctrl-C (or a
        # failed step) terminates the workers at once; the executor finished every queued
        # step first, so Ctrl-C took up to a minute.
        jobs = [(w, sweep.policies, s) for w, s in tasks]
        with multiprocessing.Pool(min(workers, total), initializer=_ignore_sigint) as pool:
            for done, part in enumerate(pool.imap_unordered(_run_packed, jobs), 1):
                results.extend(part)
                report(done, total)
        backend = f"processes ({min(workers, total)})"
    else:
        for done, (w, s) in enumerate(tasks, 1):
            results.extend(run_task(w, sweep.policies, s))
            report(done, total)
        backend = "serial"
    return _order(sweep, results), backend


def _run_on_ray(ray: Any, sweep: Sweep, tasks: list[tuple[Workload, int]], workers: int,
                address: str | None, report: Progress, results: list[StepResult]) -> str:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.60 writes a token otherwise
    started_here = not ray.is_initialized()
    if started_here:
        if address is None:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    try:
        remote_task = ray.remote(run_task)
        policies = ray.put(sweep.policies)
        pending = [remote_task.remote(w, policies, s) for w, s in tasks]
        done = 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            results.extend(ray.get(ready[0]))
            done += 1
            report(done, len(tasks))
        where = address or "local"
        return f"ray ({where}, {int(ray.cluster_resources().get('CPU', 0))} CPUs)"
    finally:
        if started_here:
            ray.shutdown()
