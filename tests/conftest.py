"""Shared pytest configuration: Hypothesis profiles and the one skip policy for the tiers.

Hypothesis profiles
-------------------
* ``dev`` (default outside CI): no deadline -- several Ray and vLLM processes share this
  machine's two cores, so wall-clock deadlines only produce flaky failures.
* ``ci``: Hypothesis's built-in profile (derandomized, no database, no deadline), loaded
  automatically when ``CI`` is set (``.ci/run`` exports ``CI=true``).
* ``thorough``: the long run (nightly or by hand); the stateful machines scale their
  example counts per profile in ``tests/conformance/stateful_profiles.py``.

Select another with ``pytest --hypothesis-profile=NAME``.

Tiers and the skip policy
-------------------------
A *tier* is a group of tests that needs something beyond the ``tests`` extra; its marker
says which (registered in pyproject.toml): ``ray`` (the ray package; applied here to every
test that uses the ``ray_cluster`` fixture), ``vllm`` (the real vLLM venv named by
``AFFINITY_VLLM_PYTHON``), ``peers`` (vllm-router and sglang-router in the routers venv),
``node`` (the ``node`` executable), ``compiled`` (a C compiler for the mypyc build),
``verl`` (verl 0.9.1's router module from the verl wheel) and ``verl_prs`` (verl's routing
PR files extracted by ``scripts/extract_verl_prs.sh``, named by ``AFFINITY_VERL_PRS``).
``slow`` marks size, not an environment, and is never skipped by this policy (deselect
it: ``-m "not slow"``).

Before such a test runs, its tier's probe says whether the environment is there. If not:

* outside CI the test is **skipped**, with the tier and what is missing as the reason;
* under ``CI=true`` it **fails** -- a CI run that silently skipped the real-vLLM or the
  peer-router tier would report green for checks it never made -- unless the tier is
  opted out by name: ``AFFINITY_OPT_OUT=peers,compiled``. An opted-out missing tier is
  skipped, and the terminal summary lists every tier that did not run and why, opted out
  or not. An unknown name in ``AFFINITY_OPT_OUT`` is a usage error.

``AFFINITY_ALLOW_NO_VLLM=1`` and ``AFFINITY_ALLOW_NO_VERL=1`` (the older per-tier switches
that scripts/test.sh and existing CI jobs set) count as opting out ``vllm`` and ``verl``.
A tier that is present always runs; to leave one out on purpose, deselect it with ``-m``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from functools import cache

import pytest
from hypothesis import settings

# pytester: tests/conformance/test_pytest_plugin.py runs pytest inside pytest.
pytest_plugins = ["pytester"]

settings.register_profile("dev", deadline=None)
settings.register_profile("thorough", deadline=None, max_examples=5000, stateful_step_count=100)
if not os.environ.get("CI"):
    settings.load_profile("dev")


# ------------------------------------------------------------------ the tiers' probes
def _ray() -> str | None:
    if importlib.util.find_spec("ray") is None:
        return "the ray package is not installed (pip install 'affinity-routing[verl]')"
    return None


def _vllm() -> str | None:
    python = os.environ.get("AFFINITY_VLLM_PYTHON", "").strip()
    if not python:
        return ("AFFINITY_VLLM_PYTHON is not set: run `bash scripts/setup-vllm.sh` and export "
                "AFFINITY_VLLM_PYTHON=$PWD/.venv-vllm/bin/python")
    if not os.access(python, os.X_OK):
        return f"AFFINITY_VLLM_PYTHON={python} is not an executable"
    return None


def _peers() -> str | None:
    from affinity_conformance.router_check.presets import (
        DEFAULT_ROUTERS_VENV,
        ROUTER_PACKAGES,
        routers_available,
    )

    if routers_available(DEFAULT_ROUTERS_VENV):
        return None
    return (f"{DEFAULT_ROUTERS_VENV} with {' and '.join(ROUTER_PACKAGES)} is missing "
            "(scripts/test.sh creates it; it needs PyPI)")


def _node() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed (scripts/test.sh installs nodejs; apt-get install nodejs)"
    return None


def _compiled() -> str | None:
    if (shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")) is None:
        return "no C compiler (cc/gcc): the compiled build cannot be built here"
    return None


def _verl() -> str | None:
    from affinity_conformance.upstream import UpstreamUnavailable, load_upstream_balancer

    try:
        load_upstream_balancer()
    except UpstreamUnavailable as exc:
        return f"verl's router module cannot be loaded: {exc}"
    return None


def _verl_prs() -> str | None:
    from affinity_conformance.pr_classes import PrClassesUnavailable, pr_root

    try:
        pr_root()
    except PrClassesUnavailable as exc:
        return str(exc)
    return None


TIERS: dict[str, Callable[[], str | None]] = {
    "ray": _ray, "vllm": _vllm, "peers": _peers, "node": _node, "compiled": _compiled,
    "verl": _verl, "verl_prs": _verl_prs,
}
LEGACY_OPT_OUTS = {"AFFINITY_ALLOW_NO_VLLM": "vllm", "AFFINITY_ALLOW_NO_VERL": "verl"}


@cache
def tier_missing(tier: str) -> str | None:
    """What tier ``tier`` lacks here (None: it can run). Probed once per session."""
    return TIERS[tier]()


def opted_out() -> frozenset[str]:
    """The tiers named in AFFINITY_OPT_OUT (and the older per-tier switches)."""
    names = {n.strip() for n in os.environ.get("AFFINITY_OPT_OUT", "").split(",") if n.strip()}
    unknown = sorted(names - set(TIERS))
    if unknown:
        raise pytest.UsageError(f"AFFINITY_OPT_OUT: {', '.join(map(repr, unknown))} is not a "
                                f"tier; the tiers are {', '.join(TIERS)}")
    names |= {tier for var, tier in LEGACY_OPT_OUTS.items() if os.environ.get(var) == "1"}
    return frozenset(names)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


_NOT_RUN = pytest.StashKey[dict[str, str]]()


def pytest_configure(config: pytest.Config) -> None:
    opted_out()  # a misspelt tier name stops the run before anything is collected
    config.stash[_NOT_RUN] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test on the session's Ray cluster is in the ray tier, wherever it lives.
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)


@pytest.hookimpl(tryfirst=True)  # before fixtures: a missing tier must not start them
def pytest_runtest_setup(item: pytest.Item) -> None:
    for tier in sorted({m.name for m in item.iter_markers()} & set(TIERS)):
        missing = tier_missing(tier)
        if missing is None:
            continue
        not_run = item.config.stash[_NOT_RUN]
        if in_ci() and tier not in opted_out():
            not_run.setdefault(tier, f"FAILED under CI: {missing}")
            pytest.fail(f"tier {tier!r} is missing under CI=true: {missing} (opt out on "
                        f"purpose with AFFINITY_OPT_OUT={tier})", pytrace=False)
        how = "opted out by AFFINITY_OPT_OUT" if in_ci() else "skipped outside CI"
        not_run.setdefault(tier, f"{how}: {missing}")
        pytest.skip(f"tier {tier!r} {how}: {missing}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    not_run = config.stash.get(_NOT_RUN, {})
    if not not_run:
        return
    terminalreporter.section("tiers not run")
    for tier, why in sorted(not_run.items()):
        terminalreporter.write_line(f"{tier}: {why}")
