"""The vllm-cpu cost-model fit of sim/validate_vllm_cpu.py, on synthetic probes (no server)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBES = ((1, 16, 1), (1, 256, 1), (1, 768, 1), (1, 16, 65), (1, 256, 65), (1, 768, 65),
          (2, 16, 65))


def _module() -> ModuleType:
    # sim/ is a scripts directory, not a package: load the script by path.
    spec = importlib.util.spec_from_file_location("validate_vllm_cpu",
                                                  ROOT / "sim/validate_vllm_cpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("validate_vllm_cpu", module)
    spec.loader.exec_module(module)
    return module


def _rows(h: float, a: float, b: float, c: float, d: float) -> list[dict[str, Any]]:
    # The docstring's model T(N, M), evaluated exactly.
    rows = []
    for batch, n, m in PROBES:
        dec = m - 1
        t = (h + a + b * batch * n + d * batch * n * n / 2
             + dec * (a + b * batch + c * batch * (n + m / 2)))
        rows.append({"batch": batch, "prompt": n, "output": m, "seconds": t})
    return rows


def test_fit_recovers_known_non_negative_costs() -> None:
    truth = (0.003, 0.0018, 5e-6, 2e-8, 1e-9)
    got = _module().fit(_rows(*truth))["fit"]
    for key, value in zip(_module().FIT_KEYS, truth, strict=True):
        assert got[key] == pytest.approx(value, rel=1e-3, abs=1e-12), key


def test_fit_never_returns_a_negative_cost() -> None:
    # Probe times shaped so the free fit needs a negative per-token cost: a longer prompt
    # answered faster than a shorter one.
    rows = _rows(0.003, 0.0018, 0.0, 0.0, 1e-8)
    rows[4]["seconds"] -= 0.004
    result = _module().fit(rows)
    assert min(result["fit_unconstrained"].values()) < 0  # the mutant case is really hit
    assert min(result["fit"].values()) >= 0
    assert len(result["fitted_seconds"]) == len(rows)
