"""Built-in sweeps (``pr7435``, ``pr7435-scale`` and its ``-ablation``,
``-context-per-request``, ``-dispersion``, ``-step-size``, ``-turns`` and ``-pool`` runs,
``smoke``, ``perf``),
workload files.

Theory of operation
-------------------
``pr7435`` has one workload per row of PR #7435's table. All four share the cost model
of Qwen2.5-32B at TP4 on H200 (:mod:`affinity_sim.costmodel`), 16 replicas, 32 prompts
x 16 samples, 1-8 turns, short tool responses and ~ms tool latency. Per the issue, only
two things were calibrated per workload, and only against the *baseline* hit rate and
the PR's approximate context -- never against a policy's result:

* the output-length distribution (its median), so the mean final context matches the
  PR's "approximate context";
* the KV pool size (``kv_capacity_tokens``), by bisection until the legacy policy's
  prefix hit rate is within the PR's +-2 points (``affinity_sim.calibrate``).

The calibrated numbers and the procedure are recorded in sim/studies/README.md.

A workload file is TOML (``.toml``) or YAML (``.yaml``/``.yml``)::

    name = "my-sweep"
    seeds = 30
    policies = ["legacy", "margin-2", {name = "m3", affinity_break_margin = 3}]

    [[workloads]]
    name = "agentic"
    base = "pr7435/ctx9k"        # optional: start from a built-in workload
    prompts = 16
    output_tokens = {dist = "lognormal", median = 700, sigma = 0.9}
    model = {kv_capacity_tokens = 400000}

Workload keys are the :class:`~affinity_sim.workload.Workload` fields; ``model`` is a
table of :class:`~affinity_sim.costmodel.ReplicaModel` fields (``base`` in it names a
model preset, default ``qwen2.5-32b-tp4-h200``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from .costmodel import QWEN25_32B_TP4_H200, ReplicaModel
from .distributions import parse
from .routing import DEFAULT_POLICIES, parse_policies
from .sweep import Sweep
from .workload import Workload

__all__ = ["CAVEATS", "MODELS", "PRESETS", "RAY_FREE_PRESETS", "PresetError", "load_sweep",
           "preset", "workload_preset"]

MODELS: dict[str, ReplicaModel] = {"qwen2.5-32b-tp4-h200": QWEN25_32B_TP4_H200}


class PresetError(ValueError):
    """A preset name or workload file is not valid."""


def _d(spec: object, where: str = "preset") -> Any:
    return parse(where, spec)


# Shared by every pr7435 workload (fixed before calibration, never tuned).
_PROMPT = {"dist": "lognormal", "median": 200, "sigma": 0.3, "min": 64, "max": 1024}
_TURNS = {"dist": "uniform_int", "low": 1, "high": 8}
_TOOL_TOKENS = {"dist": "lognormal", "median": 20, "sigma": 0.6, "max": 512}
_TOOL_LATENCY = {"dist": "lognormal", "median": 0.02, "sigma": 1.0, "max": 1.0}


def _pr_workload(name: str, description: str, output_median: float, max_context: int,
                 kv_capacity_tokens: int, target_hit_rate: float) -> Workload:
    return Workload(
        name=name,
        description=description,
        replicas=16,
        prompts=32,
        samples=16,
        turns=_d(_TURNS),
        prompt_tokens=_d(_PROMPT),
        output_tokens=_d({"dist": "lognormal", "median": output_median, "sigma": 0.8}),
        tool_tokens=_d(_TOOL_TOKENS),
        tool_latency_s=_d(_TOOL_LATENCY),
        max_context=max_context,
        model=QWEN25_32B_TP4_H200.with_capacity(kv_capacity_tokens),
        target_hit_rate=target_hit_rate,
    )


# Calibrated values: see sim/studies/README.md, "Calibration".
_PR_WORKLOADS = (
    _pr_workload("ctx2k", "~2.2K context", 325, 4096, 16_800, 0.087),
    _pr_workload("ctx9k", "~8.7K context", 1_410, 16_384, 48_400, 0.053),
    _pr_workload("ctx20k", "~19.8K context", 3_510, 32_768, 68_400, 0.016),
    _pr_workload("ctx9k-bigkv", "~8.7K context, large KV pool", 1_410, 16_384,
                 QWEN25_32B_TP4_H200.kv_capacity_tokens, 0.997),
)
_PR_REFERENCE = (
    ("ctx2k", (("context", "2.2K"), ("hit_rate", 0.087), ("steps", 39), ("change", -0.038))),
    ("ctx9k", (("context", "8.7K"), ("hit_rate", 0.053), ("steps", 9), ("change", -0.086))),
    ("ctx20k", (("context", "19.8K"), ("hit_rate", 0.016), ("steps", 17), ("change", -0.101))),
    ("ctx9k-bigkv", (("context", "8.7K, large KV"), ("hit_rate", 0.997), ("steps", 39),
                     ("change", -0.054))),
)


def _smoke_workload() -> Workload:
    return Workload(
        name="smoke",
        description="4 replicas, 8 x 4 trajectories, small KV pool (CI)",
        replicas=4,
        prompts=8,
        samples=4,
        turns=_d({"dist": "uniform_int", "low": 1, "high": 4}),
        prompt_tokens=_d({"dist": "lognormal", "median": 200, "sigma": 0.3}),
        output_tokens=_d({"dist": "lognormal", "median": 300, "sigma": 0.8}),
        tool_tokens=_d({"dist": "constant", "value": 30}),
        tool_latency_s=_d({"dist": "constant", "value": 0.0}),
        max_context=2048,
        model=QWEN25_32B_TP4_H200.with_capacity(8_192),
    )


def _perf_workload() -> Workload:
    """Exactly 512 trajectories x 8 turns on 16 replicas (no trajectory hits the limit)."""
    base = _PR_WORKLOADS[1]
    return attrs.evolve(
        base, name="perf-512x8", description="16 replicas, 512 trajectories x 8 turns",
        turns=_d({"dist": "constant", "value": 8}),
        output_tokens=_d({"dist": "lognormal", "median": 1000, "sigma": 0.8, "max": 3000}),
        max_context=32_768, model=base.model.with_capacity(200_000))


# The PR-scale prediction and its ablation and sensitivity runs: preset -> (module, builder).
_PR_SCALE = {
    "pr7435-scale": ("prscale", "scale_sweep"),
    "pr7435-scale-ablation": ("prscale", "ablation_sweep"),
    "pr7435-scale-context-per-request": ("prscale_context", "per_request_sweep"),
    "pr7435-scale-dispersion": ("prscale_dispersion", "dispersion_sweep"),
    "pr7435-scale-step-size": ("prscale_stepsize", "step_size_sweep"),
    "pr7435-scale-turns": ("prscale_turns", "turn_sweep"),
    "pr7435-scale-pool": ("prscale_pool", "pool_sweep"),
    "pr7435-scale-replication": ("prscale_replication", "replication_sweep"),
}


def preset(name: str) -> Sweep:
    """A built-in sweep by name (see :data:`PRESETS`)."""
    policies = tuple(parse_policies(DEFAULT_POLICIES))
    if name == "pr7435":
        return Sweep(name=name, workloads=_PR_WORKLOADS, policies=policies, seeds=30,
                     reference=_PR_REFERENCE,
                     description="PR #7435's four paired workloads (Qwen2.5-32B, 16 replicas)")
    if name == "smoke":
        return Sweep(name=name, workloads=(_smoke_workload(),), policies=policies, seeds=30,
                     description="CI smoke: one small workload, every policy")
    if name == "perf":
        return Sweep(name=name, workloads=(_perf_workload(),),
                     policies=tuple(parse_policies(["legacy"])), seeds=1,
                     description="timing: 16 replicas, 512 trajectories x 8 turns")
    if name in _PR_SCALE:
        module, function = _PR_SCALE[name]
        # Imported on use: each PR-scale module is only needed for its own preset.
        built: Sweep = getattr(importlib.import_module(f".{module}", __package__), function)()
        return built
    raise PresetError(f"unknown preset {name!r}; accepted: {', '.join(PRESETS)} or a "
                      ".toml/.yaml workload file")


PRESETS = ("pr7435", *_PR_SCALE, "smoke", "perf")

# Presets whose work takes seconds: starting a local Ray cluster (about 30 s) would dwarf
# it, so they run in local processes unless --address names a cluster to join.
RAY_FREE_PRESETS = ("smoke",)

# What a reader must know next to a preset's numbers.
CAVEATS = {
    "pr7435": (
        "pr7435's KV pools are calibrated to the PR's baseline hit rates, and with them the "
        "simulation overstates the margin's gain 2-5x against PR #7435's own numbers; do "
        "not read these as a forecast. For a prediction "
        "made before looking at the PR's results, run --preset pr7435-scale (sim/README.md "
        "in Affinity's source repository)."
    ),
}


def workload_preset(ref: str) -> Workload:
    """``"pr7435/ctx9k"`` -> that built-in workload."""
    sweep_name, _, workload_name = ref.partition("/")
    try:
        workloads = preset(sweep_name).workloads
    except PresetError:
        workloads = ()
    for w in workloads:
        if w.name == workload_name:
            return w
    known = [f"{p}/{w.name}" for p in PRESETS for w in preset(p).workloads]
    raise PresetError(f"unknown base workload {ref!r}; accepted: {', '.join(known)}")


_WORKLOAD_KEYS = {f.name for f in attrs.fields(Workload)} | {"base"}
_DIST_KEYS = ("turns", "prompt_tokens", "output_tokens", "tool_tokens", "tool_latency_s")
# The least value the simulator uses for each (workload.py clamps samples up to it): a
# constant below it is a mistake in the file, not a sample to clamp silently.
_FLOORS = {"turns": 1, "prompt_tokens": 1, "output_tokens": 1, "tool_tokens": 0,
           "tool_latency_s": 0}
_MODEL_KEYS = {f.name for f in attrs.fields(ReplicaModel)} | {"base"}
_SWEEP_KEYS = {"name", "description", "seeds", "first_seed", "policies", "workloads", "model"}


def _model(table: Mapping[str, Any], where: str, default: ReplicaModel) -> ReplicaModel:
    unknown = set(table) - _MODEL_KEYS
    if unknown:
        raise PresetError(f"{where}: unknown model keys {sorted(unknown)}; "
                          f"accepted: {sorted(_MODEL_KEYS)}")
    base = default
    if "base" in table:
        if table["base"] not in MODELS:
            raise PresetError(f"{where}.base must be one of {sorted(MODELS)}, "
                              f"got {table['base']!r}")
        base = MODELS[table["base"]]
    fields = {k: v for k, v in table.items() if k != "base"}
    try:
        return attrs.evolve(base, **fields)
    except (ValueError, TypeError) as exc:
        raise PresetError(f"{where}: {exc}") from None


def _workload(table: Mapping[str, Any], index: int, model: ReplicaModel) -> Workload:
    where = f"workloads[{index}]"
    if not isinstance(table, Mapping):
        raise PresetError(f"{where} must be a table, got {table!r}")
    unknown = set(table) - _WORKLOAD_KEYS
    if unknown:
        raise PresetError(f"{where}: unknown keys {sorted(unknown)}; "
                          f"accepted: {sorted(_WORKLOAD_KEYS)}")
    fields: dict[str, Any] = {k: v for k, v in table.items() if k not in ("base", "model")}
    for key in ("name", "description"):
        if key in fields and not isinstance(fields[key], str):
            raise PresetError(f"{where}.{key} must be a string, got {fields[key]!r}")
    for key in _DIST_KEYS:
        if key in fields:
            try:
                fields[key] = parse(f"{where}.{key}", fields[key])
            except TypeError:  # e.g. dist = [] (unhashable)
                raise PresetError(f"{where}.{key}: malformed distribution "
                                  f"{fields[key]!r}") from None
            if fields[key].kind == "constant" and (
                    dict(fields[key].params)["value"] < _FLOORS[key]):
                raise PresetError(f"{where}.{key} must be >= {_FLOORS[key]}, got "
                                  f"{dict(fields[key].params)['value']:g}")
    if "base" in table:
        base = workload_preset(str(table["base"]))
        model = base.model
    if "model" in table:
        model = _model(table["model"], f"{where}.model", model)
    fields["model"] = model
    try:
        if "base" in table:
            return attrs.evolve(base, **fields)
        missing = sorted({f.name for f in attrs.fields(Workload) if f.default is attrs.NOTHING}
                         - set(fields))
        if missing:
            raise PresetError(f"{where}: missing keys {missing} (or give base = \"pr7435/...\")")
        return Workload(**fields)
    except (ValueError, TypeError) as exc:
        if isinstance(exc, PresetError):
            raise
        raise PresetError(f"{where}: {exc}") from None


def load_sweep(path: str | Path) -> Sweep:
    """Read a TOML or YAML workload file into a :class:`Sweep`."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise PresetError(f"workload file {str(path)!r} {what}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PresetError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if path.suffix == ".toml":
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # Python 3.10: the same parser, as the [sim] extra's tomli
            import tomli as tomllib

        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PresetError(f"{path}: invalid TOML: {exc}") from None
    elif path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:  # one line: the problem and where, not yaml's excerpt
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
            raise PresetError(f"{path}: invalid YAML{at}: "
                              f"{getattr(exc, 'problem', None) or exc}") from None
    else:
        raise PresetError(f"{path}: a workload file must end in .toml, .yaml or .yml")
    if not isinstance(data, Mapping):
        raise PresetError(f"{path}: the top level must be a table")
    unknown = set(data) - _SWEEP_KEYS
    if unknown:
        raise PresetError(
            f"{path}: unknown keys {sorted(unknown)}; accepted: {sorted(_SWEEP_KEYS)}"
        )
    workloads = data.get("workloads")
    if not isinstance(workloads, list) or not workloads:
        raise PresetError(f"{path}: 'workloads' must be a non-empty list of tables")
    model = _model(data.get("model", {}), "model", QWEN25_32B_TP4_H200)
    names = data.get("policies", DEFAULT_POLICIES)
    if not isinstance(names, (list, tuple)):
        raise PresetError(f"{path}: 'policies' must be a list of policy names, got {names!r}")
    try:
        policies = parse_policies(names)
        return Sweep(
            name=str(data.get("name", path.stem)),
            description=str(data.get("description", "")),
            workloads=tuple(_workload(t, i, model) for i, t in enumerate(workloads)),
            policies=tuple(policies),
            seeds=data.get("seeds", 30),
            first_seed=data.get("first_seed", 0),
        )
    except ValueError as exc:  # PolicyError, DistributionError, PresetError, field checks
        raise PresetError(f"{path}: {exc}") from None
