"""Length and latency distributions for workload files.

Theory of operation
-------------------
A workload names each random quantity (turn count, prompt tokens, output tokens per turn,
tool-response tokens, tool latency) by a small table such as
``{dist = "lognormal", median = 900, sigma = 0.9, max = 6000}``. :func:`parse` turns that
table into a :class:`Distribution`, validating every field up front so a bad file fails
with the offending key and the accepted range before any simulation starts.

Sampling uses a caller-owned ``random.Random``: the simulator draws a whole step's
workload from one seeded stream before the first event, so every routing policy replays
exactly the same trajectories for a given seed (the pairing of the comparison).

Supported kinds: ``constant`` (``value``), ``uniform`` (``low``, ``high``, real),
``uniform_int`` (``low``, ``high``, inclusive), ``lognormal`` (``median``, ``sigma``),
``normal`` (``mean``, ``std``), ``exponential`` (``mean``) and ``choice`` (``values``,
optional ``weights``). Every kind accepts ``min`` and ``max`` clamps. A bare number is a
constant.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["KINDS", "Distribution", "DistributionError", "parse"]


class DistributionError(ValueError):
    """A distribution table is malformed."""


KINDS: dict[str, tuple[str, ...]] = {
    "constant": ("value",),
    "uniform": ("low", "high"),
    "uniform_int": ("low", "high"),
    "lognormal": ("median", "sigma"),
    "normal": ("mean", "std"),
    "exponential": ("mean",),
    "choice": ("values",),
}
_OPTIONAL = {"min", "max", "weights"}


@attrs.frozen
class Distribution:
    """One validated distribution; :meth:`sample` draws a float, :meth:`sample_int` rounds."""

    kind: str
    params: tuple[tuple[str, Any], ...]
    low_clamp: float | None = None
    high_clamp: float | None = None

    def sample(self, rng: random.Random) -> float:
        p = dict(self.params)
        kind = self.kind
        if kind == "constant":
            value = float(p["value"])
        elif kind == "uniform":
            value = rng.uniform(p["low"], p["high"])
        elif kind == "uniform_int":
            value = float(rng.randint(int(p["low"]), int(p["high"])))
        elif kind == "lognormal":
            value = rng.lognormvariate(math.log(p["median"]), p["sigma"])
        elif kind == "normal":
            value = rng.gauss(p["mean"], p["std"])
        elif kind == "exponential":
            value = rng.expovariate(1.0 / p["mean"]) if p["mean"] > 0 else 0.0
        else:  # choice
            weights = p.get("weights")
            value = float(rng.choices(p["values"], weights=weights)[0])
        if self.low_clamp is not None:
            value = max(value, self.low_clamp)
        if self.high_clamp is not None:
            value = min(value, self.high_clamp)
        return value

    def sample_int(self, rng: random.Random) -> int:
        return round(self.sample(rng))

    def describe(self) -> dict[str, Any]:
        """The table form, as a workload file would spell it."""
        out: dict[str, Any] = {"dist": self.kind, **dict(self.params)}
        if self.low_clamp is not None:
            out["min"] = self.low_clamp
        if self.high_clamp is not None:
            out["max"] = self.high_clamp
        return out


def _number(where: str, key: str, value: object, *, low: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DistributionError(f"{where}.{key} must be a finite number, got {value!r}")
    if low is not None and value < low:
        raise DistributionError(f"{where}.{key} must be >= {low}, got {value!r}")
    return float(value)


def parse(where: str, spec: object) -> Distribution:
    """Validate ``spec`` (a table or a bare number); ``where`` names it in errors."""
    if isinstance(spec, Distribution):
        return spec
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        _number(where, "value", spec)
        return Distribution("constant", (("value", float(spec)),))
    if not isinstance(spec, Mapping):
        raise DistributionError(
            f"{where} must be a number or a table like {{dist = \"lognormal\", median = 500, "
            f"sigma = 0.5}}, got {spec!r}"
        )
    kind = spec.get("dist")
    if kind not in KINDS:
        raise DistributionError(
            f"{where}.dist must be one of {', '.join(sorted(KINDS))}, got {kind!r}"
        )
    required = KINDS[kind]
    unknown = set(spec) - set(required) - _OPTIONAL - {"dist"}
    if unknown:
        raise DistributionError(
            f"{where}: unknown keys {sorted(unknown)} for dist {kind!r}; "
            f"accepted: {sorted(set(required) | _OPTIONAL)}"
        )
    missing = [k for k in required if k not in spec]
    if missing:
        raise DistributionError(f"{where}: dist {kind!r} needs {missing}")
    params: dict[str, Any] = {}
    if kind == "choice":
        values = spec["values"]
        if not isinstance(values, list) or not values:
            raise DistributionError(f"{where}.values must be a non-empty list, got {values!r}")
        params["values"] = [_number(where, "values[]", v) for v in values]
        if "weights" in spec:
            weights = spec["weights"]
            if not isinstance(weights, list) or len(weights) != len(values):
                raise DistributionError(
                    f"{where}.weights must be a list as long as values, got {weights!r}"
                )
            params["weights"] = [_number(where, "weights[]", w, low=0.0) for w in weights]
    else:
        for key in required:
            params[key] = _number(where, key, spec[key])
        _check_ranges(where, kind, params)
    low = _number(where, "min", spec["min"]) if "min" in spec else None
    high = _number(where, "max", spec["max"]) if "max" in spec else None
    if low is not None and high is not None and low > high:
        raise DistributionError(f"{where}: min {low} is above max {high}")
    return Distribution(kind, tuple(params.items()), low, high)


def _check_ranges(where: str, kind: str, params: dict[str, Any]) -> None:
    if kind in ("uniform", "uniform_int") and params["low"] > params["high"]:
        raise DistributionError(
            f"{where}: low {params['low']} is above high {params['high']}"
        )
    if kind == "uniform_int":
        for key in ("low", "high"):
            if not float(params[key]).is_integer():
                raise DistributionError(f"{where}.{key} must be an integer, got {params[key]}")
    if kind == "lognormal":
        if params["median"] <= 0:
            raise DistributionError(f"{where}.median must be > 0, got {params['median']}")
        if params["sigma"] < 0:
            raise DistributionError(f"{where}.sigma must be >= 0, got {params['sigma']}")
    if kind == "normal" and params["std"] < 0:
        raise DistributionError(f"{where}.std must be >= 0, got {params['std']}")
    if kind == "exponential" and params["mean"] < 0:
        raise DistributionError(f"{where}.mean must be >= 0, got {params['mean']}")
