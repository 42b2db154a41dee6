"""Prometheus text format: a tiny writer for the router and a tolerant reader for vLLM.

Theory of operation
-------------------
The router exposes a handful of families (counters, gauges, one histogram) and reads a
few gauges and counters from each vLLM backend. Both directions use the Prometheus text
exposition format 0.0.4, which is small enough to handle directly:

* :class:`Registry` holds families in registration order. A family is a name, a type,
  a help line and samples keyed by a label tuple. Counters only go up
  (:meth:`Family.inc` rejects negative amounts), gauges are set, and
  :class:`Histogram` keeps cumulative bucket counts, a sum and a count.
  ``Registry.render()`` writes ``# HELP``/``# TYPE`` lines and one sample per line, with
  label values escaped (backslash, double quote, newline).
* :func:`parse_samples` reads exposition text into ``(name, labels, value)`` triples. It
  skips comments and blank lines and ignores lines it cannot parse rather than failing:
  a backend's metrics page is advisory input, and one odd line must not blind the
  router to the rest. :func:`sum_samples` adds a metric over all label sets (vLLM labels
  every series with ``engine`` and ``model_name``; a data-parallel server has several
  engines).

All state lives in plain dicts mutated from the event loop thread only, so no locks.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Sequence

__all__ = [
    "Family",
    "Histogram",
    "LabeledHistogram",
    "Registry",
    "parse_samples",
    "sum_samples",
]

Labels = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _format_labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


def _format_value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


class Family:
    """A counter or gauge family: samples keyed by label values."""

    def __init__(self, name: str, kind: str, help_text: str, label_names: Sequence[str]):
        if kind not in ("counter", "gauge"):
            raise ValueError(f"metric kind must be 'counter' or 'gauge', got {kind!r}")
        self.name = name
        self.kind = kind
        self.help_text = help_text
        self.label_names = tuple(label_names)
        self.samples: dict[tuple[str, ...], float] = {}

    def _key(self, values: Sequence[str]) -> tuple[str, ...]:
        if len(values) != len(self.label_names):
            raise ValueError(
                f"{self.name} takes labels {self.label_names}, got values {tuple(values)}"
            )
        return tuple(values)

    def inc(self, *values: str, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter cannot decrease (amount {amount})")
        key = self._key(values)
        self.samples[key] = self.samples.get(key, 0.0) + amount

    def set(self, *values: str, value: float) -> None:
        self.samples[self._key(values)] = value

    def remove(self, *values: str) -> None:
        self.samples.pop(self._key(values), None)

    def get(self, *values: str) -> float:
        return self.samples.get(self._key(values), 0.0)

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help_text}"
        yield f"# TYPE {self.name} {self.kind}"
        for key, value in self.samples.items():
            labels = tuple(zip(self.label_names, key, strict=True))
            yield f"{self.name}{_format_labels(labels)} {_format_value(value)}"


class Histogram:
    """A label-less histogram with fixed upper bounds (seconds, typically)."""

    def __init__(self, name: str, help_text: str, buckets: Sequence[float]):
        bounds = sorted(float(b) for b in buckets)
        if not bounds or any(b <= 0 for b in bounds):
            raise ValueError(f"{name}: buckets must be positive, got {list(buckets)}")
        self.name = name
        self.kind = "histogram"
        self.help_text = help_text
        self.bounds = bounds
        self.counts = [0] * len(bounds)  # per bucket, not cumulative
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.bounds, value)  # the first bound >= value
        if index < len(self.counts):
            self.counts[index] += 1
        self.total += value
        self.count += 1

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help_text}"
        yield f"# TYPE {self.name} histogram"
        cumulative = 0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            cumulative += count
            yield f'{self.name}_bucket{{le="{_format_value(bound)}"}} {cumulative}'
        yield f'{self.name}_bucket{{le="+Inf"}} {self.count}'
        yield f"{self.name}_sum {_format_value(self.total)}"
        yield f"{self.name}_count {self.count}"


class LabeledHistogram:
    """Histograms with the same bounds, one per label value (e.g. per backend)."""

    def __init__(self, name: str, help_text: str, label: str, buckets: Sequence[float]):
        self.name, self.kind, self.help_text, self.label = name, "histogram", help_text, label
        self._buckets = tuple(buckets)
        self.children: dict[str, Histogram] = {}
        Histogram(name, help_text, buckets)  # validates the buckets now

    def observe(self, value_of_label: str, value: float) -> None:
        child = self.children.get(value_of_label)
        if child is None:
            child = self.children[value_of_label] = Histogram(self.name, self.help_text,
                                                               self._buckets)
        child.observe(value)

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help_text}"
        yield f"# TYPE {self.name} histogram"
        for label_value, child in sorted(self.children.items()):
            label = f'{self.label}="{_escape(label_value)}"'
            cumulative = 0
            for bound, count in zip(child.bounds, child.counts, strict=True):
                cumulative += count
                yield f'{self.name}_bucket{{{label},le="{_format_value(bound)}"}} {cumulative}'
            yield f'{self.name}_bucket{{{label},le="+Inf"}} {child.count}'
            yield f"{self.name}_sum{{{label}}} {_format_value(child.total)}"
            yield f"{self.name}_count{{{label}}} {child.count}"


class Registry:
    """Families in registration order; ``render()`` is the /metrics page."""

    def __init__(self) -> None:
        self._families: list[Family | Histogram | LabeledHistogram] = []

    def counter(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Family:
        return self._add(Family(name, "counter", help_text, labels))

    def gauge(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Family:
        return self._add(Family(name, "gauge", help_text, labels))

    def histogram(self, name: str, help_text: str, buckets: Sequence[float]) -> Histogram:
        family = Histogram(name, help_text, buckets)
        self._families.append(family)
        return family

    def labeled_histogram(self, name: str, help_text: str, label: str,
                          buckets: Sequence[float]) -> LabeledHistogram:
        family = LabeledHistogram(name, help_text, label, buckets)
        self._families.append(family)
        return family

    def _add(self, family: Family) -> Family:
        self._families.append(family)
        return family

    def render(self) -> str:
        lines: list[str] = []
        for family in self._families:
            lines.extend(family.render())
        return "\n".join(lines) + "\n"


# name{labels} value [timestamp]
_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"(?:\{(?P<labels>.*)\})?"
    r"\s+(?P<value>\S+)(?:\s+\S+)?\s*$"
)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` for every parseable sample line; others are skipped."""
    out: list[tuple[str, dict[str, str], float]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        try:
            value = float(match.group("value"))
        except ValueError:
            continue
        labels = {k: _unescape(v) for k, v in _LABEL.findall(match.group("labels") or "")}
        out.append((match.group("name"), labels, value))
    return out


def sum_samples(samples: Iterable[tuple[str, dict[str, str], float]], name: str) -> float | None:
    """The sum of ``name`` over all label sets, or None when the page has no such sample."""
    values = [value for sample_name, _, value in samples if sample_name == name]
    if not values:
        return None
    return math.fsum(values)
