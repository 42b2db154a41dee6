"""Run workers in threads that CPython switches between as often as it can.

The persistent structures (the sticky map's log, a flat load table's store) share one
representation between versions and claim writes by appending; these smoke tests of
sharing one version between threads all need the same harness.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable


def run_switching(worker: Callable[[int], None], count: int = 4) -> None:
    """``worker(seed)`` for seeds ``0..count-1``, each in its own thread, with the switch
    interval at its minimum; returns once all have finished."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows
    try:
        threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(before)
