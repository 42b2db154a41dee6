"""Cross-process determinism: one decision trace per process, compared across hash seeds.

Theory of operation
-------------------
``python -m affinity_proofs.det_trace --mode MODE [--reverse-servers]`` replays a fixed
event script with churn (placements, sticky hits, a removal, a re-add that moves a server
to the end of the pool, a new server, a clear) under ``full_determinism`` and prints the
decision trace -- every acquire with its outcome -- as canonical JSON on stdout.

* ``--mode stable``: ``hash_mode="stable"`` (R-DET-3, CRC-32 over sorted ids). Processes
  started with different ``PYTHONHASHSEED`` values -- and with the servers listed in
  another order -- must print identical traces.
* ``--mode builtin``: the *negative control*. ``hash_mode="caller"`` fed with Python's
  salted builtin ``hash(request_id)``, computed here in the shell, outside the core, as
  verl 0.9.1 does. Different seeds must give different traces; if they did not, the
  comparison above would prove nothing.

:func:`run_processes` starts the subprocesses and compares their output.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence

import attrs

from affinity_engine import (
    Acquire,
    AddServers,
    ClearStickyCache,
    Config,
    Event,
    Release,
    RemoveServers,
    initial_state,
    step,
)
from affinity_engine.codec import canonical_dumps, event_to_json, outcome_to_json

__all__ = ["SEEDS", "DeterminismResult", "main", "run_processes", "script", "trace"]

SERVERS = ("s0", "s1", "s2", "s3", "s4")
SEEDS = ("0", "12345", "random")


def script(request_hash: bool) -> list[Event]:
    """The fixed event script; ``request_hash`` adds the builtin hash (negative control)."""

    def acquire(rid: str) -> Acquire:
        # hash() is salted per process: this line is the whole point of the control.
        return Acquire(request_id=rid, request_hash=hash(rid) if request_hash else None)

    ids = [f"det-{i}" for i in range(12)]
    events: list[Event] = [acquire(r) for r in ids]
    events += [Release(server_id="s2"), acquire("det-3"), RemoveServers(server_ids=("s1",))]
    events += [acquire(r) for r in ids[:6]]
    events += [AddServers(server_ids=("s1", "s5")), ClearStickyCache()]
    events += [acquire(f"det-{i}") for i in range(6, 20)]
    return events


def trace(mode: str, reverse_servers: bool = False, mutant: str | None = None) -> str:
    if mode not in ("stable", "builtin"):
        raise ValueError(f"mode must be 'stable' or 'builtin', got {mode!r}")
    if mutant is not None:
        from .mutants import by_name

        with by_name(mutant).applied():
            return trace(mode, reverse_servers)
    config = Config(full_determinism=True,
                    hash_mode="stable" if mode == "stable" else "caller")
    servers = list(reversed(SERVERS)) if reverse_servers else list(SERVERS)
    state = initial_state(config, servers)
    lines = []
    for event in script(request_hash=mode == "builtin"):
        t = step(config, state, event)
        state = t.state
        if isinstance(event, Acquire):  # the decisions; pool order is not one
            shown = event_to_json(event)
            shown.pop("request_hash", None)  # the salted input itself is not the decision
            lines.append([shown, outcome_to_json(t.outcome)])
    return canonical_dumps(lines)


@attrs.frozen
class DeterminismResult:
    stable_identical: bool  # all seeds, both server orders
    builtin_differs: bool  # the negative control
    seconds: float
    detail: str


def _spawn(mode: str, seed: str, reverse: bool, mutant: str | None) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONHASHSEED=seed)
    cmd = [sys.executable, "-m", "affinity_proofs.det_trace", "--mode", mode]
    if reverse:
        cmd.append("--reverse-servers")
    if mutant is not None:
        cmd += ["--mutant", mutant]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def run_processes(seeds: Sequence[str] = SEEDS, timeout_s: float = 60.0,
                  mutant: str | None = None, control: bool = True) -> DeterminismResult:
    """Compare the traces of several processes; with ``mutant``, every process runs the
    core with that mutant applied (a mutant that breaks R-DET-3 must make them differ).
    ``control=False`` skips the builtin-hash processes (``builtin_differs`` is then
    False)."""
    start = time.perf_counter()
    plan = [*[("stable", s, False) for s in seeds], ("stable", seeds[0], True)]
    if control:
        plan += [("builtin", s, False) for s in seeds[:2]]
    jobs = {(mode, seed, reverse): _spawn(mode, seed, reverse, mutant)
            for mode, seed, reverse in plan}
    outputs: dict[tuple[str, str, bool], str] = {}
    for key, proc in jobs.items():
        out, err = proc.communicate(timeout=timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"det_trace {key} failed ({proc.returncode}): {err.strip()}")
        outputs[key] = out
    stable = {k: v for k, v in outputs.items() if k[0] == "stable"}
    builtin = [v for k, v in outputs.items() if k[0] == "builtin"]
    stable_identical = len(set(stable.values())) == 1
    builtin_differs = len(set(builtin)) > 1
    detail = (f"stable mode: {len(stable)} processes (PYTHONHASHSEED {', '.join(seeds)}; "
              f"and reversed server order) -> {len(set(stable.values()))} distinct trace(s); "
              f"builtin hash control: {len(builtin)} processes -> {len(set(builtin))} "
              f"distinct trace(s)")
    return DeterminismResult(stable_identical, builtin_differs,
                             time.perf_counter() - start, detail)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m affinity_proofs.det_trace")
    parser.add_argument("--mode", choices=("stable", "builtin"), required=True)
    parser.add_argument("--reverse-servers", action="store_true")
    parser.add_argument("--mutant", default=None, help="apply this affinity_proofs mutant")
    args = parser.parse_args(argv)
    print(trace(args.mode, args.reverse_servers, args.mutant))
    return 0


if __name__ == "__main__":
    sys.exit(main())
