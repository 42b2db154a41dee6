"""Shared fixtures for the verl adapter tier: one local Ray cluster for the session.

The cluster is small on purpose (the CI box has 2 cores): ``num_cpus=2``, no dashboard,
a 100 MB object store. Helper actors ask for ``num_cpus=0``. Every balancer actor a test
creates through :func:`make_balancer` is killed at the end of that test, so the tier does
not accumulate worker processes.

This directory has no ``__init__.py`` on purpose: as a package it would be named
``verl`` and shadow the real verl package.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.60 would write ~/.ray/auth_token

import ray
from affinity_verl import AffinityLoadBalancer

MakeBalancer = Callable[..., Any]

DOCS = Path(__file__).resolve().parents[2] / "docs" / "verl.md"
_FENCE = re.compile(r"```(\w+)\n# (example|example-file): (\S+)\n(.*?)```", re.DOTALL)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=100 * 1024 * 1024,
            log_to_driver=False,
        )
    yield
    if started_here:
        ray.shutdown()


@pytest.fixture
def make_balancer(ray_cluster: None) -> Iterator[MakeBalancer]:
    """``make_balancer(servers=..., **options)`` -> an AffinityLoadBalancer actor handle."""
    created: list[Any] = []

    def make(*args: Any, **kwargs: Any) -> Any:
        handle = ray.remote(AffinityLoadBalancer).options(num_cpus=0).remote(*args, **kwargs)
        created.append(handle)
        return handle

    yield make
    for handle in created:
        ray.kill(handle)


@pytest.fixture(scope="session")
def doc_examples() -> dict[str, str]:
    """The copy-paste examples of docs/verl.md, by name (``# example: NAME`` first line).

    ``# example-file: NAME`` blocks are files the examples use (e.g. ``router.yaml``).
    """
    found: dict[str, str] = {}
    for _lang, _kind, name, body in _FENCE.findall(DOCS.read_text(encoding="utf-8")):
        assert name not in found, f"duplicate example {name!r} in {DOCS}"
        found[name] = body
    return found
