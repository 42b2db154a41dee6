"""The CLI end to end: the CI smoke preset, workload files, bad input, and the timing bar."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from affinity_sim.distributions import DistributionError, parse
from affinity_sim.presets import CAVEATS, PresetError, load_sweep, preset
from affinity_sim.routing import parse_policy
from affinity_sim.simulate import simulate_step

from affinity_cli.main import main


def test_smoke_preset_runs_in_ci_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    json_path, png_path = tmp_path / "smoke.json", tmp_path / "smoke.png"
    start = time.perf_counter()
    code = main(["simulate", "--preset", "smoke", "--no-ray", "--workers", "2",
                 "--no-progress", "--json", str(json_path), "--png", str(png_path)])
    elapsed = time.perf_counter() - start
    assert code == 0
    assert elapsed < 60
    out = capsys.readouterr().out
    assert "margin-2" in out and "Wilcoxon p" in out
    record = json.loads(json_path.read_text())
    assert len(record["results"]) == 10 * 30
    assert {s["policy"] for s in record["summary"]} >= {"legacy", "margin-2", "dual-4",
                                                        "least-loaded"}
    legacy = next(s for s in record["summary"] if s["policy"] == "legacy")
    assert legacy["median_change"] == 0.0 and legacy["p_value"] is None
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_workload_file_toml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        'name = "mine"\nseeds = 3\n'
        'policies = ["margin-1", {name = "m3", affinity_break_margin = 3}]\n'
        "[[workloads]]\n"
        'name = "small"\nbase = "smoke/smoke"\nprompts = 4\n'
        'output_tokens = {dist = "lognormal", median = 200, sigma = 0.5}\n'
        "model = {kv_capacity_tokens = 6000}\n"
    )
    sweep = load_sweep(path)
    assert [p.name for p in sweep.policies] == ["legacy", "margin-1", "m3"]
    (workload,) = sweep.workloads
    assert workload.prompts == 4 and workload.model.kv_capacity_tokens == 6000
    assert workload.samples == preset("smoke").workloads[0].samples  # from the base
    code = main(["simulate", "--preset", str(path), "--workers", "1", "--no-save",
                 "--no-progress"])
    assert code == 0
    assert "m3" in capsys.readouterr().out


def test_workload_file_yaml(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(
        "seeds: 2\n"
        "workloads:\n"
        "  - name: full\n"
        "    replicas: 2\n    prompts: 2\n    samples: 2\n    max_context: 1000\n"
        "    turns: {dist: uniform_int, low: 1, high: 3}\n"
        "    prompt_tokens: 100\n    output_tokens: {dist: exponential, mean: 80}\n"
        "    tool_tokens: 10\n    tool_latency_s: {dist: uniform, low: 0, high: 0.01}\n"
        "    model: {kv_capacity_tokens: 4000, max_num_seqs: 8}\n"
    )
    sweep = load_sweep(path)
    assert sweep.name == "mine" and sweep.seeds == 2
    assert sweep.workloads[0].model.max_num_seqs == 8


@pytest.mark.parametrize(("text", "fragment"), [
    ("seeds = 3\n", "'workloads' must be a non-empty list"),
    ('colour = 1\n[[workloads]]\nbase = "smoke/smoke"\nname = "x"\n', "unknown keys ['colour']"),
    ('[[workloads]]\nname = "x"\nbase = "nope/x"\n', "unknown base workload 'nope/x'"),
    ('[[workloads]]\nname = "x"\nreplicas = 2\n', "missing keys"),
    ('[[workloads]]\nname = "x"\nbase = "smoke/smoke"\nmodel = {kv_capacity_tokens = 100}\n',
     "kv_capacity_tokens (100) must be >= max_context"),
    ('[[workloads]]\nname = "x"\nbase = "smoke/smoke"\nturns = {dist = "zipf"}\n',
     "turns.dist must be one of"),
    ('policies = ["margin-x"]\n[[workloads]]\nname = "x"\nbase = "smoke/smoke"\n',
     "unknown policy 'margin-x'"),
])
def test_bad_workload_files_name_the_problem(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(PresetError) as info:
        load_sweep(path)
    assert fragment in str(info.value)


def test_bad_command_line_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--preset", "nope", "--no-save"]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err
    assert main(["simulate", "--preset", "smoke", "--policies", "margin-x", "--no-save"]) == 2
    assert "unknown policy 'margin-x'" in capsys.readouterr().err
    assert main(["simulate", "--preset", "smoke", "--workloads", "zzz", "--no-save"]) == 2
    assert "unknown workloads ['zzz']" in capsys.readouterr().err
    assert main(["simulate", "--preset", "smoke", "--workers", "0", "--no-save"]) == 2
    assert main(["simulate", "--preset", "smoke", "--seeds", "0", "--no-save"]) == 2
    assert "seeds must be an integer >= 1, got 0" in capsys.readouterr().err
    assert main(["simulate", "--preset", "smoke", "--no-ray", "--address", "x:1",
                 "--no-save", "--no-progress"]) == 2
    assert "cannot go with --no-ray" in capsys.readouterr().err


def test_distribution_errors() -> None:
    with pytest.raises(DistributionError, match=r"x.sigma must be >= 0"):
        parse("x", {"dist": "lognormal", "median": 1, "sigma": -1})
    with pytest.raises(DistributionError, match=r"min 5\.0 is above max 1\.0"):
        parse("x", {"dist": "constant", "value": 1, "min": 5, "max": 1})
    assert parse("x", 7).describe() == {"dist": "constant", "value": 7.0}


def test_512_trajectories_x_8_turns_on_16_replicas_within_10_s() -> None:
    (workload,) = preset("perf").workloads
    assert (workload.replicas, workload.trajectories) == (16, 512)
    start = time.perf_counter()
    result = simulate_step(workload, parse_policy("margin-2"), seed=0)
    elapsed = time.perf_counter() - start
    assert result.turns == 512 * 8
    assert elapsed <= 10.0, f"{elapsed:.1f} s"


def test_smoke_preset_does_not_start_ray(capsys: pytest.CaptureFixture[str]) -> None:
    """Documented at about 2 s; a local Ray cluster alone takes about 30 s to start, so the
    smoke preset runs in local processes even where Ray is installed (no --no-ray here)."""
    def ray_running() -> bool:  # another test of the session may have started one
        ray = sys.modules.get("ray")
        return ray is not None and bool(ray.is_initialized())

    running_before = ray_running()
    code = main(["simulate", "--preset", "smoke", "--seeds", "2", "--workers", "2",
                 "--no-save", "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert " steps in " in out
    backend = out.split(" steps in ", 1)[1].splitlines()[0]
    assert "ray" not in backend and "processes (2)" in backend, backend
    assert ray_running() == running_before


def test_calibrated_default_preset_prints_its_caveat_beside_the_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pr7435 (the default) fits its pools to the PR's hit rates and overstates the gain
    2-5x; its comparison with the PR is printed with that caveat right under it, and the
    record keeps it. A preset without one prints none."""
    json_path = tmp_path / "pr.json"
    code = main(["simulate", "--seeds", "1", "--workloads", "ctx2k", "--policies", "margin-2",
                 "--workers", "1", "--no-progress", "--json", str(json_path),
                 "--png", str(tmp_path / "pr.png")])
    assert code == 0
    captured = capsys.readouterr()
    out = " ".join(captured.out.split())  # rich wraps long lines
    table = out.index("PR #7435's table next to the simulation")
    caveat = out.index("caveat: pr7435's KV pools are calibrated", table)
    assert "overstates the margin's gain 2-5x" in out[caveat:]
    assert "--preset pr7435-scale" in out[caveat:]
    assert "caveat:" in captured.err  # also before the run starts
    assert json.loads(json_path.read_text())["caveat"] == CAVEATS["pr7435"]

    main(["simulate", "--preset", "smoke", "--seeds", "1", "--workers", "1", "--no-save",
          "--no-progress"])
    assert "caveat" not in capsys.readouterr().out
