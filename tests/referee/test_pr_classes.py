"""The loader of verl's routing PR classes (affinity_conformance.pr_classes).

The synthetic tests always run: a PR tree written here, whose file imports modules that
are not installed and decorates its balancer with ``@ray.remote``, as verl's files do.
The ``verl_prs`` tier checks the real PR classes extracted by
scripts/extract_verl_prs.sh; its verdicts are those recorded in docs/verl-routing.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from affinity_conformance import pr_classes
from affinity_conformance.check import run_check

PR_FILE = "verl/workers/rollout/llm_server.py"
GOOD = """
import ray
import torch_not_installed_here
from verl.utils.not_shipped import helper
from affinity_verl import AffinityLoadBalancer


@ray.remote
class GlobalRequestLoadBalancer(AffinityLoadBalancer):
    pass


@helper
def uses_a_placeholder():
    return torch_not_installed_here.zeros(1)
"""
# Never sticky: every acquire goes to a least-loaded server.
BROKEN = GOOD + """

class Forgetful(AffinityLoadBalancer):
    def acquire_server(self, request_id, **extra):
        self.clear_sticky_cache()
        return super().acquire_server(request_id=request_id, **extra)


GlobalRequestLoadBalancer = Forgetful
"""


def _tree(tmp_path: Path, source: str, key: str = "head") -> Path:
    target = tmp_path / key / PR_FILE
    target.parent.mkdir(parents=True)
    target.write_text(source, encoding="utf-8")
    return tmp_path


def test_a_pr_file_loads_with_placeholders_and_leaves_sys_modules_alone(tmp_path: Path) -> None:
    before = {n for n in sys.modules if n == "verl" or n.startswith("verl.")}
    loaded = pr_classes.load_pr("head", _tree(tmp_path, GOOD))
    assert isinstance(loaded.cls, type)  # @ray.remote left the class plain
    assert loaded.cls.__name__ == "GlobalRequestLoadBalancer"
    assert "torch_not_installed_here" in loaded.absent
    assert "verl.utils.not_shipped" in loaded.absent
    assert "torch_not_installed_here" not in sys.modules
    assert {n for n in sys.modules if n == "verl" or n.startswith("verl.")} == before
    assert not isinstance(sys.modules.get("ray"), pr_classes._RayView)


def test_a_missing_tree_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pr_classes.ENV_VAR, raising=False)
    with pytest.raises(pr_classes.PrClassesUnavailable, match="AFFINITY_VERL_PRS is not set"):
        pr_classes.load_pr("head")
    with pytest.raises(pr_classes.PrClassesUnavailable, match="is missing"):
        pr_classes.load_pr("pr7435", tmp_path)
    with pytest.raises(pr_classes.PrClassesUnavailable, match="unknown PR key 'pr1'"):
        pr_classes.load_pr("pr1", tmp_path)


@pytest.mark.parametrize(("source", "verdict"), [(GOOD, "pass"), (BROKEN, "fail")])
def test_check_judges_the_loaded_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      source: str, verdict: str) -> None:
    monkeypatch.setenv(pr_classes.ENV_VAR, str(_tree(tmp_path, source)))
    report = run_check("affinity_conformance.pr_classes:head", ctor="verl", budget=10,
                       suites=["legacy"], out_dir=tmp_path / "out")
    assert report.verdict == verdict  # the broken class is the negative control


# ------------------------------------------------------------------- the real PRs
REAL = [  # factory, ctor, verdict recorded in docs/verl-routing.md
    ("head", "verl", "pass"),
    ("pr7435", "pr7435", "pass"),
    ("pr5399", "verl", "fail"),
    ("pr6533", "kwargs", "fail"),
    ("pr6712", "verl", "fail"),
    ("pr6122_group_no_group", "verl", "fail"),
    ("pr6122_group_per_request", "verl", "fail"),
]


@pytest.mark.verl_prs
@pytest.mark.parametrize(("factory", "ctor", "verdict"), REAL)
def test_real_pr_class_verdict(tmp_path: Path, factory: str, ctor: str, verdict: str) -> None:
    report = run_check(f"affinity_conformance.pr_classes:{factory}", ctor=ctor,
                       tie_mode="first", budget=20, out_dir=tmp_path)
    assert report.verdict == verdict
