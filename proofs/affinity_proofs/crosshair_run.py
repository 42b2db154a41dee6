"""Run CrossHair as a subprocess on :mod:`.contracts` and judge its output strictly.

Theory of operation
-------------------
CrossHair exits 0 unless it finds a counterexample, and prints "Unable to meet
precondition" and "Not confirmed" only with ``--report_all`` (formal-methods.md section 7,
gotcha 1). So every run passes ``--report_all`` and the output is parsed line by line:
``<file>:<line>: <level>: <message>``. Each line is attributed to a wrapper by its line
number (the wrapper's source range, via :mod:`inspect`).

A *spec* wrapper passes when every one of its ``post:`` lines got a verdict and each verdict
is "Confirmed over all paths" or "Not confirmed" (CrossHair is a bug finder on unbounded
ints; the proofs are Z3's). "Unable to meet precondition", an ``error``, a missing verdict
or any unparsed stderr is a failure. A *mutant* wrapper passes (is refuted) when CrossHair
reports an ``error`` -- a counterexample -- inside it.

``diffbehavior`` prints "No differences found" or a "Given: ..." block; the equivalent pair
must give the former, the mutant pair the latter.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import time
from collections.abc import Sequence

import attrs

from . import contracts

__all__ = ["CheckOutcome", "DiffOutcome", "FunctionVerdict", "parse_check", "run_check",
           "run_diff", "source_ranges"]

_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+): (?P<level>\w+): (?P<message>.*)$")
MODULE = "affinity_proofs.contracts"


@attrs.frozen
class FunctionVerdict:
    name: str
    posts: int  # post: lines in the docstring
    verdicts: tuple[str, ...]  # one message per reported condition
    errors: tuple[str, ...]

    @property
    def confirmed_or_open(self) -> bool:
        """Spec wrapper: every post got a benign verdict, and nothing else was said."""
        benign = all(v.startswith(("Confirmed", "Not confirmed")) for v in self.verdicts)
        return benign and not self.errors and len(self.verdicts) >= self.posts

    @property
    def refuted(self) -> bool:
        """A counterexample: a false post ("false when calling f(...)") or an exception
        ("ValueError when calling f(...)") -- not an unmet precondition."""
        return any("when calling" in e for e in self.errors)


@attrs.frozen
class CheckOutcome:
    functions: tuple[FunctionVerdict, ...]
    returncode: int
    stray: tuple[str, ...]  # output lines not attributable to a wrapper
    seconds: float

    def verdict(self, name: str) -> FunctionVerdict:
        for f in self.functions:
            if f.name == name:
                return f
        raise KeyError(name)


def source_ranges(names: Sequence[str]) -> dict[str, tuple[int, int, int]]:
    """name -> (first line, last line, number of post: lines)."""
    out = {}
    for name in names:
        fn = getattr(contracts, name)
        lines, start = inspect.getsourcelines(fn)
        posts = sum(1 for line in lines if line.strip().startswith("post:"))
        out[name] = (start, start + len(lines) - 1, posts)
    return out


def _command() -> list[str]:
    return [sys.executable, "-m", "crosshair"]


def parse_check(output: str, ranges: dict[str, tuple[int, int, int]]
                ) -> tuple[tuple[FunctionVerdict, ...], tuple[str, ...]]:
    """Attribute each ``file:line: level: message`` line to the wrapper whose source range
    holds the line; "Unable to meet precondition" counts as an error, never a verdict.
    Returns the per-wrapper verdicts and the lines no wrapper owns."""
    names = list(ranges)
    verdicts: dict[str, list[str]] = {n: [] for n in names}
    errors: dict[str, list[str]] = {n: [] for n in names}
    stray: list[str] = []
    for raw in output.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _LINE.match(line)
        owner = None
        if m is not None:
            number = int(m.group("line"))
            owner = next((n for n, (a, b, _) in ranges.items() if a <= number <= b), None)
        if m is None or owner is None:
            stray.append(line)
            continue
        message = m.group("message")
        if m.group("level") == "info" and "Unable to meet precondition" not in message:
            verdicts[owner].append(message)
        else:
            errors[owner].append(message)
    functions = tuple(FunctionVerdict(n, ranges[n][2], tuple(verdicts[n]), tuple(errors[n]))
                      for n in names)
    return functions, tuple(stray)


def run_check(names: Sequence[str], per_condition_timeout: float,
              timeout_s: float = 600.0) -> CheckOutcome:
    start = time.perf_counter()
    targets = [f"{MODULE}.{n}" for n in names]
    proc = subprocess.run(
        [*_command(), "check", "--report_all",
         f"--per_condition_timeout={per_condition_timeout}", *targets],
        capture_output=True, text=True, timeout=timeout_s, check=False)
    functions, stray = parse_check(proc.stdout + proc.stderr, source_ranges(names))
    return CheckOutcome(functions, proc.returncode, stray, time.perf_counter() - start)


@attrs.frozen
class DiffOutcome:
    differs: bool
    equivalent: bool  # "No differences found"
    output: str
    returncode: int
    seconds: float


def run_diff(first: str, second: str, per_condition_timeout: float,
             timeout_s: float = 600.0) -> DiffOutcome:
    start = time.perf_counter()
    proc = subprocess.run(
        [*_command(), "diffbehavior", f"--per_condition_timeout={per_condition_timeout}",
         f"{MODULE}.{first}", f"{MODULE}.{second}"],
        capture_output=True, text=True, timeout=timeout_s, check=False)
    out = (proc.stdout + proc.stderr).strip()
    differs = proc.returncode == 1 and out.startswith("Given:")
    equivalent = proc.returncode == 0 and out.startswith("No differences found")
    return DiffOutcome(differs, equivalent, out, proc.returncode, time.perf_counter() - start)
