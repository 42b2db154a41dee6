"""Worker processes with a time budget per job: no job can make ``affinity verify`` hang.

Theory of operation
-------------------
:class:`BudgetPool` keeps ``workers`` spawned processes, each in its own process group,
and feeds them jobs (a module-level function and picklable arguments) one at a time over a
pipe. The parent watches every running job against two limits:

* its **CPU budget**: the worker's user + system time (``/proc/<pid>/stat`` on Linux) since
  the job started. CPU time does not grow when other programs share the cores, so a
  budget that fits an idle machine also fits a loaded one;
* a **wall-clock cap** of ``wall_factor`` times the budget plus ``wall_slack`` seconds,
  for jobs that wait instead of computing (CrossHair and the determinism subprocesses run
  children; a deadlock burns no CPU).

A job past either limit is an *overrun*: its process group (the worker and any children
it started) is killed, the job is reported as :class:`Overrun`, and a fresh worker takes
the slot. A job that raises is reported with its traceback text (:class:`Crashed`). The
caller turns both into FAIL rows that name the job.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
import traceback
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

import attrs

__all__ = ["BudgetPool", "Crashed", "Overrun", "Task", "cpu_seconds"]


@attrs.frozen
class Task:
    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    budget: float  # CPU seconds
    lane: str = "cpu"  # each lane has its own number of worker processes


@attrs.frozen
class Crashed:
    traceback: str

    @property
    def last_line(self) -> str:
        lines = [ln for ln in self.traceback.strip().splitlines() if ln.strip()]
        return lines[-1] if lines else "(no traceback)"


@attrs.frozen
class Overrun:
    cpu: float
    wall: float
    budget: float
    limit: str  # "cpu" or "wall"


_STARTUP_WAIT = 60.0  # seconds a fresh worker may take to import and say "ready"
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a live process (and its reaped children), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # fields[0] is field 3 (state); utime, stime, cutime, cstime are fields 14..17.
    return sum(int(x) for x in fields[11:15]) / _TICKS


def _serve(conn: Connection) -> None:
    os.setpgrp()  # the parent can kill this worker together with its children
    # The interpreter's start-up is not the first task's cost: say when it is over.
    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        fn, args = message
        try:
            result: tuple[str, Any] = ("ok", fn(*args))
        except BaseException:
            result = ("crash", traceback.format_exc())
        conn.send(result)


@attrs.define
class _Slot:
    process: Any
    conn: Connection
    lane: str
    task: Task | None = None
    started: float = 0.0
    cpu_start: float = 0.0
    ready: bool = False  # the worker has sent its start-up "ready"


class BudgetPool:
    """Run tasks on worker processes; yield ``(task, result | Crashed | Overrun)``.

    ``lanes`` maps a lane name to its number of workers (a task runs in its own lane)."""

    def __init__(self, lanes: dict[str, int], *, wall_factor: float = 4.0,
                 wall_slack: float = 30.0, poll: float = 0.25) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._lanes = {lane: max(1, n) for lane, n in lanes.items()}
        self._wall_factor, self._wall_slack, self._poll = wall_factor, wall_slack, poll
        self._slots: list[_Slot] = []

    def _spawn(self, lane: str) -> _Slot:
        parent, child = self._context.Pipe()
        process = self._context.Process(target=_serve, args=(child,), daemon=True)
        process.start()
        child.close()
        return _Slot(process, parent, lane)

    def _kill(self, slot: _Slot) -> None:
        pid = slot.process.pid
        for kill in (lambda: os.killpg(pid, signal.SIGKILL), slot.process.kill):
            with contextlib.suppress(OSError):
                kill()
        slot.process.join(5)
        slot.conn.close()

    def _cpu(self, slot: _Slot) -> float:
        value = cpu_seconds(slot.process.pid)
        return value if value is not None else time.perf_counter()

    def run(self, tasks: Sequence[Task]) -> Generator[tuple[Task, Any], None, None]:
        """Results as they finish; closing the generator kills the workers."""
        todo: dict[str, deque[Task]] = {lane: deque() for lane in self._lanes}
        for task in tasks:
            todo[task.lane].append(task)
        self._slots = [self._spawn(lane) for lane, n in self._lanes.items()
                       for _ in range(min(n, len(todo[lane])))]
        try:
            yield from self._loop(todo)
        finally:
            for slot in self._slots:
                if slot.task is None:
                    with contextlib.suppress(OSError):
                        slot.conn.send(None)
                    slot.process.join(2)
                if slot.process.is_alive():
                    self._kill(slot)

    def _start(self, slot: _Slot, task: Task) -> None:
        if not slot.ready:  # a fresh worker: its CPU clock starts after its start-up
            if slot.conn.poll(_STARTUP_WAIT):
                with contextlib.suppress(EOFError, OSError):
                    slot.conn.recv()
            slot.ready = True
        slot.task, slot.started = task, time.perf_counter()
        slot.cpu_start = self._cpu(slot)
        slot.conn.send((task.fn, task.args))

    def _loop(self, todo: dict[str, deque[Task]]) -> Iterator[tuple[Task, Any]]:
        for slot in self._slots:
            if todo[slot.lane]:
                self._start(slot, todo[slot.lane].popleft())
        while any(s.task is not None for s in self._slots):
            busy = [s for s in self._slots if s.task is not None]
            ready = wait([s.conn for s in busy], timeout=self._poll)
            for i, slot in enumerate(self._slots):
                task = slot.task
                if task is None:
                    continue
                outcome: Any = None
                finished = False
                if slot.conn in ready:
                    try:
                        kind, value = slot.conn.recv()
                        outcome = value if kind == "ok" else Crashed(value)
                        cpu = self._cpu(slot) - slot.cpu_start
                        if cpu > task.budget:  # finished, but past its budget
                            outcome = Overrun(round(cpu, 1),
                                              round(time.perf_counter() - slot.started, 1),
                                              task.budget, "cpu")
                    except (EOFError, OSError) as exc:  # the worker died (e.g. killed, OOM)
                        outcome = Crashed(f"worker process died: {exc!r} "
                                          f"(exit code {slot.process.exitcode})")
                        self._kill(slot)
                        slot = self._slots[i] = self._spawn(slot.lane)
                    finished = True
                else:
                    cpu = self._cpu(slot) - slot.cpu_start
                    wall = time.perf_counter() - slot.started
                    wall_cap = task.budget * self._wall_factor + self._wall_slack
                    if cpu > task.budget or wall > wall_cap:
                        outcome = Overrun(round(cpu, 1), round(wall, 1), task.budget,
                                          "cpu" if cpu > task.budget else "wall")
                        self._kill(slot)
                        slot = self._slots[i] = self._spawn(slot.lane)
                        finished = True
                if finished:
                    slot.task = None
                    yield task, outcome
                    if todo[slot.lane]:
                        self._start(slot, todo[slot.lane].popleft())
